"""Every error leaves the API as ``{"error": {"code", "message", "details"}}``.

Codes map to HTTP status in this one table, so a domain error gets the same status whichever
route raised it. Body validation problems are 422; problems with query parameters are 400.
"""

import logging
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import DataError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.platform.errors import FlowbeatError

log = logging.getLogger(__name__)

STATUS_BY_CODE: dict[str, int] = {
    "csrf_invalid": 403,
    "profile_invalid": 422,
    "params_invalid": 422,
    "unknown_action": 422,
    "bad_reference": 422,
    "condition_invalid": 422,
    "secret_not_found": 422,
    "notify_url_invalid": 422,
    "egress_refused": 422,
    "egress_scheme_refused": 422,
    "egress_host_not_allowed": 422,
    "egress_address_refused": 422,
    "egress_redirect_refused": 422,
    "validation_error": 422,
    "cron_invalid": 422,
    "interval_invalid": 422,
    "timezone_unknown": 422,
    "schedule_too_frequent": 422,
    "schedule_limit_reached": 409,
    "schedule_not_found": 404,
    "schedule_ambiguous": 409,
    "schedule_name_taken": 409,
    "schedule_name_mismatch": 422,
    "backfill_invalid": 422,
    "backfill_too_large": 422,
    "backfill_not_cron": 422,
    "backfill_not_found": 404,
    "backfill_conflict": 409,
    "invalid_cursor": 400,
    "invalid_query": 400,
    "bad_request": 400,
    "pipeline_not_found": 404,
    "job_not_found": 404,
    "job_expired": 410,
    "not_found": 404,
    "method_not_allowed": 405,
    "job_conflict": 409,
    "not_awaiting_approval": 409,
    "already_decided": 409,
    "signal_not_awaited": 404,
    "signal_already_received": 409,
    "unknown_step": 400,
    "step_not_found": 404,
    "rerun_invalid": 422,
    "labels_invalid": 422,
    "job_filter_invalid": 400,
    "bulk_action_not_found": 404,
    "bulk_action_conflict": 409,
    "pipeline_version_gone": 409,
    "idempotency_conflict": 409,
    "duplicate_job": 409,
    "no_result_items": 409,
    "unauthorized": 401,
    "forbidden": 403,
    "payload_too_large": 413,
    "database_unavailable": 503,
    "broker_unavailable": 503,
    "internal_error": 500,
    "rate_limited": 429,
    "hook_not_found": 404,
    "trigger_cycle": 422,
    "hook_invalid": 422,
    "alert_not_found": 404,
    "alert_rule_invalid": 422,
    "alert_rule_managed": 409,
    "hook_signature_invalid": 401,
    "hook_timestamp_stale": 401,
    "hook_payload_invalid": 422,
    "hook_delivery_seen": 409,
    "open_jobs_limit": 429,
    "fanout_too_large": 422,
    "wait_invalid": 422,
    "child_invalid": 422,
    "pipeline_depth_exceeded": 422,
    "pipeline_cycle": 422,
    "job_too_large": 422,
    "pipeline_read_only": 409,
    "pipeline_name_mismatch": 422,
    "unsupported_media_type": 415,
    "invalid_share": 422,
    "import_refused": 403,
    "imports_disabled": 403,
    "import_request_invalid": 422,
    "import_scheme_refused": 422,
    "import_host_not_allowed": 403,
    "import_address_refused": 403,
    "import_redirect_refused": 403,
    "import_content_type_refused": 415,
    "import_too_large": 413,
    "import_timeout": 504,
    "import_fetch_failed": 502,
    "import_path_refused": 403,
    "import_not_found": 404,
}

_CODE_BY_HTTP_STATUS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    422: "validation_error",
}


class ApiError(Exception):
    """An error the API itself detects (query parameters, body limits), outside the domain."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}


def status_for(code: str) -> int:
    return STATUS_BY_CODE.get(code, 500)


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": jsonable_encoder(details or {})}}


def error_response(
    code: str,
    message: str,
    details: dict[str, Any] | None = None,
    *,
    status: int | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    status = status if status is not None else status_for(code)
    headers = dict(headers or {})
    if status == 401:
        headers.setdefault("WWW-Authenticate", "Bearer")
    return JSONResponse(error_body(code, message, details), status_code=status, headers=headers)


async def _flowbeat_error(_: Request, exc: Exception) -> JSONResponse:
    """An error that says when to come back (``retry_after_s``) says it in ``Retry-After``."""
    assert isinstance(exc, FlowbeatError)
    retry = exc.details.get("retry_after_s")
    headers = {"Retry-After": str(retry)} if isinstance(retry, int) else None
    return error_response(exc.code, exc.message, exc.details, headers=headers)


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.code, exc.message, exc.details)


JSON_MEDIA_TYPES = ("application/json", "text/json")


def _not_json(request: Request, errors: list[dict[str, Any]]) -> str | None:
    """Why a body was not read: curl's ``-d`` alone sends form encoding, not JSON."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    in_body = any(e["loc"][:1] == ["body"] for e in errors)
    if not in_body or media in JSON_MEDIA_TYPES or media.endswith("+json"):
        return None
    sent = media or "no Content-Type"
    return f"the body must be JSON sent with Content-Type: application/json, not {sent}"


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": list(err.get("loc", ())), "type": err.get("type"), "message": err.get("msg")}
        for err in exc.errors()
    ]
    first = errors[0] if errors else {"loc": [], "message": "invalid request"}
    where = ".".join(str(part) for part in first["loc"])
    message = f"{where}: {first['message']}" if where else str(first["message"])
    message = _not_json(request, errors) or message
    in_query = bool(errors) and all(e["loc"][:1] in (["query"], ["path"]) for e in errors)
    code = "invalid_query" if in_query else "validation_error"
    return error_response(code, message, {"errors": errors})


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _CODE_BY_HTTP_STATUS.get(exc.status_code, "internal_error")
    if exc.status_code < 500 and code == "internal_error":
        code = "bad_request"
    message = exc.detail if isinstance(exc.detail, str) else "request failed"
    limit = getattr(exc, "limit", None)
    details = {"limit": limit} if limit is not None else {}
    return error_response(
        code, message, details, status=exc.status_code, headers=dict(exc.headers or {})
    )


async def _database_error(_: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", exc)
    return error_response("database_unavailable", "the database is unreachable")


async def _data_error(_: Request, exc: Exception) -> JSONResponse:
    """A value PostgreSQL refuses to store or compare, such as text with a NUL character: the
    statement failed, so nothing was stored, and the value came from the request."""
    cause = exc.orig if isinstance(exc, DataError) else exc
    return error_response(
        "validation_error",
        f"a value the database cannot take: {str(cause).splitlines()[0]}",
        status=422,
    )


async def _broker_error(_: Request, exc: Exception) -> JSONResponse:
    log.warning("broker unavailable: %s", exc)
    return error_response("broker_unavailable", "the broker is unreachable")


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return error_response("internal_error", "internal server error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(FlowbeatError, _flowbeat_error)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(OperationalError, _database_error)
    app.add_exception_handler(InterfaceError, _database_error)
    app.add_exception_handler(psycopg.OperationalError, _database_error)
    app.add_exception_handler(DataError, _data_error)
    app.add_exception_handler(psycopg.DataError, _data_error)
    app.add_exception_handler(KombuOperationalError, _broker_error)
    app.add_exception_handler(RedisConnectionError, _broker_error)
    app.add_exception_handler(RedisTimeoutError, _broker_error)
    app.add_exception_handler(Exception, _unexpected)
