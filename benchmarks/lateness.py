"""Run lateness: how long after its slot (minus the jitter waited) a handler starts.

A ``Scheduler`` on a SQLite temp file holds ``--jobs`` jobs, alternately
``every("1s")`` and ``every("2s")``, whose async handler records
``time.time_ns() // 1_000_000 - ctx.slot - ctx.jitter_ms``: the lateness the
scheduler adds (claim round trip, queueing behind the other due claims, event-loop
delay), the random jitter excluded. Three configurations, each ``--seconds`` long:

* one process, ``jitter_ms=0``: every due claim of a second lands in the same burst;
* one process, the default ``jitter_ms=500`` (clamped to a quarter of the interval);
* ``--procs`` processes on one file with the same job names (the deployment shape),
  with ``jitter_ms=0`` (every process claims every slot at the same instant: the
  worst contention) and with the default jitter.

Every handler records ``(job, slot)``; the runs of all processes are checked: no slot
may run twice (the benchmark fails if one did), and the slots due while every process
was up are counted against those that ran (``ran/due``).

Run alone: ``python -m benchmarks.lateness [--jobs 1000 --seconds 12 --procs 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from anarchon_core import RunContext, Scheduler
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.schedules import Every

from ._util import filesystem, machine, percentile, print_table

INTERVALS = ("1s", "2s")
#: Slots due in the last ``jitter_ms`` + this before the stop are left out of ran/due.
SETTLE_MS = 1000


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def job_names(jobs: int) -> list[tuple[str, str]]:
    """``(name, interval)`` of every job, identical in every process."""
    return [(f"late.{i:04d}", INTERVALS[i % len(INTERVALS)]) for i in range(jobs)]


async def run_instance(
    path: str,
    jobs: int,
    until_ms: int,
    jitter_ms: int,
    instance_id: str,
) -> dict[str, Any]:
    """Run one scheduler until ``until_ms`` (epoch ms); return what its handlers saw."""
    lateness: list[int] = []
    runs: list[tuple[str, int]] = []

    async def handler(ctx: RunContext) -> None:
        lateness.append(time.time_ns() // 1_000_000 - ctx.slot - ctx.jitter_ms)
        runs.append((ctx.job, ctx.slot))

    scheduler = Scheduler(SqliteBackend(path), instance_id=instance_id, jitter_ms=jitter_ms)
    for name, interval in job_names(jobs):
        scheduler.every(name, interval, handler)
    await scheduler.start()
    started = _wall_ms()
    cpu0 = time.process_time()
    await asyncio.sleep(max(until_ms - started, 0) / 1000)
    stopped = _wall_ms()
    cpu = time.process_time() - cpu0
    await scheduler.stop(grace_ms=5000)
    return {
        "instance": instance_id,
        "started": started,
        "stopped": stopped,
        "cpu_s": cpu,
        "lateness": lateness,
        "runs": runs,
        "stats": dict(scheduler.stats),
    }


def _child(
    path: str, jobs: int, seconds: float, jitter_ms: int, index: int, barrier: Barrier, out: str
) -> None:
    """One process of the multi-process run: start together, stop at a shared deadline."""
    barrier.wait()
    until = _wall_ms() + int(seconds * 1000)
    result = asyncio.run(run_instance(path, jobs, until, jitter_ms, f"bench-{index}"))
    Path(out).write_text(json.dumps(result))


@dataclass
class Outcome:
    """The merged results of one configuration."""

    label: str
    lateness: list[int]
    runs_per_s: float
    due: int
    ran_in_window: int
    doubled: int
    cpu_pct: float
    per_process: list[int]


def merge(label: str, jobs: int, jitter_ms: int, results: Sequence[dict[str, Any]]) -> Outcome:
    """Check that no slot ran twice; count the slots due while every process was up.

    The window ends ``jitter_ms + SETTLE_MS`` before the first stop, so that a slot
    still waiting out its jitter when the processes stop is not counted as missed.
    """
    counts = Counter((job, slot) for r in results for job, slot in r["runs"])
    doubled = sum(1 for c in counts.values() if c > 1)
    first, last = max(r["started"] for r in results), min(r["stopped"] for r in results)
    # A slot due just before the stop may still be waiting out its jitter: not counted.
    last -= jitter_ms + SETTLE_MS
    due = sum(len(Every(interval).slots_between(first, last)) for _, interval in job_names(jobs))
    ran = sum(1 for (_, slot) in counts if first < slot <= last)
    seconds = (last - first) / 1000
    cpu = sum(r["cpu_s"] for r in results)
    span = statistics.mean((r["stopped"] - r["started"]) / 1000 for r in results)
    return Outcome(
        label=label,
        lateness=sorted(x for r in results for x in r["lateness"]),
        runs_per_s=ran / seconds if seconds > 0 else 0.0,
        due=due,
        ran_in_window=ran,
        doubled=doubled,
        cpu_pct=100 * cpu / span if span > 0 else 0.0,
        per_process=[len(r["runs"]) for r in results],
    )


def single(tmp: Path, jobs: int, seconds: float, jitter_ms: int) -> Outcome:
    path = str(tmp / f"single-{jitter_ms}.db")
    result = asyncio.run(
        run_instance(path, jobs, _wall_ms() + int(seconds * 1000), jitter_ms, "bench-0")
    )
    return merge(f"1 process, jitter_ms={jitter_ms}", jobs, jitter_ms, [result])


def multi(tmp: Path, jobs: int, seconds: float, jitter_ms: int, procs: int) -> Outcome:
    path = str(tmp / f"multi-{jitter_ms}.db")

    async def create_layout() -> None:
        backend = SqliteBackend(path)
        await backend.open()
        await backend.close()

    asyncio.run(create_layout())
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    outs = [str(tmp / f"multi-{jitter_ms}-{i}.json") for i in range(procs)]
    workers = [
        ctx.Process(target=_child, args=(path, jobs, seconds, jitter_ms, i, barrier, outs[i]))
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(seconds + 120)
        if w.exitcode != 0:
            raise RuntimeError(f"lateness worker {w.pid} exited with {w.exitcode}")
    results = [json.loads(Path(o).read_text()) for o in outs]
    return merge(f"{procs} processes, jitter_ms={jitter_ms}", jobs, jitter_ms, results)


def report(outcomes: Sequence[Outcome], jobs: int, seconds: float) -> None:
    rows = []
    for o in outcomes:
        lat = o.lateness
        rows.append(
            (
                o.label,
                percentile(lat, 50),
                percentile(lat, 99),
                lat[-1] if lat else float("nan"),
                o.runs_per_s,
                f"{o.ran_in_window:,}/{o.due:,}",
                o.doubled,
                o.cpu_pct,
            )
        )
    print_table(
        f"lateness: {jobs:,} jobs (half every 1s, half every 2s), {seconds:g} s per configuration;"
        " lateness = handler start - slot - ctx.jitter_ms",
        ("configuration", "p50 ms", "p99 ms", "max ms", "runs/s", "ran/due", "ran twice", "CPU %"),
        rows,
    )
    for o in outcomes:
        if len(o.per_process) > 1:
            print(f"{o.label}: runs per process {o.per_process}")
    print("CPU % = process CPU time / wall time, summed over processes (100 % = one core)")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lateness", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--jitter-ms", type=int, default=500, help="the non-zero configuration")
    args = parser.parse_args(argv)
    print(f"== lateness ==\n{machine()}")
    with tempfile.TemporaryDirectory(prefix="anarchon-bench-") as name:
        tmp = Path(name)
        outcomes = [
            single(tmp, args.jobs, args.seconds, 0),
            single(tmp, args.jobs, args.seconds, args.jitter_ms),
            multi(tmp, args.jobs, args.seconds, 0, args.procs),
            multi(tmp, args.jobs, args.seconds, args.jitter_ms, args.procs),
        ]
        report(outcomes, args.jobs, args.seconds)
        print(f"SQLite file on {filesystem(name)}")
    failed = [o for o in outcomes if o.doubled]
    if failed:
        raise SystemExit(f"FAILED: a slot ran twice in {', '.join(o.label for o in failed)}")


if __name__ == "__main__":
    main()
