"""Engine CPU per won run: the scheduler's own cost, with no store round trip.

One ``Scheduler`` on the in-memory store holds ``--jobs`` jobs ``every("1s")`` with a
no-op async handler and runs on a virtual-time event loop (looptime): the loop's clock
jumps over every sleep, so the process CPU time (``time.process_time``) spent over
``--seconds`` of virtual time is all engine work (timer, claims, attempts, heartbeats,
finishes, telemetry with ``prometheus_client``) plus the in-memory store's decisions.
Each repeat runs in a fresh process; the figure is CPU ms per won run, median of the
repeats with their spread.

Run alone: ``python -m benchmarks.engine_cpu [--jobs 1000 --seconds 20 --repeats 5]``.
With ``--tree PATH`` the same measurement also runs against another source tree
(e.g. a ``git worktree`` of an older commit), interleaved with this one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def measure(jobs: int, seconds: float) -> dict[str, float]:
    """CPU ms per won run of one engine on virtual time (run in a fresh process)."""
    import asyncio
    import time

    import looptime
    from prometheus_client import CollectorRegistry

    from anarchon_core import RunContext, Scheduler
    from anarchon_core.backends import MemoryBackend
    from anarchon_core.testing import LoopClock

    base = 1_800_000_000_000
    ran = 0

    async def handler(ctx: RunContext) -> None:
        nonlocal ran
        ran += 1

    async def main() -> float:
        clock = LoopClock(base)
        scheduler = Scheduler(
            MemoryBackend(clock=clock),
            instance_id="bench",
            clock=clock,
            metrics_registry=CollectorRegistry(),
        )
        for n in range(jobs):
            scheduler.every(f"job{n}", "1s")(handler)
        await scheduler.start()
        await asyncio.sleep(2.0)  # past start-up and the first registry read
        before, counted = time.process_time(), ran
        await asyncio.sleep(seconds)
        spent, runs = time.process_time() - before, ran - counted
        await scheduler.stop(grace_ms=1000)
        return spent * 1000 / max(runs, 1)

    def loop() -> asyncio.AbstractEventLoop:
        return looptime.new_event_loop(start=0, noop_cycles=1)

    with asyncio.Runner(loop_factory=loop) as runner:
        per_run = runner.run(main())
    return {"cpu_ms_per_run": per_run}


def _child(tree: Path, jobs: int, seconds: float) -> float:
    code = (  # this file, loaded by path: the other tree may not have it
        "import json, runpy; "
        f"measure = runpy.run_path({str(Path(__file__).resolve())!r})['measure']; "
        f"print(json.dumps(measure({jobs}, {seconds})))"
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True, check=True
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["cpu_ms_per_run"])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0, help="virtual seconds measured")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tree", type=Path, help="another source tree to compare with")
    args = parser.parse_args(argv)
    from ._util import machine

    print(machine())
    trees = {"this tree": HERE}
    if args.tree:
        trees["--tree " + str(args.tree)] = args.tree.resolve()
    samples: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.repeats):  # interleaved: the machine's load hits both alike
        for name, tree in trees.items():
            samples[name].append(_child(tree, args.jobs, args.seconds))
    print(
        f"engine CPU per won run, {args.jobs} jobs every 1 s, in-memory store, "
        f"{args.seconds:g} virtual s, {args.repeats} repeats (median, min-max):"
    )
    for name, values in samples.items():
        print(
            f"  {name:<40} {statistics.median(values):.3f} ms ({min(values):.3f}-{max(values):.3f})"
        )
    if args.tree:
        this, other = samples.values()
        ratios = sorted(a / b for a, b in zip(this, other, strict=True))
        print(
            f"  ratio this/other: median {statistics.median(ratios):.2f} "
            f"({ratios[0]:.2f}-{ratios[-1]:.2f})"
        )


if __name__ == "__main__":
    main()
