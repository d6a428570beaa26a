"""The OpenAPI document as the API answers: the bearer scheme on every operation but
``/health``, and the error envelope under every status that authentication, the body cap and
an unreachable database or broker add to what a route declares itself."""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

BEARER = "bearer"
OPEN_PATHS = frozenset({"/health"})
ENVELOPE_REF = "#/components/schemas/ErrorEnvelope"
_ALWAYS = {"401": "missing, invalid or revoked API key", "403": "the key lacks the scope"}
_WITH_BODY = {"413": "the body exceeds FLOWBEAT_MAX_BODY_BYTES", "422": "the body is invalid"}
_UNAVAILABLE = {"503": "the database or the broker is unreachable"}
_WITH_PARAMETERS = {"400": "a query or path parameter is invalid (invalid_query)"}
FASTAPI_VALIDATION_REF = "#/components/schemas/HTTPValidationError"


def _envelope(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": ENVELOPE_REF}}},
    }


def _document(operation: dict[str, Any]) -> None:
    """FastAPI's own 422 is replaced: ``api.errors`` answers parameter problems with a 400 and
    body problems with a 422, both in the envelope. An operation that declares no security
    (a webhook delivery, signed instead) is left as it declares itself."""
    if operation.get("security") == []:
        return
    operation["security"] = [{BEARER: []}]
    responses = operation.setdefault("responses", {})
    default = responses.get("422", {}).get("content", {}).get("application/json", {})
    if default.get("schema", {}).get("$ref") == FASTAPI_VALIDATION_REF:
        del responses["422"]
    statuses = {**_ALWAYS, **_UNAVAILABLE}
    if "requestBody" in operation:
        statuses |= _WITH_BODY
    if operation.get("parameters"):
        statuses |= _WITH_PARAMETERS
    for status, description in statuses.items():
        responses.setdefault(status, _envelope(description))


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {})
            components.setdefault("securitySchemes", {})[BEARER] = {
                "type": "http",
                "scheme": "bearer",
                "description": "an API key, fb_<prefix>_<secret> (flowbeat keys create)",
            }
            for path, operations in schema["paths"].items():
                if path not in OPEN_PATHS:
                    for operation in operations.values():
                        _document(operation)
            for unused in ("HTTPValidationError", "ValidationError"):
                components.get("schemas", {}).pop(unused, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
