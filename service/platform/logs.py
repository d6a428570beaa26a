"""Log lines an operator can search: one JSON object a line, with the job, step and attempt
of the work the line is about, or plain text on a terminal.

The ids live in context variables: a worker binds the job and step for the whole task (Celery's
own lines about it included), the step runner binds them too and the attempt from its claim to
its settlement, so every line logged meanwhile (the engine's, an action's, a library's)
carries them without being passed down.
"""

import collections
import contextlib
import contextvars
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

from service.platform import tracing
from service.platform.constants import LOG_FLUSH_S, LOG_QUEUE_RECORDS, LOG_WRITE_INTERVAL_S

JOB_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("job_id", default=None)
STEP_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("step_id", default=None)
ATTEMPT: contextvars.ContextVar[int | None] = contextvars.ContextVar("attempt", default=None)
TRACE_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("trace_id", default=None)
_CONTEXT: dict[str, contextvars.ContextVar[Any]] = {
    "job_id": JOB_ID,
    "step_id": STEP_ID,
    "attempt": ATTEMPT,
    "trace_id": TRACE_ID,
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
        if "trace_id" not in line:
            trace_id = tracing.trace_id()
            if trace_id is not None:
                line["trace_id"] = trace_id
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


class _Background(logging.Handler):
    """Formats each line where it is logged, and leaves the writing to a thread of its own:
    for a process whose event loop must never wait on its stderr, which a full pipe or a
    stalled log collector would otherwise stop, and every request with it.

    The thread wakes at most every ``LOG_WRITE_INTERVAL_S`` and writes what gathered in one
    call, so a busy loop pays no thread switch per line. Past ``capacity`` waiting lines new
    ones are dropped, and a line saying how many takes their place once there is room.
    ``emit`` runs under the handler's lock, so the count is safe.
    """

    def __init__(self, stream: TextIO, capacity: int) -> None:
        super().__init__()
        self._stream = stream
        self._capacity = capacity
        self._lines: collections.deque[str] = collections.deque()
        self._dropped = 0
        self._wake = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._write, name="log-writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        if len(self._lines) >= self._capacity:
            self._dropped += 1
            return
        if self._dropped:
            self._lines.append(self._dropped_line())
        self._lines.append(line)
        if not self._wake.is_set():
            self._wake.set()

    def _dropped_line(self) -> str:
        """Formatted outside the logging context, whose ids are not the dropped lines'."""
        notice = logging.LogRecord(
            __name__,
            logging.WARNING,
            __file__,
            0,
            "%d log lines dropped: the log stream did not take them in time",
            (self._dropped,),
            None,
        )
        self._dropped = 0
        return contextvars.Context().run(self.format, notice)

    def _write(self) -> None:
        while not self._closing:
            self._wake.wait()
            if not self._closing:
                time.sleep(LOG_WRITE_INTERVAL_S)
            self._wake.clear()
            lines = [self._lines.popleft() for _ in range(len(self._lines))]
            if lines:
                with contextlib.suppress(OSError, ValueError):
                    self._stream.write("".join(f"{line}\n" for line in lines))
                    self._stream.flush()

    def close(self) -> None:
        """Write what is waiting, giving a stalled stream ``LOG_FLUSH_S`` at most."""
        self._closing = True
        self._wake.set()
        self._thread.join(LOG_FLUSH_S)
        super().close()


def configure(
    log_format: str,
    level: str,
    stream: TextIO = sys.stderr,
    *,
    background: bool = False,
    capacity: int = LOG_QUEUE_RECORDS,
) -> None:
    """One handler on the root logger, replacing ours from an earlier call (never another's).

    ``background`` writes from a thread of its own (``_Background``), for an event loop."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    handler = _Background(stream, capacity) if background else logging.StreamHandler(stream)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if wants_json(log_format, stream) else TextFormatter())
    root.addHandler(handler)
    root.setLevel(level)
