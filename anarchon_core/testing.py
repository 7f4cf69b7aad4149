"""Helpers for testing code that defines anarchon jobs.

Your handlers are plain functions of a :class:`~anarchon_core.RunContext`; these
helpers give them a real one without a store, a claim or a running scheduler:

- :func:`run_once` runs one job's handler now, synchronously, and returns its result;
- :class:`ManualClock` is a settable clock (epoch ms) for the in-memory store, so lease
  expiry and horizons can be stepped instead of slept;
- :class:`LoopClock` is a clock (epoch ms) that follows the running event loop's time:
  give one to the store and one (with an offset, a skewed host) to each ``Scheduler``,
  run the loop on virtual time (``looptime.new_event_loop()``), and seconds of the
  protocol run in milliseconds;
- :class:`FaultyBackend` wraps any store and delays, loses or fails its replies, or
  cuts its link (:mod:`anarchon_core.faults`);
- the pytest plugin (loaded automatically once anarchon is installed) provides a
  ``scheduler`` fixture: a :class:`~anarchon_core.Scheduler` on a fresh in-memory store,
  with no jitter, stopped after the test.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any

try:  # the plugin part needs pytest; run_once and ManualClock do not
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]

from .backends.memory import MemoryBackend
from .context import RunContext
from .durations import parse_duration_ms
from .errors import ConfigurationError
from .faults import Faults, FaultyBackend
from .records import Origin
from .scheduler import Scheduler

__all__ = [
    "Faults",
    "FaultyBackend",
    "LoopClock",
    "ManualClock",
    "MemoryBackend",
    "RunResult",
    "run_once",
    "scheduler",
]


class ManualClock:
    """A clock in epoch milliseconds that moves only when told: ``MemoryBackend(clock=c)``."""

    def __init__(self, start_ms: int | None = None) -> None:
        self.ms = time.time_ns() // 1_000_000 if start_ms is None else start_ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, by: int | str | dt.timedelta) -> int:
        """Move forward by milliseconds, or a duration such as ``"30s"``; returns the new time."""
        step = by if isinstance(by, int) else parse_duration_ms(by)
        if step < 0:
            raise ConfigurationError(f"a clock only moves forward; got {by!r}")
        self.ms += step
        return self.ms

    def set(self, ms: int) -> None:
        self.ms = ms


class LoopClock:
    """Epoch ms that follow the running event loop's clock: ``base_ms`` at loop time 0.

    ``offset_ms`` shifts it, as a host whose clock is off. A store and several
    schedulers given clocks with one ``base_ms`` share one timeline; on a loop with
    virtual time (``looptime``) it moves only as the loop fast-forwards.
    """

    def __init__(self, base_ms: int, offset_ms: int = 0) -> None:
        self.base_ms = base_ms
        self.offset_ms = offset_ms

    def __call__(self) -> int:
        return self.base_ms + self.offset_ms + int(asyncio.get_running_loop().time() * 1000)


@dataclass(frozen=True)
class RunResult:
    """What :func:`run_once` observed: the handler's return value and the ``ctx`` it had."""

    value: Any
    ctx: RunContext


def run_once(
    scheduler: Scheduler,
    job: str,
    *,
    slot: int | None = None,
    attempt: int = 1,
    origin: Origin | str = Origin.MANUAL,
) -> RunResult:
    """Run ``job``'s handler now with a real ``ctx``; exceptions propagate to the test.

    ``slot`` defaults to the job's next slot. Nothing is claimed or recorded: this
    tests the handler, not the store. Async handlers run on a fresh event loop; sync
    handlers run in a worker thread beside it, as the scheduler runs them (so that, for
    example, Django's ORM works in them).
    """
    try:
        definition = scheduler.jobs[job]
    except KeyError:
        known = ", ".join(sorted(scheduler.jobs)) or "none"
        raise ConfigurationError(f"no job named {job!r} in {scheduler!r}; jobs: {known}") from None
    if slot is None:
        slot = definition.schedule.next_slot(time.time_ns() // 1_000_000)

    async def call() -> RunResult:
        ctx = RunContext(
            job=definition.name,
            slot=slot,
            attempt=attempt,
            instance_id=scheduler.instance_id,
            origin=Origin(origin),
            loop=asyncio.get_running_loop(),
            logger=logging.getLogger("anarchon"),
        )
        if inspect.iscoroutinefunction(definition.handler):
            value = await definition.handler(ctx)
        else:
            value = await asyncio.to_thread(definition.handler, ctx)
        if inspect.isawaitable(value):
            value = await value
        return RunResult(value, ctx)

    return asyncio.run(call())


if pytest is not None:

    @pytest.fixture
    def scheduler() -> Scheduler:
        """A scheduler on a fresh in-memory store (no jitter, 50 ms heartbeats).

        Start and stop it inside the test's own event loop.
        """
        return Scheduler(MemoryBackend(), instance_id="test", jitter_ms=0, heartbeat_ms=50)
