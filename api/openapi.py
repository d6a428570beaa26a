"""The OpenAPI document as the API answers: the bearer scheme on every operation but
``/health``, and the error envelope under each status an operation can answer.

A route declares the statuses its own work can end in (``errors``), naming their codes; this
module adds the ones that come from around the route: a key (401, 403, 429 with
``Retry-After``, 503 when the database that holds keys is away), a body (413, 422, and 400
when FastAPI reads it), and a parameter that can fail validation (400). Nothing is added to an
operation that cannot answer it, so a client can trust the list.
"""

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.schemas import ErrorEnvelope

BEARER = "bearer"
OPEN_PATHS = frozenset({"/health"})
ENVELOPE_REF = "#/components/schemas/ErrorEnvelope"
FASTAPI_VALIDATION_REF = "#/components/schemas/HTTPValidationError"
RATE_LIMITED = "rate_limited: more requests from this key than FLOWBEAT_RATE_LIMIT_* allow"
_KEYED = {
    "401": "unauthorized: missing, invalid or revoked API key",
    "403": "forbidden: the key lacks the scope",
    "503": "database_unavailable: the database that holds the keys is unreachable",
}
_WITH_BODY = {
    "413": "payload_too_large: the body exceeds FLOWBEAT_MAX_BODY_BYTES",
    "422": "validation_error: the body does not fit the schema",
}
_WITH_PARSED_BODY = {"400": "bad_request: the body could not be read (not UTF-8 JSON)"}
_WITH_PARAMETERS = {"400": "invalid_query: a query, path or header parameter is invalid"}
_UNCONSTRAINED = {"type": "string"}
_ANNOTATIONS = frozenset({"title", "description", "default"})
_READ_BY_ROUTE = "x-read-by-route"
RETRY_AFTER = {
    "description": "whole seconds to wait before trying again",
    "schema": {"type": "integer", "minimum": 1},
}


def errors(codes: Mapping[int, str]) -> dict[int | str, dict[str, Any]]:
    """The statuses a route's own work can end in, each described by the codes it carries."""
    return {
        status: {"model": ErrorEnvelope, "description": description}
        for status, description in codes.items()
    }


def _envelope(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": ENVELOPE_REF}}},
    }


def _too_many(description: str) -> dict[str, Any]:
    return {**_envelope(description), "headers": {"Retry-After": RETRY_AFTER}}


def _bare(schema: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in schema.items() if key not in _ANNOTATIONS}


def _can_fail(parameter: dict[str, Any]) -> bool:
    """A path or query parameter may hold a NUL (``api.deps.text_parameters``); any header
    fits an unconstrained string, optional or not; anything else can be refused."""
    if parameter.get("in") in ("path", "query") or parameter.get("required"):
        return True
    schema = _bare(parameter.get("schema", {}))
    options = [_bare(option) for option in schema.get("anyOf", [schema])]
    return any(option not in (_UNCONSTRAINED, {"type": "null"}) for option in options)


def read_by_route(request_body: dict[str, Any]) -> dict[str, Any]:
    """A body the route reads itself rather than FastAPI, as ``openapi_extra``: bytes that are
    not UTF-8 JSON are then the route's to answer for, not FastAPI's 400."""
    return {"requestBody": {**request_body, _READ_BY_ROUTE: True}}


def _document(operation: dict[str, Any]) -> None:
    """FastAPI's own 422 is replaced: ``api.errors`` answers parameter problems with a 400 and
    body problems with a 422, both in the envelope. An operation that declares no security
    (a webhook delivery, signed instead) gets no key statuses."""
    responses = operation.setdefault("responses", {})
    default = responses.get("422", {}).get("content", {}).get("application/json", {})
    if default.get("schema", {}).get("$ref") == FASTAPI_VALIDATION_REF:
        del responses["422"]
    statuses: dict[str, str] = {}
    if operation.get("security") != []:
        operation["security"] = [{BEARER: []}]
        statuses |= _KEYED
        described = responses.get("429", {}).get("description")
        responses["429"] = _too_many(f"{RATE_LIMITED}; {described}" if described else RATE_LIMITED)
    body = operation.get("requestBody")
    if body is not None:
        statuses |= _WITH_BODY
        if _READ_BY_ROUTE in body:
            operation["requestBody"] = {k: v for k, v in body.items() if k != _READ_BY_ROUTE}
        else:
            statuses |= _WITH_PARSED_BODY
    if any(_can_fail(parameter) for parameter in operation.get("parameters", [])):
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
