"""Idle cost: one instance holding many jobs of which none is due.

``--jobs`` jobs (10,000) ``every("1h")`` on a SQLite temp file (an offset keeps the
next slot out of the measurement when the hour is about to turn). Reported: the time
to define the jobs, to ``start()`` and to run every job loop's first step; the idle
CPU (process CPU time over ``--seconds`` of wall time after start-up, all threads);
the RSS before, after start and at the end; and how often the scheduler called the
store meanwhile (the backend is wrapped to count and time its calls). A one-job
scheduler is measured first as the baseline.

Run alone: ``python -m benchmarks.idle [--jobs 10000 --seconds 10]``.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from anarchon_core import RunContext, Scheduler
from anarchon_core.backend import DueRun, Lease
from anarchon_core.backends.sqlite import SqliteBackend

from ._util import filesystem, machine, print_table, rss_kib

T = TypeVar("T")
HOUR_MS = 3_600_000
#: Use a 30-minute offset if the hour turns within this margin of the start.
MARGIN_MS = 300_000


class CountingSqliteBackend(SqliteBackend):
    """A :class:`SqliteBackend` that counts and times the calls an idle scheduler makes."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.calls: dict[str, list[int]] = defaultdict(list)

    async def _timed(self, name: str, call: Callable[[], Awaitable[T]]) -> T:
        t0 = time.perf_counter_ns()
        try:
            return await call()
        finally:
            self.calls[name].append(time.perf_counter_ns() - t0)

    async def due_runs(self, jobs: Collection[str]) -> list[DueRun]:
        return await self._timed(
            "due_runs", lambda: super(CountingSqliteBackend, self).due_runs(jobs)
        )

    async def heartbeat(self, leases: Sequence[Lease], lease_ms: int) -> list[bool]:
        return await self._timed(
            "heartbeat", lambda: super(CountingSqliteBackend, self).heartbeat(leases, lease_ms)
        )

    async def prune(
        self,
        older_than_ms: int,
        *,
        jobs: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> int:
        return await self._timed(
            "prune",
            lambda: super(CountingSqliteBackend, self).prune(
                older_than_ms, jobs=jobs, namespace=namespace
            ),
        )


@dataclass
class Idle:
    """What one idle measurement saw."""

    jobs: int
    offset: str | None
    define_s: float
    start_s: float
    first_pass_s: float
    stop_s: float
    seconds: float
    cpu_s: float
    rss_before_kib: int
    rss_started_kib: int
    rss_end_kib: int
    calls: dict[str, list[int]] = field(default_factory=dict)

    @property
    def cpu_pct(self) -> float:
        return 100 * self.cpu_s / self.seconds


def _offset(now_ms: int, horizon_ms: int) -> str | None:
    """An offset that keeps every ``1h`` slot out of the next ``horizon_ms``."""
    return "30m" if HOUR_MS - now_ms % HOUR_MS < horizon_ms + MARGIN_MS else None


async def measure(path: str, jobs: int, seconds: float) -> Idle:
    async def handler(ctx: RunContext) -> None:
        raise AssertionError(f"{ctx.job}@{ctx.slot} came due during the idle measurement")

    offset = _offset(time.time_ns() // 1_000_000, int(seconds * 1000))
    backend = CountingSqliteBackend(path)
    rss_before = rss_kib()
    clock = time.perf_counter
    t0 = clock()
    scheduler = Scheduler(backend, instance_id=f"idle-{jobs}")
    for i in range(jobs):
        scheduler.every(f"idle.{i:05d}", "1h", handler, offset=offset)
    t1 = clock()
    await scheduler.start()
    t2 = clock()
    await asyncio.sleep(0)  # every job loop's first step runs before this resumes
    t3 = clock()
    await asyncio.sleep(1.0)  # settle: first timers armed, the first sweep under way
    rss_started = rss_kib()
    backend.calls.clear()
    cpu0, wall0 = time.process_time(), clock()
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu0, clock() - wall0
    calls: dict[str, Any] = dict(backend.calls)
    rss_end = rss_kib()
    claimed = sum(n for key, n in scheduler.stats.items() if key.startswith("claim_"))
    t4 = clock()
    await scheduler.stop(grace_ms=0)
    t5 = clock()
    if claimed:
        raise AssertionError(f"{claimed} claims were made during the idle measurement")
    return Idle(
        jobs=jobs,
        offset=offset,
        define_s=t1 - t0,
        start_s=t2 - t1,
        first_pass_s=t3 - t2,
        stop_s=t5 - t4,
        seconds=wall,
        cpu_s=cpu,
        rss_before_kib=rss_before,
        rss_started_kib=rss_started,
        rss_end_kib=rss_end,
        calls=calls,
    )


def report(results: Sequence[Idle]) -> None:
    rows = []
    for r in results:
        rows.append(
            (
                f"{r.jobs:,} job(s)",
                r.define_s * 1000,
                r.start_s * 1000,
                r.first_pass_s * 1000,
                r.stop_s * 1000,
                r.cpu_pct,
                r.rss_before_kib / 1024,
                r.rss_started_kib / 1024,
                r.rss_end_kib / 1024,
            )
        )
    print_table(
        "idle: every('1h'), nothing due; CPU % over the measured wall time (100 % = one core)",
        (
            "scheduler",
            "define ms",
            "start ms",
            "1st pass ms",
            "stop ms",
            "idle CPU %",
            "RSS0 MiB",
            "RSS MiB",
            "RSS end MiB",
        ),
        rows,
    )
    call_rows = []
    for r in results:
        for name, samples in sorted(r.calls.items()):
            ordered = sorted(samples)
            call_rows.append(
                (
                    f"{r.jobs:,} job(s)",
                    name,
                    len(samples),
                    len(samples) / r.seconds,
                    sum(ordered) / len(ordered) / 1e6,
                    ordered[-1] / 1e6,
                )
            )
    print_table(
        "store calls made while idle (wall time per call, including the worker-thread hop)",
        ("scheduler", "call", "count", "per s", "mean ms", "max ms"),
        call_rows or [("-", "none", 0, 0.0, float("nan"), float("nan"))],
    )
    big = results[-1]
    if big.jobs > 1:
        per_job = (big.rss_started_kib - big.rss_before_kib) * 1024 / big.jobs
        print(f"RSS growth per job (define + start): {per_job / 1024:.1f} KiB")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        f"peak RSS of the process: {peak / 1024:.1f} MiB; idle window {big.seconds:.1f} s"
        + (f"; offset {big.offset} used to keep the hour's slot out" if big.offset else "")
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.idle", description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--baseline-seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    print(f"== idle ==\n{machine()}")
    with tempfile.TemporaryDirectory(prefix="anarchon-bench-") as name:
        results = [
            asyncio.run(measure(str(Path(name) / "one.db"), 1, args.baseline_seconds)),
            asyncio.run(measure(str(Path(name) / "idle.db"), args.jobs, args.seconds)),
        ]
        report(results)
        print(f"SQLite file on {filesystem(name)}")


if __name__ == "__main__":
    main()
