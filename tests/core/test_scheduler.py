"""The engine on the in-memory backend: one process, several schedulers, short intervals.

Whatever is about the protocol's timing runs on virtual time (``tests/virtual.py``): the
store and every scheduler read a :class:`~anarchon_core.testing.LoopClock`, the loop's
clock jumps to its next timer, so timings are exact and a second costs no wall time.
Sync handlers (threads), ``BackgroundScheduler``, a fork and the SQLite store (the
host's wall clock) stay on real time.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from virtual import BASE_MS, run_virtual, store_clock

from anarchon_core import (
    BackendUnavailable,
    BackgroundScheduler,
    Capabilities,
    CapabilityError,
    ConfigurationError,
    MemoryBackend,
    RunContext,
    Scheduler,
    SchedulerStateError,
    Status,
)
from anarchon_core.records import HistoryQuery, Origin

FAST = {"heartbeat_ms": 50, "jitter_ms": 0}


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def records(backend: MemoryBackend, job: str | None = None) -> list[Any]:
    return await backend.history(HistoryQuery(job=job, limit=10_000))


def virtual_store() -> MemoryBackend:
    """An in-memory store on the virtual clock (its schedulers: ``clock=store_clock()``)."""
    return MemoryBackend(clock=store_clock())


def loop_time() -> float:
    """The running loop's clock in seconds: virtual inside :func:`run_virtual`."""
    return asyncio.get_running_loop().time()


async def nothing(ctx: RunContext) -> None:
    """A handler for virtual time: async (a sync one runs in a thread, on real time)."""


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    """Poll ``predicate`` every 20 ms of the loop's clock, for ``timeout`` seconds of it."""
    deadline = loop_time() + timeout
    while loop_time() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_each_slot_runs_once_across_schedulers() -> None:
    backend = virtual_store()
    ran: Counter[tuple[int, str]] = Counter()

    async def main() -> None:
        schedulers = [
            Scheduler(
                backend, instance_id=f"i{n}", heartbeat_ms=50, jitter_ms=30, clock=store_clock()
            )
            for n in range(3)
        ]
        for s in schedulers:

            @s.every("tick", "100ms")
            async def tick(ctx: RunContext) -> None:
                ran[(ctx.slot, ctx.instance_id)] += 1

        for s in schedulers:
            await s.start()
        # slots 100 … 1200 ms are due, each claimed at most 25 ms (its jitter) late;
        # the stop falls between two slots, so that none is left to a tie
        await asyncio.sleep(1.25)
        for s in schedulers:
            await s.stop()

    run_virtual(main)
    slots = sorted(slot for slot, _ in ran)
    assert len(slots) == 12
    assert len(slots) == len(set(slots)), "a slot ran twice"
    assert slots == [BASE_MS + 100 * n for n in range(1, 13)], "a slot was missed"
    assert all(b - a == 100 for a, b in itertools.pairwise(slots)), "a slot was missed"
    assert len({instance for _, instance in ran}) >= 2, "winners should spread"


def test_sync_handler_runs_in_a_thread_and_gets_ctx() -> None:
    backend = MemoryBackend()
    seen: list[tuple[str, int, int, str, Origin]] = []

    async def main() -> None:
        s = Scheduler(backend, instance_id="solo", **FAST)

        @s.every("sync.job", "100ms")
        def handler(ctx: RunContext) -> None:
            seen.append(
                (threading.current_thread().name, ctx.slot, ctx.attempt, ctx.job, ctx.origin)
            )
            assert ctx.scheduled_at.timestamp() * 1000 == ctx.slot
            assert ctx.fence == ctx.slot * 1024 + 1

        await s.start()
        await asyncio.sleep(0.35)
        await s.stop()

    run(main())
    assert seen
    thread, _, attempt, job, origin = seen[0]
    assert thread == "anarchon:sync.job"
    assert (attempt, job, origin) == (1, "sync.job", Origin.SCHEDULE)


def test_failure_and_timeout_are_recorded() -> None:
    backend = MemoryBackend()
    cancelled_sync: list[str | None] = []

    async def main() -> None:
        s = Scheduler(backend, instance_id="solo", max_attempts=1, **FAST)

        @s.every("boom", "200ms")
        async def boom(ctx: RunContext) -> None:
            raise RuntimeError("kaput")

        @s.every("slow.async", "200ms", timeout_ms=50)
        async def slow_async(ctx: RunContext) -> None:
            await asyncio.sleep(10)

        @s.every("slow.sync", "200ms", timeout_ms=50)
        def slow_sync(ctx: RunContext) -> None:
            ctx.wait(1.0)
            cancelled_sync.append(ctx.cancel_reason)

        await s.start()
        await asyncio.sleep(0.3)
        await s.stop(grace_ms=0)

    run(main())
    history = run(records(backend))
    # A slot claimed as the stop (grace 0) began is released unstarted: interrupted.
    by_job = {r.job: r for r in history if r.status not in (Status.RUNNING, Status.INTERRUPTED)}
    assert by_job["boom"].status == Status.FAILED
    assert "RuntimeError: kaput" in (by_job["boom"].error or "")
    assert by_job["slow.async"].status == Status.FAILED
    assert "timed out after 50 ms" in (by_job["slow.async"].error or "")
    assert by_job["slow.sync"].status == Status.FAILED
    time.sleep(0.1)
    assert cancelled_sync and cancelled_sync[0] == "timeout"


def test_retries_run_the_next_attempt_after_backoff() -> None:
    backend = virtual_store()
    attempts: list[int] = []
    started: list[float] = []

    async def main() -> None:
        s = Scheduler(
            backend,
            instance_id="solo",
            retries=2,
            retry_backoff_ms=50,
            clock=store_clock(),
            **FAST,
        )

        @s.every("flaky", "2s")
        async def flaky(ctx: RunContext) -> None:
            attempts.append(ctx.attempt)
            started.append(loop_time())
            if ctx.attempt < 3:
                raise ValueError(f"attempt {ctx.attempt}")

        await s.start()
        await wait_for(lambda: _has(backend, "flaky", 3, Status.SUCCESS), timeout=5)
        await s.stop()

    run_virtual(main)
    assert attempts == [1, 2, 3]
    # the backoff doubles: 50 ms before attempt 2, 100 ms before attempt 3
    gaps = [b - a for a, b in itertools.pairwise(started)]
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1, gaps
    statuses = [(r.attempt, r.status) for r in run(records(backend, "flaky"))]
    assert statuses == [(3, Status.SUCCESS), (2, Status.FAILED), (1, Status.FAILED)]


async def _has(backend: MemoryBackend, job: str, attempt: int, status: Status) -> bool:
    return any(r.attempt == attempt and r.status == status for r in await records(backend, job))


def test_overlapping_slot_is_skipped() -> None:
    backend = virtual_store()

    async def main() -> None:
        s = Scheduler(backend, instance_id="solo", clock=store_clock(), **FAST)

        @s.every("long", "100ms")
        async def long(ctx: RunContext) -> None:
            await asyncio.sleep(0.35)

        await s.start()
        # slot 100 runs until 450 ms: 200, 300 and 400 are skipped; 500 runs (the stop,
        # between two slots, waits for it)
        await asyncio.sleep(0.55)
        await s.stop()

    run_virtual(main)
    statuses = Counter(r.status for r in run(records(backend, "long")))
    assert statuses[Status.SKIPPED] == 3
    assert statuses[Status.SUCCESS] == 2


def test_overlap_allow_runs_concurrently() -> None:
    backend = virtual_store()

    async def main() -> None:
        s = Scheduler(backend, instance_id="solo", overlap="allow", clock=store_clock(), **FAST)

        @s.every("long", "100ms")
        async def long(ctx: RunContext) -> None:
            await asyncio.sleep(0.25)

        await s.start()
        await asyncio.sleep(0.55)  # slots 100 … 500, each run beside the next two
        await s.stop()

    run_virtual(main)
    statuses = Counter(r.status for r in run(records(backend, "long")))
    assert statuses[Status.SKIPPED] == 0
    assert statuses[Status.SUCCESS] == 5


def test_stop_hands_over_to_a_backup_at_once() -> None:
    backend = virtual_store()
    started: list[tuple[str, int]] = []
    lease = {"heartbeat_ms": 100, "lease_ms": 3000, "jitter_ms": 0}

    async def main() -> None:
        # A long lease: without hand-over a backup would wait 3 s for expiry.
        a = Scheduler(backend, instance_id="A", clock=store_clock(), **lease)
        b = Scheduler(backend, instance_id="B", clock=store_clock(), **lease)

        @a.every("long", "3s")
        async def long_a(ctx: RunContext) -> None:
            started.append((ctx.instance_id, ctx.attempt))
            await asyncio.sleep(30)

        @b.every("long", "3s")
        async def long_b(ctx: RunContext) -> None:
            started.append((ctx.instance_id, ctx.attempt))
            await asyncio.sleep(0.05)

        await a.start()
        await wait_for(lambda: _has(backend, "long", 1, Status.RUNNING), timeout=5)
        await b.start()
        t0 = loop_time()
        await a.stop(grace_ms=0)
        await wait_for(lambda: _has(backend, "long", 2, Status.SUCCESS), timeout=2.5)
        # B's first sweep (1 to 2 heartbeats after its start), its 50 ms run, a 20 ms poll
        assert loop_time() - t0 < 0.3
        await b.stop()

    run_virtual(main)
    assert started == [("A", 1), ("B", 2)]
    history = {r.attempt: r for r in run(records(backend, "long"))}
    assert history[1].status == Status.INTERRUPTED
    assert history[2].instance_id == "B"


def test_catch_up_latest_and_all(caplog: pytest.LogCaptureFixture) -> None:
    for policy, expected in ((None, 1), ("latest", 1), ("all", 3), ("none", 0)):
        caught: list[int] = []
        backend = virtual_store()

        async def main(policy: str | None, backend: MemoryBackend, caught: list[int]) -> None:
            given = {} if policy is None else {"catch_up": policy}  # None: the default
            s = Scheduler(backend, instance_id="solo", clock=store_clock(), **FAST, **given)

            @s.every("nightly", "1h")
            async def job(ctx: RunContext) -> None:
                if ctx.origin == Origin.CATCH_UP:
                    caught.append(ctx.slot)

            # Pretend the job last ran 3 slots (hours) ago.
            from anarchon_core.backend import ClaimRequest

            now = await backend.now_ms()
            last = (now // 3_600_000 - 3) * 3_600_000
            await backend.claim(
                ClaimRequest("nightly", last, Origin.SCHEDULE, "t", "old", 1, 10**12, False)
            )
            await s.start()
            await asyncio.sleep(0.4)
            await s.stop()

        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="anarchon"):
            run_virtual(functools.partial(main, policy, backend, caught))
        left_out = [r for r in caplog.records if "catch_up='none' leaves them out" in r.message]
        assert len(left_out) == (policy == "none"), policy
        if left_out:
            assert "3 slot(s) passed while no instance ran this job" in left_out[0].message
        assert len(caught) == expected, policy
        assert caught == sorted(caught)
        # the latest ``expected`` of the 3 missed hours (the last one falls on the start)
        assert caught == [BASE_MS - 3_600_000 * n for n in reversed(range(expected))], policy


def test_no_catch_up_on_first_deploy() -> None:
    backend = virtual_store()
    caught: list[int] = []

    async def main() -> None:
        s = Scheduler(backend, instance_id="solo", catch_up="all", clock=store_clock(), **FAST)

        @s.every("nightly", "1h")
        async def job(ctx: RunContext) -> None:
            caught.append(ctx.slot)

        await s.start()
        await asyncio.sleep(0.2)
        await s.stop()

    run_virtual(main)
    assert caught == []


def test_start_twice_raises_and_restart_works() -> None:
    backend = MemoryBackend()

    async def main() -> None:
        s = Scheduler(backend, instance_id="solo", **FAST)
        s.every("x", "1h", lambda ctx: None)
        await s.start()
        with pytest.raises(SchedulerStateError, match="already running"):
            await s.start()
        with pytest.raises(SchedulerStateError, match="running scheduler"):
            s.every("y", "1h", lambda ctx: None)
        await s.stop()
        await s.stop()  # idempotent
        await s.start()
        assert s.running
        await s.stop()
        assert not s.running

    run(main())


def test_disabled_scheduler_claims_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANARCHON_ENABLED", "0")
    backend = virtual_store()

    async def main() -> None:
        s = Scheduler(backend, clock=store_clock(), **FAST)
        s.every("x", "100ms", nothing)
        await s.start()
        await asyncio.sleep(0.35)  # slots 100, 200 and 300 are due
        await s.stop()

    run_virtual(main)
    assert run(records(backend)) == []


def test_background_scheduler_start_stop() -> None:
    backend = MemoryBackend()
    ran = threading.Event()
    s = Scheduler(backend, instance_id="bg", **FAST)
    s.every("x", "100ms", lambda ctx: ran.set())
    bg = BackgroundScheduler(s)
    bg.start()
    with pytest.raises(SchedulerStateError):
        bg.start()
    assert ran.wait(2)
    bg.stop(grace_ms=100)
    bg.stop()  # idempotent
    assert not bg.running and not s.running


class ClaimOnlyMemory(MemoryBackend):
    """The memory store declared claim-only, to exercise the capability checks."""

    capabilities = Capabilities(lease=False, store_clock=True, finish=True)
    name = "claim-only-memory"


def test_lease_only_options_refused_on_claim_only_backend() -> None:
    async def main() -> None:
        s = Scheduler(ClaimOnlyMemory(), **FAST)
        s.every("x", "1h", lambda ctx: None, catch_up="latest")
        with pytest.raises(CapabilityError, match=r"catch_up='latest' needs a lease backend"):
            await s.start()
        assert not s.running
        quiet = Scheduler(ClaimOnlyMemory(), **FAST)
        quiet.every("x", "1h", lambda ctx: None)  # defaults degrade silently
        await quiet.start()
        await quiet.stop()

    run(main())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"heartbeat_ms": 0}, "heartbeat_ms = 0 is not valid"),
        ({"heartbeat_ms": 1000, "lease_ms": 1500}, "at least 2 × heartbeat_ms"),
        ({"jitter_ms": -1}, "jitter_ms = -1 is not valid"),
        ({"jitter_ms": True}, "jitter_ms = True is not valid"),
        ({"catch_up": "sometimes"}, "'none', 'latest', 'all'"),
        ({"overlap": "queue"}, "'skip', 'allow'"),
        ({"max_attempts": 0}, "max_attempts = 0"),
        ({"jiter_ms": 5}, "unknown option 'jiter_ms'"),
        ({"namespace": "has space"}, "namespace 'has space' is not valid"),
        ({"history_retention": 7}, "history_retention"),
        ({"instance_id": ""}, "instance_id '' is not valid"),
        ({"grace_ms": -5}, "grace_ms = -5"),
    ],
)
def test_bad_scheduler_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        Scheduler(MemoryBackend(), **kwargs)


def test_bad_backend_url() -> None:
    with pytest.raises(ConfigurationError, match="scheme 'nosuch' is unknown"):
        Scheduler("nosuch://x")
    with pytest.raises(ConfigurationError, match="SCHEME://"):
        Scheduler("just-a-path.db")


def test_bad_job_definitions() -> None:
    s = Scheduler(MemoryBackend())
    s.every("ok", "1s", lambda ctx: None)
    with pytest.raises(ConfigurationError, match="defined twice"):
        s.every("ok", "1s", lambda ctx: None)
    with pytest.raises(ConfigurationError, match="job name 'bad name' is not valid"):
        s.every("bad name", "1s", lambda ctx: None)
    with pytest.raises(ConfigurationError, match="job name '' is not valid"):
        s.every("", "1s", lambda ctx: None)
    with pytest.raises(ConfigurationError, match="is not valid"):
        s.every("x" * 201, "1s", lambda ctx: None)
    with pytest.raises(ConfigurationError, match="interval 10 is not valid"):
        s.every("num", 10, lambda ctx: None)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="exactly one positional argument"):
        s.every("noargs", "1s", lambda: None)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="not callable"):
        s.every("notcallable", "1s", 42)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="unknown option 'timeout'"):

        @s.every("typo", "1s", timeout=5)
        def typo(ctx: RunContext) -> None: ...

    with pytest.raises(ConfigurationError):
        s.cron("badcron", "61 * * * *", lambda ctx: None)
    with pytest.raises(ConfigurationError):
        s.cron("badtz", "0 * * * *", lambda ctx: None, tz="Mars/Olympus")
    assert list(s.jobs) == ["ok"]


def test_namespace_prefixes_store_names() -> None:
    backend = virtual_store()

    async def main() -> None:
        s = Scheduler(backend, namespace="svc", instance_id="solo", clock=store_clock(), **FAST)
        s.every("tick", "100ms", nothing)
        assert s.jobs["tick"].store_name == "svc:tick"
        await s.start()
        await asyncio.sleep(0.25)
        await s.stop()

    run_virtual(main)
    assert {r.job for r in run(records(backend))} == {"svc:tick"}


def test_configure_before_start_only() -> None:
    first, second = virtual_store(), virtual_store()

    async def main() -> None:
        s = Scheduler(first, instance_id="a", clock=store_clock(), **FAST)
        s.every("tick", "100ms", nothing)
        s.configure(backend=second, instance_id="b")
        with pytest.raises(ConfigurationError, match="instance_id '  ' is not valid"):
            s.configure(instance_id="  ")
        await s.start()
        with pytest.raises(SchedulerStateError, match="stop\\(\\) it first"):
            s.configure(instance_id="c")
        await asyncio.sleep(0.25)
        await s.stop()

    run_virtual(main)
    assert run(records(first)) == []
    assert {r.instance_id for r in run(records(second))} == {"b"}


@pytest.mark.parametrize("given", [None, "fixed"])
def test_a_forked_child_starts_with_its_own_default_instance_id(given: str | None) -> None:
    """Built before a fork (``gunicorn --preload``, ``celery worker -B``), a scheduler
    with the default id mints a new one when it starts in the child; a given id stays."""
    import multiprocessing
    import os

    s = Scheduler(MemoryBackend(), instance_id=given, **FAST)
    parent_id = s.instance_id
    if given is None:
        assert f":{os.getpid()}:" in parent_id

    def child(conn: Any) -> None:
        async def main() -> str:
            await s.start()
            try:
                return s.instance_id
            finally:
                await s.stop()

        conn.send(run(main()))

    parent_end, child_end = multiprocessing.get_context("fork").Pipe()
    proc = multiprocessing.get_context("fork").Process(target=child, args=(child_end,))
    proc.start()
    child_id = parent_end.recv()
    proc.join(10)
    if given is None:
        assert child_id != parent_id and f":{proc.pid}:" in child_id
    else:
        assert child_id == parent_id == "fixed"
    assert s.instance_id == parent_id  # the parent's own id is untouched


def test_catch_up_slots_are_the_latest_thousand() -> None:
    from anarchon_core.engine.catch_up import latest_slots
    from anarchon_core.schedules import Cron, Every

    day = 86_400_000
    end = 1_791_633_605_000
    slots = latest_slots(Every("1s"), end - day, end)
    assert len(slots) == 1000
    assert slots[-1] == 1_791_633_605_000 and slots[0] == slots[-1] - 999_000
    assert latest_slots(Every("1h"), end - day, end) == Every("1h").slots_between(end - day, end)
    assert latest_slots(Every("10s"), end - 25_000, end) == [end - 15_000, end - 5_000]
    every_minute = latest_slots(Cron("* * * * *"), end - 3 * day, end)
    assert len(every_minute) == 1000 and every_minute[-1] == end - end % 60_000


def test_claim_only_retries_inside_the_winning_process() -> None:
    backend = ClaimOnlyMemory(clock=store_clock())
    seen: list[tuple[str, int]] = []
    retries = {"retries": 2, "retry_backoff_ms": 20, **FAST}

    async def main() -> None:
        a = Scheduler(backend, instance_id="A", clock=store_clock(), **retries)
        b = Scheduler(backend, instance_id="B", clock=store_clock(), **retries)
        for s in (a, b):

            @s.every("flaky", "2s")
            async def flaky(ctx: RunContext) -> None:
                seen.append((ctx.instance_id, ctx.attempt))
                if ctx.attempt < 3:
                    raise ValueError("not yet")

        await a.start()
        await b.start()
        await wait_for(lambda: _has(backend, "flaky", 1, Status.SUCCESS), timeout=5)
        await a.stop()
        await b.stop()

    run_virtual(main)
    assert [n for _, n in seen] == [1, 2, 3]
    assert len({i for i, _ in seen}) == 1, "the winning process retries, nobody else"


def test_takeover_attempts_refused_on_claim_only_backend() -> None:
    async def main() -> None:
        s = Scheduler(ClaimOnlyMemory(), **FAST)
        s.every("x", "1h", lambda ctx: None, max_attempts=3)
        with pytest.raises(CapabilityError, match="max_attempts=3 allows takeovers"):
            await s.start()
        ok = Scheduler(ClaimOnlyMemory(), **FAST)
        ok.every("x", "1h", lambda ctx: None, max_attempts=3, retries=2)
        await ok.start()
        await ok.stop()

    run(main())


def test_history_reads_after_stop(tmp_path: Any) -> None:
    async def main() -> list[Any]:
        s = Scheduler(f"sqlite:///{tmp_path / 'h.sqlite3'}", instance_id="solo", **FAST)
        s.every("tick", "100ms", lambda ctx: None)
        await s.start()
        await asyncio.sleep(0.25)
        await s.stop()
        return await s.history(job="tick")

    assert run(main())


def test_bad_operation_and_read_arguments() -> None:
    async def main() -> None:
        s = Scheduler(MemoryBackend(), **FAST)
        with pytest.raises(ConfigurationError, match="status 'bogus' is not valid: use one of"):
            await s.history(status="bogus")
        with pytest.raises(ConfigurationError, match="slot 'x' is not valid"):
            await s.cancel("job", "x")  # type: ignore[arg-type]

    run(main())
    with pytest.raises(ConfigurationError, match="between 1 and 1023"):
        Scheduler(MemoryBackend(), max_attempts=1024)
    with pytest.raises(ConfigurationError, match="misfire_grace_ms"):
        Scheduler(MemoryBackend(), misfire_grace_ms=8 * 86_400_000)
    with pytest.raises(ConfigurationError, match="at most 7d"):
        Scheduler(MemoryBackend(), catch_up_window="8d")


def test_short_lease_does_not_fence_a_healthy_runner() -> None:
    """lease_ms = 2 × heartbeat_ms is allowed, so it must work: no self-fencing."""
    backend = virtual_store()

    async def main() -> None:
        s = Scheduler(
            backend,
            instance_id="solo",
            heartbeat_ms=100,
            lease_ms=200,
            jitter_ms=0,
            clock=store_clock(),
        )

        @s.every("long", "2s")
        async def long(ctx: RunContext) -> None:
            await asyncio.sleep(0.8)

        await s.start()
        await wait_for(lambda: _has(backend, "long", 1, Status.SUCCESS), timeout=5)
        await s.stop()

    run_virtual(main)
    assert [r.attempt for r in run(records(backend, "long"))] == [1]


def test_a_heartbeat_refused_because_the_finish_landed_first_loses_nothing() -> None:
    """The finish mark ends the lease; a heartbeat answered after it must not read as fenced."""

    class SlowFinish(MemoryBackend):
        async def finish(self, lease: Any, status: Any, **kwargs: Any) -> bool:
            ok = await super().finish(lease, status, **kwargs)
            await asyncio.sleep(0.2)  # the answer comes late: heartbeats land in between
            return ok

    backend = SlowFinish(clock=store_clock())

    async def main() -> Scheduler:
        s = Scheduler(
            backend,
            instance_id="solo",
            heartbeat_ms=20,
            lease_ms=200,
            jitter_ms=0,
            clock=store_clock(),
        )

        @s.every("quick", "300ms")
        async def quick(ctx: RunContext) -> None:
            pass

        await s.start()
        await asyncio.sleep(1.0)
        await s.stop()
        return s

    s = run_virtual(main)
    assert s.stats["run_success"] == 3  # slots 300, 600 and 900 ms
    assert s.stats.get("fenced_heartbeat", 0) == 0 and s.stats.get("lost_lease", 0) == 0


def test_each_held_attempt_fences_itself_at_its_own_deadline() -> None:
    """One timer serves every held attempt's self-fence: runs that started at different
    times, with no heartbeat ever acknowledged, are each cancelled when their own
    ``lease_ms − heartbeat_ms`` since the claim has passed, not sooner, not never."""

    backend = FallsSilent(clock=store_clock())
    backend.silent = True
    window = 0.25  # lease_ms − heartbeat_ms
    spans: dict[str, float] = {}

    async def main() -> Scheduler:
        s = Scheduler(
            backend,
            instance_id="solo",
            heartbeat_ms=50,
            lease_ms=300,
            jitter_ms=0,
            clock=store_clock(),
        )

        async def hold(ctx: RunContext) -> None:
            began = loop_time()
            try:
                await asyncio.sleep(5)
            finally:
                spans.setdefault(ctx.job, loop_time() - began)

        for name, offset in (("first", "0ms"), ("second", "400ms"), ("third", "450ms")):
            s.every(name, "1s", hold, offset=offset)
        await s.start()
        await wait_for(lambda: _settled(spans, 3), timeout=4)
        await s.stop()
        return s

    s = run_virtual(main)
    assert s.stats["lost_lease"] >= 3
    assert len(spans) == 3
    for job, span in spans.items():
        assert round(span, 6) == window, (job, span)


def test_an_acknowledged_attempt_fences_itself_only_after_the_acknowledgements_stop() -> None:
    """The shared timer is left early when acknowledgements move a deadline later: it
    must then wait for the new deadline, neither fence at the old one nor forget it."""

    backend = FallsSilent(clock=store_clock())
    # lease_ms − heartbeat_ms; how long heartbeats are answered: not a multiple of the
    # window, so that the shared timer fires early once more after the last answer
    window, acked = 0.28, 0.5
    spans: dict[str, float] = {}

    async def main() -> Scheduler:
        s = Scheduler(
            backend,
            instance_id="solo",
            heartbeat_ms=20,
            lease_ms=300,
            jitter_ms=0,
            clock=store_clock(),
        )

        @s.every("long", "1s")
        async def long(ctx: RunContext) -> None:
            began = loop_time()
            try:
                await asyncio.sleep(acked)
                backend.silent = True
                await asyncio.sleep(5)
            finally:
                spans.setdefault(ctx.job, loop_time() - began)

        await s.start()
        await wait_for(lambda: _settled(spans, 1), timeout=4)
        await s.stop()
        return s

    s = run_virtual(main)
    assert s.stats["lost_lease"] >= 1
    # fenced one window after the last acknowledged heartbeat was sent (at most one
    # heartbeat period before the acknowledgements stopped), not one after the claim
    span = round(spans["long"], 6)
    assert acked + window - 0.02 <= span <= acked + window, spans


class FallsSilent(MemoryBackend):
    """A store that stops answering heartbeats once ``silent`` is set."""

    silent = False

    async def heartbeat(self, leases: Any, lease_ms: int) -> list[bool]:
        if self.silent:
            raise BackendUnavailable("no answer")
        return await super().heartbeat(leases, lease_ms)


async def _settled(spans: dict[str, float], count: int) -> bool:
    return len(spans) >= count


class DownAtStart(MemoryBackend):
    """A store that cannot be reached until ``up`` is set."""

    up = False

    async def open(self) -> None:
        if not self.up:
            raise BackendUnavailable("connection refused")
        await super().open()

    async def unregister(self, instance_id: str) -> None:
        if not self.up:
            raise AssertionError("left a registry it never joined")
        await super().unregister(instance_id)


def test_a_store_down_at_start_is_said_and_a_stop_does_not_touch_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = DownAtStart(clock=store_clock())

    async def main() -> None:
        s = Scheduler(store, clock=store_clock(), jitter_ms=0)  # type: ignore[arg-type]
        s.every("x", "1s", lambda ctx: None)
        await s.start()
        await asyncio.sleep(3)
        await s.stop()

    with caplog.at_level("INFO", logger="anarchon"):
        run_virtual(main)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "the store is unreachable: claiming starts when it answers" in text
    assert not [r for r in caplog.records if r.levelname == "ERROR"], text
    assert "registry" not in text, text  # it never joined it, so it does not leave it
