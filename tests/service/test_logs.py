"""Log lines carry the work they are about: JSON for collectors, text for a terminal."""

import io
import json
import logging
from collections.abc import Iterator

import pytest

from service import logs


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore_root() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


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
