"""Repeated log records are folded into counts: bounded output whatever the flood."""

from __future__ import annotations

import io
import logging

import pytest

from synth_common.logfold import ErrorResponseFolder, RepeatFolder


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def logger_with(name: str, folder: logging.Filter) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.filters[:] = [folder]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, out


def boom(n: int) -> None:
    raise ValueError(f"bad input {n}")


def test_a_flood_of_one_traceback_is_logged_once_then_counted(clock: Clock) -> None:
    log, out = logger_with("t.flood", RepeatFolder(burst=3, window=60, clock=clock))
    for n in range(10_000):
        try:
            boom(n)
        except ValueError:
            log.exception("request %s failed", n)
    text = out.getvalue()
    assert len(text.encode()) < 2_000
    assert text.count("Traceback") == 1 and "ValueError: bad input 0" in text
    assert "request 1 failed (ValueError: bad input 1; traceback logged once)" in text
    assert "request 3 failed" not in text
    clock.now += 60
    try:
        boom(-1)
    except ValueError:
        log.exception("request %s failed", "late")
    last = out.getvalue().splitlines()
    assert any("request late failed [9997 more like this in 60 s were not logged]" in line for line in last)


def test_kinds_are_separate_and_bounded_in_number(clock: Clock) -> None:
    folder = RepeatFolder(burst=1, window=60, max_kinds=10, clock=clock)
    log, out = logger_with("t.kinds", folder)
    for n in range(1000):
        log.warning("cannot reach %s", n)
        log.error("other %s", n)
    lines = out.getvalue().splitlines()
    assert lines == ["WARNING cannot reach 0", "ERROR other 0"]
    for n in range(100):
        log.warning(f"distinct message {n}")  # templates differ: each its own kind
    assert len(out.getvalue().splitlines()) == 102
    assert len(folder._windows) == 10


def test_access_log_folds_error_responses_only(clock: Clock) -> None:
    log, out = logger_with("t.access", ErrorResponseFolder(burst=2, window=60, clock=clock))
    for n in range(500):
        log.info('%s - "%s %s HTTP/%s" %d', "", "GET", f"/admin/{n}", "1.1", 404)
        log.info('%s - "%s %s HTTP/%s" %d', "", "GET", "/v1/models", "1.1", 200)
    lines = out.getvalue().splitlines()
    assert sum("404" in line for line in lines) == 2
    assert sum('"GET /v1/models HTTP/1.1" 200' in line for line in lines) == 500
