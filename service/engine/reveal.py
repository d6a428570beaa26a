"""A step's secrets, put in place of their marks in the worker at the moment its action is
called, and nowhere else: the claim held marks (``inputs._resolved``), and what the action
gets lives only in the call.

Each value revealed joins the attempt's mask, so its log lines, the worker's own log, its
output and its error show ``***`` where the value was (``runner._attempt``). A step that names
no secret costs one test here.
"""

import uuid
from typing import Any

from service.engine.runtime import Runtime
from service.engine.steps import Claimed
from service.language.expressions import reveal
from service.platform import capture
from service.platform.errors import SecretNotFound
from service.platform.masking import Mask
from service.platform.secrets import secrets_of


def revealed_inputs(rt: Runtime, claim: Claimed, mask: Mask) -> dict[str, Any]:
    """The inputs to call the action with. A secret gone since the job was submitted fails
    the step for good (``secret_not_found``); a source that fails raises, to be retried."""
    nonce = claim.secret_nonce
    if nonce is None:
        return claim.inputs
    capture.mask_log_records()
    owner = _owner(rt, claim.key.job_id)
    source = secrets_of(rt.settings)

    def value_of(name: str) -> str:
        value = source.value(name, owner)
        if value is None:
            raise SecretNotFound(
                f"no secret {name} is configured for this deployment or owner",
                {"secrets": [name]},
            )
        mask.add(value)
        return value

    revealed: dict[str, Any] = reveal(claim.inputs, nonce, value_of)
    return revealed


def _owner(rt: Runtime, job_id: uuid.UUID) -> str | None:
    """Read for a step that names a secret only, so the claim of every other step stays as
    it was."""
    with rt.claims.connect() as conn:
        row = conn.execute("SELECT owner FROM jobs WHERE id = %s", (job_id,)).fetchone()
    return None if row is None else str(row[0])
