"""The API's own documentation pages work offline: ``/docs`` and ``/redoc`` name no host but
the API, and every script, style and icon they load is served by the API, open as the pages are."""

import re
from urllib.parse import urljoin

import pytest
from fastapi.testclient import TestClient

PAGES = ["/docs", "/redoc", "/docs/oauth2-redirect"]
CONTENT_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png"}
ANY_HOST = re.compile(r"(?:https?:)?//[A-Za-z0-9][\w.-]*\.[A-Za-z]{2,}")
ASSET = re.compile(r"""<(?:script|link)\b[^>]*?\b(?:src|href)\s*=\s*["']([^"']+)["']""", re.I)


@pytest.mark.parametrize("page", PAGES)
def test_a_docs_page_names_no_other_host(client: TestClient, page: str) -> None:
    answer = client.get(page)

    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/html")
    assert ANY_HOST.findall(answer.text) == []


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_each_asset_a_docs_page_loads_is_served_with_its_content_type(
    client: TestClient, page: str
) -> None:
    html = client.get(page).text
    assets = ASSET.findall(html)

    assert any(asset.endswith(".js") for asset in assets), html
    if page == "/docs":
        assert any(asset.endswith(".css") for asset in assets), html
    for asset in assets:
        url = urljoin(page, asset)
        served = client.get(url)
        assert served.status_code == 200, url
        suffix = url[url.rindex(".") :]
        assert CONTENT_TYPES[suffix] in served.headers["content-type"], (url, served.headers)
        assert len(served.content) > 1000, url


def test_the_openapi_document_the_docs_read_is_still_open(client: TestClient) -> None:
    assert client.get("/openapi.json").status_code == 200
