"""What a step attempt said while it ran: its ``ctx.log`` lines, every ``logging`` call and every
``print`` made on the thread that runs it, kept in memory until the attempt is over.

Workers run attempts side by side in one process (threads in the embedded default, and a
prefork pool process runs one at a time but its stdout is still the process's), so nothing is
attached per attempt: one handler on the root logger and one proxy in front of ``sys.stdout``
and ``sys.stderr`` each look up the attempt of the calling context in a context variable and
hand the line to its ``Capture``, or do nothing. Lines also go where they went before (the
worker's own log), so an operator tailing a worker loses nothing. A thread the action starts
itself has a context of its own, so its lines are captured only if it runs in a copy of the
attempt's context (``contextvars.copy_context``, as ``asyncio.to_thread`` does). With the
handler on the root logger, a process that configured no logging of its own no longer gets
logging's last-resort lines on stderr; every flowbeat process configures its own
(``service.platform.logs``).

An attempt that revealed secrets masks them (``service.platform.masking``) in what it keeps and
in what goes on: a log record made on its context is masked as it is made, before any handler
of the worker formats it (``mask_log_records``, from a process's first secret on), and a print
is masked before it reaches the stream.
"""

import contextlib
import contextvars
import logging
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from service.platform.masking import Mask

STEP_LOGGER = "flowbeat.step"
"""The logger an action gets as ``ctx.log``; at INFO whatever the worker's own level."""
_HANDLER_NAME = "flowbeat-step-capture"
_PRINT_LEVELS = {"stdout": "INFO", "stderr": "WARNING"}

_CURRENT: contextvars.ContextVar["Capture | None"] = contextvars.ContextVar(
    "step_capture", default=None
)
_FORWARDING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "step_capture_forwarding", default=False
)
"""Set while a captured print goes on to the stream it was meant for: under Celery that
stream logs what it is given, and the handler must not capture the same line twice."""
_install_lock = threading.Lock()


@dataclass(frozen=True)
class Line:
    seq: int
    level: str
    logger: str
    ts: float
    message: str


class Capture:
    """One attempt's lines, at most ``max_bytes`` of message text (UTF-8); the line that
    crosses the cap is cut there, and a last line says so and how many lines were dropped.
    What UTF-8 cannot hold (a lone surrogate, as a file name decoded with ``surrogateescape``
    brings) is kept as ``?``, so printing it neither fails the action nor the write."""

    def __init__(self, max_bytes: int, mask: Mask | None = None) -> None:
        self.max_bytes = max_bytes
        self.mask = mask if mask is not None else Mask()
        self._lines: list[Line] = []
        self._used = 0
        self._dropped = 0
        self._cut = False
        self._partial: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(self, level: str, logger: str, message: str, ts: float) -> None:
        with self._lock:
            self._add(level, logger, message, ts)

    def _add(self, level: str, logger: str, message: str, ts: float) -> None:
        if self._cut:
            self._dropped += 1
            return
        if self.mask.forms:
            message = self.mask.text(message)
        encoded = message.encode(errors="replace")
        room = self.max_bytes - self._used
        if len(encoded) > room:
            self._cut = True
            encoded = encoded[:room].decode(errors="ignore").encode()
            if not encoded:
                self._dropped += 1
                return
        message = encoded.decode()
        self._used += len(encoded)
        self._lines.append(Line(len(self._lines) + 1, level, logger, ts, message))

    def write(self, stream: str, text: str) -> None:
        """Printed text, kept a line at a time; a line without its newline yet waits for it."""
        with self._lock:
            pending = self._partial.get(stream, "") + text
            *whole, rest = pending.split("\n")
            self._partial[stream] = rest
            now = time.time()
            for line in whole:
                self._add(_PRINT_LEVELS[stream], stream, line, now)

    def lines(self) -> list[Line]:
        """Every line kept, the unfinished printed ones and the cut notice included."""
        with self._lock:
            for stream, rest in sorted(self._partial.items()):
                if rest:
                    self._add(_PRINT_LEVELS[stream], stream, rest, time.time())
            self._partial.clear()
            kept = list(self._lines)
            if self._cut:
                notice = f"log cut at {self.max_bytes} bytes (FLOWBEAT_STEP_LOG_MAX_BYTES)"
                if self._dropped:
                    notice += f"; {self._dropped} more lines not kept"
                kept.append(Line(len(kept) + 1, "WARNING", "flowbeat", time.time(), notice))
            return kept


class _Handler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        capture = _CURRENT.get()
        if capture is None or _FORWARDING.get():
            return
        try:
            message = record.getMessage()
            if record.exc_info:
                message = f"{message}\n{logging.Formatter().formatException(record.exc_info)}"
        except Exception:
            self.handleError(record)
            return
        capture.add(record.levelname, record.name, message, record.created)


class _Routed:
    """Stands in for ``sys.stdout`` or ``sys.stderr``: a write from an attempt is kept for it,
    and every write goes on to the stream it was meant for."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream = stream
        self._name = name

    def write(self, text: str) -> int:
        capture = _CURRENT.get()
        if capture is None or _FORWARDING.get():
            return self._stream.write(text)
        capture.write(self._name, text)
        token = _FORWARDING.set(True)
        try:
            return self._stream.write(capture.mask.text(text) if capture.mask.forms else text)
        finally:
            _FORWARDING.reset(token)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


_HANDLER = _Handler()
_HANDLER.set_name(_HANDLER_NAME)
_made_record = logging.getLogRecordFactory()
_factory_installed = False


def mask_log_records() -> None:
    """Wrap logging's record factory, once per process and only in one that reveals secrets,
    so that the others make their records as before. Once: a factory set later calls the one
    it found, as logging asks of factories, and wrapping that again would call itself."""
    global _made_record, _factory_installed
    if _factory_installed:
        return
    with _install_lock:
        if not _factory_installed:
            _made_record = logging.getLogRecordFactory()
            logging.setLogRecordFactory(_masked_record)
            _factory_installed = True


def _masked_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
    """A record made on the context of an attempt that revealed secrets carries its message,
    traceback included, masked: every handler and formatter then sees only the masked text."""
    record = _made_record(*args, **kwargs)
    capture = _CURRENT.get()
    if capture is None or not capture.mask.forms:
        return record
    try:
        message = record.getMessage()
    except Exception:
        return record
    if record.exc_info:
        message = f"{message}\n{logging.Formatter().formatException(record.exc_info)}"
    if record.stack_info:
        message = f"{message}\n{record.stack_info}"
    record.msg, record.args = capture.mask.text(message), ()
    record.exc_info = record.exc_text = record.stack_info = None
    return record


def _install() -> None:
    """Put the handler and the proxies in place, again if someone (Celery's redirection of a
    pool process's output, a test runner, a logging setup) replaced them since. Every attempt
    checks, so the check that finds them in place takes no lock."""
    root = logging.getLogger()
    if (
        isinstance(sys.stdout, _Routed)
        and isinstance(sys.stderr, _Routed)
        and _HANDLER in root.handlers
    ):
        return
    with _install_lock:
        if _HANDLER not in root.handlers:
            root.addHandler(_HANDLER)
        step_logger = logging.getLogger(STEP_LOGGER)
        if step_logger.level == logging.NOTSET:
            step_logger.setLevel(logging.INFO)
        if not isinstance(sys.stdout, _Routed):
            sys.stdout = _Routed(sys.stdout, "stdout")
        if not isinstance(sys.stderr, _Routed):
            sys.stderr = _Routed(sys.stderr, "stderr")


@contextlib.contextmanager
def capturing(capture: Capture) -> Iterator[Capture]:
    """Lines logged or printed inside, on this context, go into ``capture``."""
    _install()
    token = _CURRENT.set(capture)
    try:
        yield capture
    finally:
        _CURRENT.reset(token)
