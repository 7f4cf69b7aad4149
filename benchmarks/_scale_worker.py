"""The processes of ``python -m benchmarks.scale``: one real instance, or one virtual cluster.

:func:`real_child` is one OS process holding one ``Scheduler`` with the benchmark's jobs
on a real store. Its async handler appends ``(job index, slot, attempt, start ms,
ctx.jitter_ms)`` to a list (written to a JSON file at the end); the store is wrapped so
that every backend call the engine makes is counted (outermost calls only: a batch that
calls its own single-run method internally counts once) and timed. At the window marks
it snapshots ``Scheduler.stats``, those counts and its own ``getrusage`` CPU time.

:func:`virtual_child` runs many schedulers on one in-memory store on virtual time
(looptime, as ``tests/virtual.py`` does) and returns what the store decided.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import resource
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.sharedctypes import SynchronizedArray
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

#: The backend methods counted per process (the engine's whole store traffic).
COUNTED = (
    "now_ms",
    "claim",
    "claim_many",
    "heartbeat",
    "finish",
    "finish_many",
    "release",
    "due_runs",
    "take_over",
    "last_scheduled_slot",
    "prune",
    "paused_jobs",
    "register",
    "unregister",
    "instances",
)
#: Batch methods whose first argument is a sequence: its length is counted too.
BATCHES = ("claim_many", "finish_many", "heartbeat")

_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("scale_inside", default=False)


def job_names(jobs: int) -> list[str]:
    """The job names, identical in every process."""
    return [f"scale.{i:06d}" for i in range(jobs)]


def count_calls(backend: Any) -> tuple[Counter[str], Counter[str], dict[str, float]]:
    """Wrap ``backend``'s methods (on the instance) to count calls, batch items and time."""
    calls: Counter[str] = Counter()
    items: Counter[str] = Counter()
    seconds: dict[str, float] = dict.fromkeys(COUNTED, 0.0)

    def wrap(name: str, method: Any) -> Any:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            if _inside.get():
                return await method(*args, **kwargs)
            token = _inside.set(True)
            t0 = time.perf_counter()
            try:
                return await method(*args, **kwargs)
            finally:
                _inside.reset(token)
                calls[name] += 1
                seconds[name] += time.perf_counter() - t0
                if name in BATCHES and args:
                    items[name] += len(args[0])

        return counted

    for name in COUNTED:
        method = getattr(backend, name, None)
        if method is not None:
            setattr(backend, name, wrap(name, method))
    return calls, items, seconds


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


async def _sleep_until(ms: int) -> None:
    delay = ms - _wall_ms()
    if delay > 0:
        await asyncio.sleep(delay / 1000)


def _backend(cfg: dict[str, Any]) -> Any:
    from anarchon_core.backends import backend_from_url

    if cfg["store"] == "postgres":
        from anarchon_core.backends.postgres import PostgresBackend

        return PostgresBackend(
            cfg["conninfo"], schema=cfg["schema"], max_size=cfg["pg_pool"], min_size=1
        )
    return backend_from_url(cfg["url"])


async def _run_real(
    cfg: dict[str, Any], index: int, ready: Barrier, go: Barrier, times: SynchronizedArray[int]
) -> dict[str, Any]:
    from anarchon_core import RunContext, Scheduler

    names = job_names(cfg["jobs"])
    number = {name: i for i, name in enumerate(names)}
    records: list[tuple[int, int, int, int, int]] = []

    async def handler(ctx: RunContext) -> None:
        records.append((number.get(ctx.job, -1), ctx.slot, ctx.attempt, _wall_ms(), ctx.jitter_ms))

    backend = _backend(cfg)
    calls, items, seconds = count_calls(backend)
    scheduler = Scheduler(
        backend,
        instance_id=f"scale-{index}-{cfg['run_id']}",
        candidates=cfg["candidates"],
    )
    for name in names:
        scheduler.every(name, cfg["every"], handler)
    # Wait for every process to be built, then for the parent to set the times.
    await asyncio.get_running_loop().run_in_executor(None, ready.wait)
    await asyncio.get_running_loop().run_in_executor(None, go.wait)
    start_ms, mark_a, mark_b, stop_ms = (int(x) for x in times[:4])

    snapshots: list[dict[str, Any]] = []

    async def sample() -> None:
        for mark in (mark_a, mark_b):
            await _sleep_until(mark)
            snapshots.append(
                {
                    "t": _wall_ms(),
                    "stats": dict(scheduler.stats),
                    "calls": dict(calls),
                    "items": dict(items),
                    "seconds": dict(seconds),
                    "cpu": _cpu_s(),
                }
            )

    await _sleep_until(start_ms)
    cpu0, t0 = _cpu_s(), _wall_ms()
    await scheduler.start()
    sampler = asyncio.create_task(sample())
    await _sleep_until(stop_ms)
    await sampler
    cpu1, t1 = _cpu_s(), _wall_ms()
    await scheduler.stop(grace_ms=3000)
    return {
        "index": index,
        "records": records,
        "snapshots": snapshots,
        "stats": dict(scheduler.stats),
        "cpu_run": (cpu1 - cpu0) / max((t1 - t0) / 1000, 1e-9),
        "calls": dict(calls),
    }


def real_child(
    cfg: dict[str, Any],
    index: int,
    ready: Barrier,
    go: Barrier,
    times: SynchronizedArray[int],
    out: str,
) -> None:
    """One instance: build, wait for the others, run between the parent's times."""
    import logging

    logging.basicConfig(level=logging.ERROR)
    try:
        result = asyncio.run(_run_real(cfg, index, ready, go, times))
    except BaseException:
        ready.abort()
        go.abort()
        raise
    Path(out).write_text(json.dumps(result))


# -- virtual time -------------------------------------------------------------------
def virtual_child(cfg: dict[str, Any], out: str) -> None:
    """``cfg["instances"]`` schedulers with ``cfg["jobs"]`` jobs every second on one
    in-memory store, on virtual time; writes what the store decided to ``out``."""
    import logging

    logging.basicConfig(level=logging.ERROR)
    Path(out).write_text(json.dumps(run_virtual(**cfg)))


def run_virtual(
    instances: int,
    jobs: int,
    candidates: int | None,
    warmup_s: float = 4.0,
    judged_s: int = 5,
    tail_s: float = 2.0,
    memo_registry: bool = False,
) -> dict[str, Any]:
    import looptime

    from anarchon_core import RunContext, Scheduler
    from anarchon_core.backend import ClaimRequest, InstanceInfo
    from anarchon_core.backends import MemoryBackend
    from anarchon_core.testing import LoopClock

    base = 1_800_000_000_000  # a whole minute: slots fall on whole loop seconds

    class Store(MemoryBackend):
        """Counts what the store decides; times the registry reads (their real CPU)."""

        def __init__(self, clock: LoopClock) -> None:
            super().__init__(clock=clock)
            self.claims: Counter[int] = Counter()  # slot -> claims decided
            self.requests: Counter[int] = Counter()  # slot -> claim_many requests
            self.registry_reads = 0
            self.registry_s = 0.0
            self.registry_bytes = 0
            self._infos: dict[str, tuple[InstanceInfo, int]] = {}

        async def claim(self, request: ClaimRequest) -> Any:
            self.claims[request.slot] += 1
            return await super().claim(request)

        async def claim_many(self, requests: Sequence[ClaimRequest]) -> Any:
            if requests:
                self.requests[requests[0].slot] += 1
            return await super().claim_many(requests)

        async def register(self, info: InstanceInfo, ttl_ms: int) -> None:
            if not memo_registry:
                return await super().register(info, ttl_ms)
            now = self._clock()
            self._infos[info.instance_id] = (replace(info, last_seen=now), now + ttl_ms)
            return None

        async def unregister(self, instance_id: str) -> None:
            self._infos.pop(instance_id, None)
            await super().unregister(instance_id)

        async def instances(self) -> list[InstanceInfo]:
            t0 = time.perf_counter()
            try:
                if not memo_registry:
                    return await super().instances()
                now = self._clock()
                for dead in [k for k, (_, exp) in self._infos.items() if exp <= now]:
                    del self._infos[dead]
                return [info for _, (info, _) in sorted(self._infos.items())]
            finally:
                self.registry_reads += 1
                self.registry_s += time.perf_counter() - t0

    ran: Counter[tuple[int, int]] = Counter()

    async def handler(ctx: RunContext) -> None:
        ran[number[ctx.job], ctx.slot] += 1

    names = job_names(jobs)
    number = {name: i for i, name in enumerate(names)}
    result: dict[str, Any] = {}

    async def main() -> None:
        clock = LoopClock(base)
        store = Store(clock)
        schedulers = []
        t_build = time.perf_counter()
        for n in range(instances):
            scheduler = Scheduler(
                store,
                instance_id=f"v{n:04d}",
                candidates=candidates,
                clock=LoopClock(base),
            )
            for name in names:
                scheduler.every(name, "1s", handler)
            schedulers.append(scheduler)
        for scheduler in schedulers:
            await scheduler.start()
        result["build_s"] = time.perf_counter() - t_build
        start = clock()
        first = (start + int(warmup_s * 1000)) // 1000 * 1000 + 1000
        await asyncio.sleep((first - 200 - clock()) / 1000)
        reads0, reg0 = store.registry_reads, store.registry_s
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(judged_s)  # the judged slots' claims happen in here
        result["wall_per_virtual_s"] = (time.perf_counter() - wall0) / judged_s
        result["cpu_per_virtual_s"] = (time.process_time() - cpu0) / judged_s
        result["registry_reads_per_virtual_s"] = (store.registry_reads - reads0) / judged_s
        result["registry_s_per_virtual_s"] = (store.registry_s - reg0) / judged_s
        await asyncio.sleep(tail_s)
        t_stop = time.perf_counter()
        await asyncio.gather(*(s.stop(grace_ms=1000) for s in schedulers))
        result["stop_s"] = time.perf_counter() - t_stop
        slots = list(range(first, first + judged_s * 1000, 1000))
        result["slots"] = len(slots)
        result["due"] = len(slots) * jobs
        counts = [ran[j, s] for s in slots for j in range(jobs)]
        result["executions"] = sum(counts)
        result["missed"] = sum(1 for c in counts if c == 0)
        result["twice"] = sum(1 for c in counts if c > 1)
        result["claims"] = sum(store.claims[s] for s in slots)
        result["requests"] = sum(store.requests[s] for s in slots)

    def loop() -> asyncio.AbstractEventLoop:
        return looptime.new_event_loop(start=0, noop_cycles=1)

    t0 = time.perf_counter()
    with asyncio.Runner(loop_factory=loop) as runner:
        runner.run(main())
    result.update(
        instances=instances,
        jobs=jobs,
        candidates=candidates,
        memo_registry=memo_registry,
        total_wall_s=time.perf_counter() - t0,
        max_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    return result
