"""Log lines an operator can search: one JSON object a line, with the job, step and attempt
of the work the line is about, or plain text on a terminal.

The ids live in context variables: a worker binds the job and step for the whole task (Celery's
own lines about it included), the step runner binds them too and the attempt from its claim to
its settlement, so every line logged meanwhile (the engine's, an action's, a library's)
carries them without being passed down.
"""

import contextlib
import contextvars
import copy
import json
import logging
import queue
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from logging.handlers import QueueHandler
from typing import Any, TextIO

from service.constants import LOG_FLUSH_S, LOG_QUEUE_RECORDS

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
        line.update(_ids(record))
        dropped = _dropped_before(record)
        if dropped:
            line["dropped_before"] = dropped
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ids = " ".join(f"{name}={value}" for name, value in _ids(record).items())
        dropped = _dropped_before(record)
        if dropped:
            text = f"{text} ({dropped} lines dropped before this one)"
        return f"{text} [{ids}]" if ids else text


def _current_ids() -> dict[str, Any]:
    return {name: value for name, var in _CONTEXT.items() if (value := var.get()) is not None}


def _ids(record: logging.LogRecord) -> dict[str, Any]:
    """The ids of the context that logged ``record``: read then, if it was handed over."""
    ids: dict[str, Any] | None = getattr(record, "ids", None)
    return _current_ids() if ids is None else ids


def _dropped_before(record: logging.LogRecord) -> int:
    return int(getattr(record, "dropped_before", 0))


class _Handoff(QueueHandler):
    """Hands each record to a writer thread, for a process whose event loop must never wait
    on its stderr: a full pipe or a stalled log collector would otherwise stop every request.

    The record is completed here, in the context that logged it (its message, its ids). When
    ``LOG_QUEUE_RECORDS`` are waiting, a new record is dropped, and the next one that gets
    through says how many were. ``emit`` runs under the handler's lock, so the count is safe.
    """

    def __init__(self, writer: logging.Handler, capacity: int) -> None:
        self._records: queue.Queue[logging.LogRecord | None] = queue.Queue(capacity)
        super().__init__(self._records)
        self._writer = writer
        self._dropped = 0
        self._thread = threading.Thread(target=self._write, name="log-writer", daemon=True)
        self._thread.start()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        prepared = copy.copy(record)
        prepared.message = record.getMessage()
        prepared.msg, prepared.args = prepared.message, None
        prepared.ids = _current_ids()
        prepared.dropped_before = self._dropped
        return prepared

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self._records.put_nowait(record)
        except queue.Full:
            self._dropped += 1
        else:
            self._dropped = 0

    def _write(self) -> None:
        while (record := self._records.get()) is not None:
            self._writer.handle(record)

    def close(self) -> None:
        """Write what is queued, waiting ``LOG_FLUSH_S`` at most for a stalled stream."""
        with contextlib.suppress(queue.Full):
            self._records.put(None, timeout=LOG_FLUSH_S)
        self._thread.join(LOG_FLUSH_S)
        super().close()


def wants_json(log_format: str, stream: TextIO) -> bool:
    return log_format == "json" or (log_format == "auto" and not stream.isatty())


def configure(
    log_format: str,
    level: str,
    stream: TextIO = sys.stderr,
    *,
    background: bool = False,
    capacity: int = LOG_QUEUE_RECORDS,
) -> None:
    """One handler on the root logger, replacing ours from an earlier call (never another's).

    ``background`` writes from a thread of its own (``_Handoff``), for an event loop."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    writer = logging.StreamHandler(stream)
    writer.setFormatter(JsonFormatter() if wants_json(log_format, stream) else TextFormatter())
    handler = _Handoff(writer, capacity) if background else writer
    handler.set_name(_HANDLER_NAME)
    root.addHandler(handler)
    root.setLevel(level)
