"""Log lines carry the work they are about: JSON for collectors, text for a terminal."""

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from service.platform import logs


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore_root() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for handler in [h for h in root.handlers if h not in handlers]:
        handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)


class _Stalled(io.StringIO):
    """A stream whose writes wait until it is let go: a full pipe, a stalled log collector."""

    def __init__(self) -> None:
        super().__init__()
        self.let_go = threading.Event()
        self.writing = threading.Event()
        self._written = threading.Condition()

    def write(self, text: str) -> int:
        self.writing.set()
        self.let_go.wait(10)
        with self._written:
            count = super().write(text)
            self._written.notify_all()
        return count

    def lines_when_written(self, count: int) -> list[str]:
        with self._written:
            assert self._written.wait_for(lambda: self.getvalue().count("\n") >= count, 10)
        return self.getvalue().splitlines()


def _flushed() -> None:
    """Closing the handler of an earlier ``configure`` writes what it still holds."""
    logs.configure("json", "INFO", io.StringIO())


@pytest.mark.parametrize(
    ("log_format", "stream", "json_wanted"),
    [
        ("json", _Terminal(), True),
        ("text", io.StringIO(), False),
        ("auto", io.StringIO(), True),
        ("auto", _Terminal(), False),
    ],
)
def test_the_format_follows_the_setting_and_auto_follows_the_terminal(
    log_format: str, stream: io.StringIO, json_wanted: bool
) -> None:
    assert logs.wants_json(log_format, stream) is json_wanted


def test_a_json_line_inside_an_attempt_names_its_job_step_and_attempt(
    restore_root: logging.Logger,
) -> None:
    out = io.StringIO()
    logs.configure("json", "INFO", out)
    with logs.bound(job_id="job-1", step_id="fetch", attempt=2):
        logging.getLogger("actions").info("fetched %d rows", 3)
    logging.getLogger("actions").warning("between attempts")

    inside, outside = (json.loads(line) for line in out.getvalue().splitlines())
    assert inside["message"] == "fetched 3 rows"
    assert (inside["job_id"], inside["step_id"], inside["attempt"]) == ("job-1", "fetch", 2)
    assert inside["level"] == "info" and inside["logger"] == "actions"
    assert "job_id" not in outside


def test_text_lines_end_with_the_ids_and_configuring_twice_keeps_one_handler(
    restore_root: logging.Logger,
) -> None:
    out = io.StringIO()
    logs.configure("text", "INFO", out)
    logs.configure("text", "INFO", out)
    with logs.bound(job_id="job-1", step_id="fetch", attempt=1):
        logging.getLogger("actions").info("hello")

    [line] = out.getvalue().splitlines()
    assert line.endswith("actions: hello [job_id=job-1 step_id=fetch attempt=1]")


def test_in_the_background_a_stalled_stream_holds_up_no_caller_and_loses_no_id(
    restore_root: logging.Logger,
) -> None:
    """The API writes its lines from a thread of its own: its event loop must not wait on a
    full pipe or a stalled collector, and each line still names the work it was logged in."""
    out = _Stalled()
    logs.configure("json", "INFO", out, background=True)
    with logs.bound(job_id="job-1"):
        for number in range(3):
            logging.getLogger("api").info("request %d", number)
    logging.getLogger("api").info("after")

    assert out.getvalue() == ""
    out.let_go.set()
    _flushed()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(line["message"], line.get("job_id")) for line in lines] == [
        ("request 0", "job-1"),
        ("request 1", "job-1"),
        ("request 2", "job-1"),
        ("after", None),
    ]


def test_lines_dropped_while_too_many_waited_are_counted_where_they_were(
    restore_root: logging.Logger,
) -> None:
    out = _Stalled()
    logs.configure("text", "INFO", out, background=True, capacity=2)
    log = logging.getLogger("api")
    log.info("taken by the writer")
    assert out.writing.wait(10)
    for number in range(5):
        log.info("line %d", number)
    out.let_go.set()
    out.lines_when_written(3)
    log.info("after the stall")
    _flushed()

    lines = out.getvalue().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [
        "taken by the writer",
        "line 0",
        "line 1",
        "3 log lines dropped: the log stream did not take them in time",
        "after the stall",
    ]


def test_an_exception_logged_in_the_background_keeps_its_traceback(
    restore_root: logging.Logger,
) -> None:
    out = io.StringIO()
    logs.configure("json", "INFO", out, background=True)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("api").exception("failed")
    _flushed()

    [line] = [json.loads(text) for text in out.getvalue().splitlines()]
    assert line["message"] == "failed"
    assert "ValueError: boom" in line["exception"]
