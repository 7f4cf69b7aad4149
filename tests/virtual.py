"""Schedulers on virtual time: the protocol's seconds run in milliseconds of wall time.

The event loop is looptime's: it fast-forwards its clock whenever nothing is ready, so
sleeps, leases, heartbeats and fault delays cost no wall time. Every clock (the store's
and each instance's, see :class:`~anarchon_core.testing.LoopClock`) follows it. Handlers
are async (a thread would run on real time) and record what really ran as
:class:`Execution` spans on the store's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import looptime

from anarchon_core import RunContext, Scheduler
from anarchon_core.backend import Backend
from anarchon_core.testing import LoopClock

T = TypeVar("T")

#: Epoch ms at loop time 0: a whole minute, so that slots fall on round loop times.
BASE_MS = 1_800_000_000_000


def run_virtual(main: Callable[[], Awaitable[T]], *, lean: bool = False) -> T:
    """Run ``main()`` on a fresh event loop with virtual time (starting at 0).

    The clock jumps to the next timer as soon as nothing is ready (one idle cycle,
    not looptime's default 42: with no I/O nothing can become ready meanwhile).
    ``lean`` runs it on :class:`VirtualTimeLoop` instead of looptime's loop.
    """

    def loop() -> asyncio.AbstractEventLoop:
        if lean:
            return VirtualTimeLoop()
        return looptime.new_event_loop(start=0, noop_cycles=1)

    with asyncio.Runner(loop_factory=loop) as runner:
        return runner.run(main())  # type: ignore[arg-type]


class _NoIOSelector(selectors.BaseSelector):
    """A selector on which nothing ever becomes ready: waiting only moves the clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj if isinstance(fileobj, int) else fileobj.fileno())

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError("virtual time: nothing is scheduled, so nothing can ever happen")
        self.now += timeout
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is virtual: a wait for the next timer takes no time.

    Leaner than looptime's (no polling of real sockets, no executor bookkeeping), for
    simulations that do nothing but timers and tasks: every handler must be async (a
    worker thread would run on real time, unseen by this clock).
    """

    def __init__(self) -> None:
        self._virtual = _NoIOSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now


def scheduler_on(store: Backend, instance_id: str = "web-7f9c4d:12:a1b2c3", **kw: Any) -> Scheduler:
    """A scheduler on ``store`` whose clock follows the virtual loop (heartbeat 100 ms)."""
    return Scheduler(
        store,
        instance_id=instance_id,
        heartbeat_ms=100,
        clock=LoopClock(BASE_MS),
        **kw,
    )


async def noop(ctx: RunContext) -> None:
    """A handler that does nothing."""


def store_clock() -> LoopClock:
    return LoopClock(BASE_MS)


@dataclass
class Execution:
    """One handler call as it really ran (store-clock ms)."""

    job: str
    slot: int
    attempt: int
    instance: str
    start: int
    end: int | None = None
    #: ``ctx`` was cancelled (lost lease, self-fence, stop) before the handler ended.
    told_to_stop_at: int | None = None
    #: The handler kept running past its cancellation.
    ignores_cancel: bool = False
    completed: bool = False
    #: ``schedule``, ``catch_up`` or ``manual``: a catch-up run starts long after its slot.
    origin: str = "schedule"


@dataclass
class Recorder:
    """Collects :class:`Execution` spans; makes handlers that fill it."""

    clock: LoopClock = field(default_factory=store_clock)
    executions: list[Execution] = field(default_factory=list)
    #: Instances whose process is dead: their handlers end at once (a SIGKILL).
    dead: set[str] = field(default_factory=set)

    def handler(
        self, duration_ms: int, *, ignores_cancel: bool = False
    ) -> Callable[[RunContext], Awaitable[None]]:
        """An async handler that works ``duration_ms``; it stops when cancelled, unless
        ``ignores_cancel`` (then it works on until done, or until its instance dies)."""

        async def handle(ctx: RunContext) -> None:
            run = Execution(ctx.job, ctx.slot, ctx.attempt, ctx.instance_id, self.clock())
            run.ignores_cancel = ignores_cancel
            run.origin = str(ctx.origin)
            self.executions.append(run)
            deadline = run.start + duration_ms
            try:
                try:
                    await asyncio.sleep(duration_ms / 1000)
                except asyncio.CancelledError:
                    run.told_to_stop_at = self.clock()
                    if not ignores_cancel:
                        raise
                    while (left := deadline - self.clock()) > 0:
                        if ctx.instance_id in self.dead:
                            raise
                        with contextlib.suppress(asyncio.CancelledError):
                            await asyncio.sleep(left / 1000)
                run.completed = ctx.instance_id not in self.dead
            finally:
                if run.end is None:  # else its instance was killed: it ended then
                    run.end = self.clock()

        return handle

    def kill(self, instance: str) -> None:
        """The instance's process dies now: its handlers end at this instant."""
        self.dead.add(instance)
        now = self.clock()
        for run in self.executions:
            if run.instance == instance and run.end is None:
                run.end = now

    def overlapping(self) -> list[tuple[Execution, Execution]]:
        """Pairs of executions of one run whose spans overlap in time."""
        return list(_overlaps(self.executions))


def _overlaps(executions: Iterable[Execution]) -> Iterable[tuple[Execution, Execution]]:
    by_run: dict[tuple[str, int], list[Execution]] = {}
    for run in executions:
        by_run.setdefault((run.job, run.slot), []).append(run)
    for runs in by_run.values():
        runs.sort(key=lambda r: r.start)
        for i, first in enumerate(runs):
            for second in runs[i + 1 :]:
                end = first.end if first.end is not None else float("inf")
                if second.start < end:
                    yield first, second


def describe(runs: Iterable[Any]) -> str:
    return "\n".join(f"  {run}" for run in runs)
