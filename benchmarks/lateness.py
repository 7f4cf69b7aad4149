"""Run lateness: how long after its slot a handler starts, gross and net of the wait taken.

A ``Scheduler`` on a SQLite temp file holds ``--jobs`` jobs, alternately
``every("1s")`` and ``every("2s")``, whose async handler records two figures:

* **gross**: ``time.time_ns() // 1_000_000 - ctx.slot``, what a user of the job sees
  (the slot to the handler's start, every wait included);
* **net**: the same minus ``ctx.jitter_ms``, the wait the engine took before claiming
  (a ranked turn's stagger, or the random jitter where no ranking exists): the delay
  the scheduler adds on top (claim round trip, queueing behind the other due claims,
  event-loop delay).

On a lease store each run is ranked: its first candidate claims at the slot, so the
winner normally waited nothing and gross and net agree; the random jitter (up to
``min(jitter_ms, gap / 4, horizon / 2)``) is only waited where no ranking exists
(``candidates=None``, or before an instance's first registry read). Configurations,
each ``--seconds`` long, all with ``candidates=--candidates`` (default 2) but the last:

* one process, ``jitter_ms=0``;
* one process, the default ``jitter_ms=500``;
* ``--procs`` processes on one file with the same job names (the deployment shape),
  with ``jitter_ms=0`` and with the default jitter;
* ``--procs`` processes with ``candidates=None`` and the default jitter: every process
  claims every run after a random wait (the unranked path).

Every handler records ``(job, slot)``; the runs of all processes are checked: no slot
may run twice (the benchmark fails if one did), and the slots due while every process
was up are counted against those that ran (``ran/due``).

Run alone: ``python -m benchmarks.lateness [--jobs 1000 --seconds 12 --procs 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
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
from anarchon_core.scheduler import DEFAULT_CANDIDATES
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
    candidates: int | None = DEFAULT_CANDIDATES,
) -> dict[str, Any]:
    """Run one scheduler until ``until_ms`` (epoch ms); return what its handlers saw."""
    # Abandoned claims and retries are counted from the scheduler's stats instead of
    # printing one warning each.
    logging.getLogger("anarchon").setLevel(logging.ERROR)
    gross: list[int] = []
    waited: list[int] = []
    runs: list[tuple[str, int]] = []

    async def handler(ctx: RunContext) -> None:
        gross.append(time.time_ns() // 1_000_000 - ctx.slot)
        waited.append(ctx.jitter_ms)
        runs.append((ctx.job, ctx.slot))

    scheduler = Scheduler(
        SqliteBackend(path), instance_id=instance_id, jitter_ms=jitter_ms, candidates=candidates
    )
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
        "gross": gross,
        "waited": waited,
        "runs": runs,
        "stats": dict(scheduler.stats),
    }


def _child(
    path: str,
    jobs: int,
    seconds: float,
    jitter_ms: int,
    candidates: int | None,
    index: int,
    barrier: Barrier,
    out: str,
) -> None:
    """One process of the multi-process run: start together, stop at a shared deadline."""
    barrier.wait()
    until = _wall_ms() + int(seconds * 1000)
    result = asyncio.run(run_instance(path, jobs, until, jitter_ms, f"bench-{index}", candidates))
    Path(out).write_text(json.dumps(result))


@dataclass
class Outcome:
    """The merged results of one configuration."""

    label: str
    gross: list[int]
    """Handler start - slot, sorted."""
    net: list[int]
    """Handler start - slot - ``ctx.jitter_ms``, sorted."""
    waited: list[int]
    """``ctx.jitter_ms`` of every run, sorted."""
    claims: int
    """Claims sent (every outcome), all processes."""
    expired: int
    """Claims answered (or given up) past the slot's horizon."""
    retries: int
    """Store calls retried (claims given up on after half their time left, errors)."""
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
    gross = [x for r in results for x in r["gross"]]
    waited = [w for r in results for w in r["waited"]]
    return Outcome(
        label=label,
        gross=sorted(gross),
        net=sorted(g - w for g, w in zip(gross, waited, strict=True)),
        waited=sorted(waited),
        claims=sum(v for r in results for k, v in r["stats"].items() if k.startswith("claim_")),
        expired=sum(r["stats"].get("claim_expired", 0) for r in results),
        retries=sum(r["stats"].get("store_retries", 0) for r in results),
        runs_per_s=ran / seconds if seconds > 0 else 0.0,
        due=due,
        ran_in_window=ran,
        doubled=doubled,
        cpu_pct=100 * cpu / span if span > 0 else 0.0,
        per_process=[len(r["runs"]) for r in results],
    )


def _label(procs: int, jitter_ms: int, candidates: int | None) -> str:
    who = "1 process" if procs == 1 else f"{procs} processes"
    return f"{who}, candidates={candidates}, jitter_ms={jitter_ms}"


def single(tmp: Path, jobs: int, seconds: float, jitter_ms: int, candidates: int | None) -> Outcome:
    path = str(tmp / f"single-{jitter_ms}-{candidates}.db")
    until = _wall_ms() + int(seconds * 1000)
    result = asyncio.run(run_instance(path, jobs, until, jitter_ms, "bench-0", candidates))
    return merge(_label(1, jitter_ms, candidates), jobs, jitter_ms, [result])


def multi(
    tmp: Path, jobs: int, seconds: float, jitter_ms: int, procs: int, candidates: int | None
) -> Outcome:
    path = str(tmp / f"multi-{jitter_ms}-{candidates}.db")

    async def create_layout() -> None:
        backend = SqliteBackend(path)
        await backend.open()
        await backend.close()

    asyncio.run(create_layout())
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    outs = [str(tmp / f"multi-{jitter_ms}-{candidates}-{i}.json") for i in range(procs)]
    workers = [
        ctx.Process(
            target=_child,
            args=(path, jobs, seconds, jitter_ms, candidates, i, barrier, outs[i]),
        )
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(seconds + 120)
        if w.exitcode != 0:
            raise RuntimeError(f"lateness worker {w.pid} exited with {w.exitcode}")
    results = [json.loads(Path(o).read_text()) for o in outs]
    return merge(_label(procs, jitter_ms, candidates), jobs, jitter_ms, results)


def report(outcomes: Sequence[Outcome], jobs: int, seconds: float) -> None:
    rows = []
    for o in outcomes:
        gross, net = o.gross, o.net
        rows.append(
            (
                o.label,
                percentile(gross, 50),
                percentile(gross, 99),
                gross[-1] if gross else float("nan"),
                percentile(net, 50),
                percentile(net, 99),
                f"{percentile(o.waited, 50):.0f} / {percentile(o.waited, 99):.0f} / "
                f"{o.waited[-1] if o.waited else 0}",
                o.runs_per_s,
                f"{o.ran_in_window:,}/{o.due:,}",
                o.claims / max(len(o.gross), 1),
                o.expired,
                o.retries,
                o.doubled,
                o.cpu_pct,
            )
        )
    print_table(
        f"lateness: {jobs:,} jobs (half every 1s, half every 2s), {seconds:g} s per configuration;"
        " gross = handler start - slot; net = gross - ctx.jitter_ms",
        (
            "configuration",
            "gross p50",
            "gross p99",
            "gross max",
            "net p50",
            "net p99",
            "jitter_ms p50/p99/max",
            "runs/s",
            "ran/due",
            "claims/run",
            "expired",
            "retries",
            "ran twice",
            "CPU %",
        ),
        rows,
    )
    for o in outcomes:
        if len(o.per_process) > 1:
            print(f"{o.label}: runs per process {o.per_process}")
    print("CPU % = process CPU time / wall time, summed over processes (100 % = one core)")


def _candidates(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lateness", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--jitter-ms", type=int, default=500, help="the non-zero configuration")
    parser.add_argument(
        "--candidates",
        type=_candidates,
        default=DEFAULT_CANDIDATES,
        help="candidates of the ranked configurations: an int, or none (default 2)",
    )
    args = parser.parse_args(argv)
    print(f"== lateness ==\n{machine()}")
    with tempfile.TemporaryDirectory(prefix="anarchon-bench-") as name:
        tmp = Path(name)
        k = args.candidates
        outcomes = [
            single(tmp, args.jobs, args.seconds, 0, k),
            single(tmp, args.jobs, args.seconds, args.jitter_ms, k),
            multi(tmp, args.jobs, args.seconds, 0, args.procs, k),
            multi(tmp, args.jobs, args.seconds, args.jitter_ms, args.procs, k),
        ]
        if k is not None:  # the unranked path: every process claims after a random wait
            outcomes.append(multi(tmp, args.jobs, args.seconds, args.jitter_ms, args.procs, None))
        report(outcomes, args.jobs, args.seconds)
        print(f"SQLite file on {filesystem(name)}")
    failed = [o for o in outcomes if o.doubled]
    if failed:
        raise SystemExit(f"FAILED: a slot ran twice in {', '.join(o.label for o in failed)}")


if __name__ == "__main__":
    main()
