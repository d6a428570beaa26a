"""Log lines an operator can search: one JSON object a line, with the job, step and attempt
of the work the line is about, or plain text on a terminal.

The ids live in context variables: a worker binds the job and step for the whole task (Celery's
own lines about it included), the step runner binds them too and the attempt from its claim to
its settlement, so every line logged meanwhile (the engine's, an action's, a library's)
carries them without being passed down.
"""

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

JOB_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("job_id", default=None)
STEP_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("step_id", default=None)
ATTEMPT: contextvars.ContextVar[int | None] = contextvars.ContextVar("attempt", default=None)
_CONTEXT: dict[str, contextvars.ContextVar[Any]] = {
    "job_id": JOB_ID,
    "step_id": STEP_ID,
    "attempt": ATTEMPT,
}
_HANDLER_NAME = "flowbeat"


Bound = list[tuple[contextvars.ContextVar[Any], contextvars.Token[Any]]]


def bind(**ids: str | int | None) -> Bound:
    """Lines logged from here carry these ids until ``unbind``; a None leaves its id as it is.

    A pair of calls rather than a ``with`` block, for Celery's task_prerun and task_postrun
    signals, between which Celery logs its own lines about the task."""
    return [
        (_CONTEXT[name], _CONTEXT[name].set(value))
        for name, value in ids.items()
        if value is not None
    ]


def unbind(bound: Bound) -> None:
    for var, token in reversed(bound):
        var.reset(token)


@contextlib.contextmanager
def bound(**ids: str | int | None) -> Iterator[None]:
    """Lines logged inside carry these ids."""
    tokens = bind(**ids)
    try:
        yield
    finally:
        unbind(tokens)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        for name, var in _CONTEXT.items():
            value = var.get()
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ids = " ".join(f"{name}={var.get()}" for name, var in _CONTEXT.items() if var.get())
        return f"{text} [{ids}]" if ids else text


def wants_json(log_format: str, stream: TextIO) -> bool:
    return log_format == "json" or (log_format == "auto" and not stream.isatty())


def configure(log_format: str, level: str, stream: TextIO = sys.stderr) -> None:
    """One handler on the root logger, replacing ours from an earlier call (never another's)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(handler)
    handler = logging.StreamHandler(stream)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if wants_json(log_format, stream) else TextFormatter())
    root.addHandler(handler)
    root.setLevel(level)
