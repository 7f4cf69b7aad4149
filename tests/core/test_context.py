"""The run context's cancellation signal, whose waitable parts are made on demand."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from anarchon_core.context import RunContext
from anarchon_core.errors import RunCancelled
from anarchon_core.records import Origin


def context(loop: asyncio.AbstractEventLoop) -> RunContext:
    return RunContext(
        job="j",
        slot=1_000,
        attempt=1,
        instance_id="me",
        origin=Origin.SCHEDULE,
        loop=loop,
        logger=logging.getLogger("test"),
    )


def test_a_signal_set_before_anyone_waits_is_seen_by_every_waiter() -> None:
    async def main() -> None:
        ctx = context(asyncio.get_running_loop())
        ctx._cancel("timeout")
        ctx._cancel("stopping")  # the first reason stays
        assert ctx.cancelled and ctx.cancel_reason == "timeout"
        await asyncio.wait_for(ctx.wait_cancelled(), 1)
        began = time.monotonic()
        assert await asyncio.to_thread(ctx.wait, 5.0) is True
        assert time.monotonic() - began < 1
        with pytest.raises(RunCancelled, match="timeout"):
            ctx.raise_if_cancelled()

    asyncio.run(main())


def test_waiters_already_waiting_wake_when_the_signal_is_set() -> None:
    async def main() -> None:
        ctx = context(asyncio.get_running_loop())
        assert not ctx.cancelled
        assert ctx.wait(0.01) is False
        waiting = threading.Event()

        def sync_handler() -> bool:
            waiting.set()
            return ctx.wait(5.0)

        in_thread = asyncio.ensure_future(asyncio.to_thread(sync_handler))
        in_loop = asyncio.ensure_future(ctx.wait_cancelled())
        await asyncio.to_thread(waiting.wait, 5)
        await asyncio.sleep(0.05)
        began = time.monotonic()
        ctx._cancel("lease lost")
        assert await asyncio.wait_for(in_thread, 2) is True
        await asyncio.wait_for(in_loop, 2)
        assert time.monotonic() - began < 1

    asyncio.run(main())


def test_scheduled_at_is_the_slot_in_utc() -> None:
    loop = asyncio.new_event_loop()
    try:
        ctx = context(loop)
    finally:
        loop.close()
    assert ctx.scheduled_at.timestamp() == 1.0 and ctx.scheduled_at.utcoffset() is not None
