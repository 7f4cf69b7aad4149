"""LoopThread: the one event-loop-on-a-thread host of the sync adapters."""

from __future__ import annotations

import asyncio
import threading

import pytest

from anarchon_core.loop_thread import LoopThread


def test_a_coroutine_runs_on_the_thread_and_its_result_comes_back() -> None:
    host = LoopThread("anarchon-test")
    try:

        async def where() -> str:
            return threading.current_thread().name

        assert host.call(where(), 5) == "anarchon-test"
        assert host.usable
    finally:
        host.close()
    assert not host.usable
    host.close()  # idempotent


def test_a_call_past_its_bound_raises_and_is_cancelled_on_the_loop() -> None:
    host = LoopThread("anarchon-test")
    cancelled = threading.Event()

    async def hang() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        with pytest.raises(TimeoutError, match=r"no answer within 0\.05 s"):
            host.call(hang(), 0.05)
        assert cancelled.wait(10)
    finally:
        host.close()


def test_close_from_the_loops_own_thread_does_not_wait_for_itself() -> None:
    host = LoopThread("anarchon-test")

    async def close_here() -> None:
        host.close()

    host.submit(close_here()).result(10)
    host.close()
    assert not host.usable
