"""What a step attempt says is kept for that attempt alone: its ``ctx.log`` lines, its other
``logging`` calls and its prints, capped in bytes with the cut said in the log."""

import contextvars
import logging
import sys
import threading

import pytest

from service.platform import capture
from service.platform.capture import Capture, capturing


def _messages(kept: Capture) -> list[str]:
    return [line.message for line in kept.lines()]


def test_prints_logging_calls_and_the_step_logger_are_kept_in_order() -> None:
    kept = Capture(10_000)
    with capturing(kept):
        logging.getLogger(capture.STEP_LOGGER).info("from %s", "ctx.log")
        logging.getLogger("some.library").warning("from a library")
        print("from print")

    lines = kept.lines()
    assert [(line.seq, line.level, line.logger, line.message) for line in lines] == [
        (1, "INFO", "flowbeat.step", "from ctx.log"),
        (2, "WARNING", "some.library", "from a library"),
        (3, "INFO", "stdout", "from print"),
    ]


def test_the_step_logger_keeps_info_lines_when_the_worker_logs_only_warnings() -> None:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)
    try:
        kept = Capture(10_000)
        with capturing(kept):
            logging.getLogger(capture.STEP_LOGGER).info("kept")
            logging.getLogger("quiet.library").info("below the worker's level")
    finally:
        root.setLevel(level)
    assert _messages(kept) == ["kept"]


def test_prints_are_kept_a_line_at_a_time_and_an_unfinished_line_at_the_end() -> None:
    kept = Capture(10_000)
    with capturing(kept):
        print("one", end="")
        print(" and the same line")
        print("two\nthree")
        print("no newline", end="")
    assert _messages(kept) == ["one and the same line", "two", "three", "no newline"]


def test_stderr_prints_are_warnings() -> None:
    kept = Capture(10_000)
    with capturing(kept):
        print("trouble", file=sys.stderr)
    assert [(line.level, line.logger) for line in kept.lines()] == [("WARNING", "stderr")]


def test_an_exception_logged_keeps_its_traceback() -> None:
    kept = Capture(10_000)
    with capturing(kept):
        try:
            raise ValueError("bad value")
        except ValueError:
            logging.getLogger(capture.STEP_LOGGER).exception("it broke")
    (line,) = kept.lines()
    assert line.level == "ERROR"
    assert line.message.startswith("it broke\nTraceback")
    assert "ValueError: bad value" in line.message


def test_prints_still_reach_the_stream_they_were_meant_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with capturing(Capture(10_000)):
        print("seen by the worker too")
    assert "seen by the worker too" in capsys.readouterr().out


def test_nothing_is_kept_outside_an_attempt() -> None:
    kept = Capture(10_000)
    with capturing(kept):
        pass
    print("after the attempt")
    logging.getLogger(capture.STEP_LOGGER).info("after the attempt")
    assert kept.lines() == []


def test_the_log_is_cut_at_the_cap_and_says_so() -> None:
    kept = Capture(25)
    with capturing(kept):
        for n in range(10):
            print(f"line number {n}")
    lines = kept.lines()
    assert [line.message for line in lines[:-1]] == ["line number 0", "line number "]
    assert sum(len(line.message.encode()) for line in lines[:-1]) == 25
    assert lines[-1].level == "WARNING"
    assert lines[-1].message == (
        "log cut at 25 bytes (FLOWBEAT_STEP_LOG_MAX_BYTES); 8 more lines not kept"
    )
    assert [line.seq for line in lines] == [1, 2, 3]


def test_a_cut_never_splits_a_character() -> None:
    kept = Capture(4)
    with capturing(kept):
        print("ééé")
    assert _messages(kept)[0] == "éé"


def test_two_attempts_running_at_once_each_keep_only_their_own_lines() -> None:
    """The embedded default runs steps in threads of one process, which share its stdout and
    its root logger."""
    both_inside = threading.Barrier(2)
    kept = {name: Capture(100_000) for name in ("a", "b")}

    def attempt(name: str) -> None:
        with capturing(kept[name]):
            both_inside.wait()
            for n in range(200):
                print(f"{name} {n}")
                logging.getLogger(capture.STEP_LOGGER).info("%s log %d", name, n)

    threads = [threading.Thread(target=attempt, args=(name,)) for name in kept]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    for name, lines in kept.items():
        messages = _messages(lines)
        assert len(messages) == 400
        assert all(message.startswith(name) for message in messages)


def test_a_thread_the_action_starts_is_captured_only_in_a_copy_of_its_context() -> None:
    kept = Capture(10_000)
    with capturing(kept):
        copied = contextvars.copy_context()
        threads = [
            threading.Thread(target=copied.run, args=(print, "in the attempt's context")),
            threading.Thread(target=print, args=("in a context of its own",)),
        ]
        for thread in threads:
            thread.start()
            thread.join()
    assert _messages(kept) == ["in the attempt's context"]


def test_text_utf_8_cannot_hold_is_kept_as_a_question_mark() -> None:
    kept = Capture(10_000)
    with capturing(kept):
        print("file \udcff.txt")
    assert _messages(kept) == ["file ?.txt"]
