"""Webhook signatures: HMAC-SHA256 over ``<delivery id>.<timestamp>.<body>``, within five
minutes of now."""

from datetime import UTC, datetime

import pytest

from service.platform.errors import FlowbeatError
from service.triggers.hooks import verify_signature
from tests.support.webhook import signature

SECRET = "whsec_" + "s" * 30
BODY = b'{"repository": {"name": "flowbeat"}}'
NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
T = str(int(NOW.timestamp()))


def _headers(**given: str | None) -> dict[str, str | None]:
    good = {"timestamp": T, "signature": signature(SECRET, "d-1", T, BODY), "delivery": "d-1"}
    return {**good, **given}


@pytest.mark.parametrize(
    ("headers", "body", "code"),
    [
        pytest.param(_headers(), BODY, None, id="good"),
        pytest.param(_headers(signature="sha256=00"), BODY, "hook_signature_invalid", id="bad-hex"),
        pytest.param(
            _headers(signature=signature("another-secret-of-enough-length", "d-1", T, BODY)),
            BODY,
            "hook_signature_invalid",
            id="wrong-secret",
        ),
        pytest.param(_headers(), BODY + b" ", "hook_signature_invalid", id="body-changed"),
        pytest.param(
            _headers(delivery="d-2"), BODY, "hook_signature_invalid", id="delivery-id-changed"
        ),
        pytest.param(
            _headers(delivery="d.1", signature=signature(SECRET, "d.1", T, BODY)),
            BODY,
            "hook_signature_invalid",
            id="dot-in-delivery-id",
        ),
        pytest.param(_headers(signature=None), BODY, "hook_signature_invalid", id="no-signature"),
        pytest.param(_headers(timestamp=None), BODY, "hook_signature_invalid", id="no-timestamp"),
        pytest.param(_headers(delivery=None), BODY, "hook_signature_invalid", id="no-delivery"),
        pytest.param(
            _headers(delivery="d" * 129), BODY, "hook_signature_invalid", id="long-delivery"
        ),
        pytest.param(
            _headers(timestamp="soon", signature=signature(SECRET, "d-1", "soon", BODY)),
            BODY,
            "hook_signature_invalid",
            id="not-a-time",
        ),
        pytest.param(
            _headers(
                timestamp=str(int(NOW.timestamp()) - 301),
                signature=signature(SECRET, "d-1", str(int(NOW.timestamp()) - 301), BODY),
            ),
            BODY,
            "hook_timestamp_stale",
            id="too-old",
        ),
        pytest.param(
            _headers(
                timestamp=str(int(NOW.timestamp()) + 301),
                signature=signature(SECRET, "d-1", str(int(NOW.timestamp()) + 301), BODY),
            ),
            BODY,
            "hook_timestamp_stale",
            id="from-the-future",
        ),
    ],
)
def test_a_delivery_is_accepted_only_signed_with_the_secret_and_fresh(
    headers: dict[str, str | None], body: bytes, code: str | None
) -> None:
    if code is None:
        verified = verify_signature(SECRET, headers, body, NOW)
        assert verified.delivery_id == "d-1"
        assert verified.digest == signature(SECRET, "d-1", T, BODY).removeprefix("sha256=")
        return
    with pytest.raises(FlowbeatError) as info:
        verify_signature(SECRET, headers, body, NOW)
    assert info.value.code == code
