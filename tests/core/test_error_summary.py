"""A failed run's error: the whole traceback kept (bounded), its last line as the
summary that every surface shows."""

from __future__ import annotations

import asyncio
import logging

import pytest
from virtual import BASE_MS, run_virtual

from anarchon_core import MemoryBackend, RunContext, Scheduler
from anarchon_core.backend import MAX_ERROR_CHARS, bound_error
from anarchon_core.cli._format import excerpt
from anarchon_core.records import HistoryQuery, Status, error_summary
from anarchon_core.testing import LoopClock


def test_the_summary_is_the_last_line() -> None:
    assert error_summary(None) == "" and error_summary("") == ""
    assert error_summary("timed out after 500 ms") == "timed out after 500 ms"
    text = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom\n'
    assert error_summary(text) == "ValueError: boom"


def test_a_long_traceback_keeps_its_head_and_its_exception() -> None:
    frames = "".join(f'  File "m{i}.py", line {i}, in f\n    f()\n' for i in range(200))
    text = f"Traceback (most recent call last):\n{frames}KeyError: 'missing'"
    kept = bound_error(text)
    assert kept is not None and len(kept) <= MAX_ERROR_CHARS
    assert kept.startswith("Traceback (most recent call last):")
    assert error_summary(kept) == "KeyError: 'missing'"
    one_line = bound_error("x" * (3 * MAX_ERROR_CHARS))
    assert one_line is not None and len(one_line) == MAX_ERROR_CHARS and one_line.endswith("…")


def test_a_failed_runs_record_holds_the_traceback_and_shows_its_exception() -> None:
    store = MemoryBackend(clock=LoopClock(BASE_MS))
    scheduler = Scheduler(store, instance_id="solo", clock=LoopClock(BASE_MS), heartbeat_ms=100)

    @scheduler.every("fails", "1s")
    async def fails(ctx: RunContext) -> None:
        def inner() -> None:
            raise ValueError("the report is empty")

        inner()

    async def main() -> None:
        await scheduler.start()
        await asyncio.sleep(1.5)
        await scheduler.stop()

    run_virtual(main)
    (record,) = run_virtual(lambda: store.history(HistoryQuery(job="fails")))
    assert record.status == Status.FAILED and record.error is not None
    assert record.error.startswith("Traceback (most recent call last):")
    assert "in inner" in record.error
    row = record.to_json()
    assert row["error_summary"] == "ValueError: the report is empty"
    assert excerpt(record.error) == "ValueError: the report is empty"


def test_a_handler_that_raised_is_an_error_with_its_exception_a_timeout_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryBackend(clock=LoopClock(BASE_MS))
    scheduler = Scheduler(store, instance_id="solo", clock=LoopClock(BASE_MS), heartbeat_ms=100)

    @scheduler.every("raises", "1s")
    async def raises(ctx: RunContext) -> None:
        raise KeyError("customer")

    @scheduler.every("slow", "1s", timeout_ms=100)
    async def slow(ctx: RunContext) -> None:
        await asyncio.sleep(1)

    async def main() -> None:
        await scheduler.start()
        await asyncio.sleep(1.5)
        await scheduler.stop()

    with caplog.at_level(logging.INFO, logger="anarchon"):
        run_virtual(main)
    failed = [r for r in caplog.records if "run failed" in r.getMessage()]
    raised = [r for r in failed if "[raises@" in r.getMessage()]
    timed_out = [r for r in failed if "[slow@" in r.getMessage()]
    assert [r.levelno for r in raised] == [logging.ERROR]
    assert raised[0].exc_info is not None and raised[0].exc_info[0] is KeyError
    assert raised[0].getMessage().endswith("run failed: KeyError: 'customer'")
    assert [r.levelno for r in timed_out] == [logging.WARNING]
    assert timed_out[0].exc_info is None
