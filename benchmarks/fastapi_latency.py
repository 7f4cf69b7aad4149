"""An endpoint's latency and throughput with the scheduler idle vs. busy in the same workers.

``uvicorn --workers 2`` serves ``benchmarks/_fastapi_app.py`` (``GET /ping``, a small
JSON answer, and ``FastAPI(lifespan=lifespan(scheduler))`` on the embedded SQLite
default, a fresh file per run). Variants, selected by environment variables:

* ``idle``: the scheduler runs with one job ``every("10s")`` (an async no-op), so its
  loops, heartbeat and backup sweep run as in any deployment: the fair baseline;
* ``1000 jobs``: 1,000 such jobs ``every("10s")`` with the default jitter (each claim
  waits a random 0-500 ms): every 10 s both workers claim 1,000 slots, and each slot
  runs in one of them;
* ``1000 jobs no jitter``: the same with ``jitter_ms=0``: all 1,000 claims of each
  worker at the same instant, the worst burst.

For each run a load generator in its own process (an asyncio httpx client with
``--concurrency`` keep-alive connections, closed loop) sends requests for the warm-up
(discarded) and then ``--seconds``; the measured window is placed on the 10 s grid so
that it holds two slot boundaries, each at least 2.5 s from its edges. Runs are
interleaved in rotating order, ``--repeats`` times; every repeat gives the ratios
``1000 jobs / idle`` for p99, p50 and requests/s, reported as the median with its spread.
"p99 at slot" is the p99 of the requests sent within 1 s after a slot boundary (the
jitter, the claims, the runs and their finishes happen then).

Run alone: ``python -m benchmarks.fastapi_latency [--seconds 20 --repeats 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ._util import filesystem, machine, percentile, print_table, ratio_summary

ROOT = Path(__file__).resolve().parent.parent
#: The variants: name -> (jobs, jitter_ms or None for the scheduler's default).
VARIANTS: dict[str, tuple[int, int | None]] = {
    "idle": (1, None),
    "1000 jobs": (1000, None),
    "1000 jobs no jitter": (1000, 0),
}
BASELINE = "idle"
#: The slot boundaries must lie at least this far inside the measured window.
EDGE_S = 2.5


@dataclass
class Result:
    variant: str
    repeat: int
    latencies_ns: list[int]
    at_slot_ns: list[int]
    seconds: float
    errors: int
    split: list[int]
    connections: list[int]
    server_cpu_pct: float
    client_cpu_pct: float
    handler_runs: int

    @property
    def rps(self) -> float:
        return len(self.latencies_ns) / self.seconds

    def pct_ms(self, pct: float, at_slot: bool = False) -> float:
        samples = sorted(self.at_slot_ns if at_slot else self.latencies_ns)
        return percentile(samples, pct) / 1e6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (Linux ``/proc``), 0 if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (uvicorn's workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry))
    return found


def window_start(now: float, warmup: float, interval: float) -> float:
    """The first wall time after ``now + warmup`` at a phase in [EDGE_S, interval - EDGE_S)
    of the slot grid, so that a window of 2 intervals holds two slot boundaries."""
    t = now + warmup
    phase = t % interval
    if EDGE_S <= phase < interval - EDGE_S:
        return t
    return t + (EDGE_S - phase) % interval


# -- the load generator (its own process) ---------------------------------------------
def client_main(
    conn: Connection, port: int, concurrency: int, workers: int, t0: float, t1: float
) -> None:
    """Closed loop: ``concurrency`` connections, each sending its next request when the
    last one answered, until the wall time ``t1``; records requests started after ``t0``.

    The connections are spread evenly over the server's workers: a worker accepts every
    connection that is pending when it wakes, so 16 connections opened at once often all
    land on one worker. A connection that lands on a worker that already has its share
    is closed and opened again (during the warm-up), so that every run has the same
    shape and both workers serve the load their scheduler shares the CPU with."""
    result = asyncio.run(_client(port, concurrency, workers, t0, t1))
    conn.send(result)
    conn.close()


async def _client(
    port: int, concurrency: int, workers: int, t0: float, t1: float
) -> dict[str, Any]:
    import httpx

    offset = time.perf_counter_ns() - time.time_ns()  # wall ns -> perf_counter ns
    start_ns = int(t0 * 1e9) + offset
    stop_ns = int(t1 * 1e9) + offset
    starts = array("q")
    latencies = array("q")
    pids: Counter[int] = Counter()
    errors: list[str] = []
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    share = math.ceil(concurrency / workers)
    connections: Counter[int] = Counter()

    def new_client() -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=30)

    async def connection(index: int) -> None:
        await asyncio.sleep(index * 0.005)
        client = new_client()
        try:
            for _ in range(200):
                pid = (await client.get("/ping")).json()["pid"]
                if connections[pid] < share or time.perf_counter_ns() >= start_ns:
                    connections[pid] += 1
                    break
                await client.aclose()
                await asyncio.sleep(0.002)
                client = new_client()
            await requests(client)
        finally:
            await client.aclose()

    async def requests(client: httpx.AsyncClient) -> None:
        while (begin := time.perf_counter_ns()) < stop_ns:
            try:
                response = await client.get("/ping")
                end = time.perf_counter_ns()
                if response.status_code != 200:
                    errors.append(f"status {response.status_code}")
                    continue
                pid = response.json()["pid"]
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                errors.append(repr(exc))
                continue
            if begin >= start_ns:
                starts.append(begin - start_ns)
                latencies.append(end - begin)
                pids[pid] += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(connection(i) for i in range(concurrency)))
    return {
        "starts": starts,
        "latencies": latencies,
        "pids": dict(pids),
        "connections": dict(connections),
        "errors": errors,
        "cpu_pct": 100 * (time.process_time() - cpu0) / (time.perf_counter() - wall0),
    }


# -- one run: a server, a load, a teardown --------------------------------------------
def run_once(variant: str, repeat: int, args: argparse.Namespace, tmp_root: Path) -> Result:
    jobs, jitter = VARIANTS[variant]
    interval = float(args.every)
    tmp = Path(tempfile.mkdtemp(prefix=f"run{repeat}-", dir=tmp_root))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("ANARCHON_BACKEND",)}
    env.update(
        ANARCHON_ENABLED="1",
        ANARCHON_BENCH_JOBS=str(jobs),
        ANARCHON_BENCH_EVERY=f"{args.every}s",
        ANARCHON_BENCH_DIR=str(tmp),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
    )
    env.pop("ANARCHON_BENCH_JITTER_MS", None)
    if jitter is not None:
        env["ANARCHON_BENCH_JITTER_MS"] = str(jitter)
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "benchmarks._fastapi_app:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(args.workers),
        "--no-access-log",
        "--log-level",
        "warning",
    ]
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        command, env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp.glob("ready-*"))) < args.workers:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{_tail(tmp)}")
            time.sleep(0.05)
        workers = children(server.pid)
        t0 = window_start(time.time(), args.warmup, interval)
        t1 = t0 + args.seconds
        ctx = mp.get_context("spawn")
        receive, send = ctx.Pipe(duplex=False)
        client = ctx.Process(
            target=client_main,
            args=(send, port, args.concurrency, args.workers, t0, t1),
            daemon=True,
        )
        client.start()
        send.close()
        time.sleep(max(t0 - time.time(), 0))
        ticks0 = sum(cpu_ticks(p) for p in workers)
        w0 = time.monotonic()
        time.sleep(max(t1 - time.time(), 0))
        ticks1 = sum(cpu_ticks(p) for p in workers)
        w1 = time.monotonic()
        deadline = time.monotonic() + 60
        while not receive.poll(0.1):
            if not client.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the load generator did not answer")
        got: dict[str, Any] = receive.recv()
        client.join(10)
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        handler_runs = sum(int(p.read_text()) for p in tmp.glob("runs-*"))
    finally:
        with suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
        log.close()
    if got["errors"]:
        raise RuntimeError(f"{variant}: failed requests: {got['errors'][:5]}\n{_tail(tmp)}")
    # Requests started within 1 s after a slot boundary (jitter 0-500 ms, then the claims).
    first_slot = math.ceil(t0 / interval) * interval - t0
    bounds = []
    s = first_slot
    while s < args.seconds:
        bounds.append((int(s * 1e9), int((s + 1) * 1e9)))
        s += interval
    at_slot = [
        lat
        for st, lat in zip(got["starts"], got["latencies"], strict=True)
        if any(lo <= st < hi for lo, hi in bounds)
    ]
    if handler_runs < jobs * len(bounds):  # every slot in the window must have run
        raise RuntimeError(
            f"{variant}: {handler_runs} handler runs, fewer than the {jobs * len(bounds)} "
            f"due in the measured window\n{_tail(tmp)}"
        )
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    return Result(
        variant=variant,
        repeat=repeat,
        latencies_ns=list(got["latencies"]),
        at_slot_ns=at_slot,
        seconds=args.seconds,
        errors=len(got["errors"]),
        split=sorted(got["pids"].values(), reverse=True),
        connections=sorted(got["connections"].values(), reverse=True),
        server_cpu_pct=100 * (ticks1 - ticks0) / ticks_per_s / (w1 - w0),
        client_cpu_pct=got["cpu_pct"],
        handler_runs=handler_runs,
    )


def _tail(tmp: Path) -> str:
    path = tmp / "server.log"
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


# -- report ---------------------------------------------------------------------------
def report(results: list[Result], variants: Sequence[str], args: argparse.Namespace) -> None:
    rows = []
    for r in results:
        rows.append(
            [
                r.repeat + 1,
                r.variant,
                round(r.rps),
                r.pct_ms(50),
                r.pct_ms(99),
                r.pct_ms(100),
                r.pct_ms(99, at_slot=True),
                r.server_cpu_pct,
                r.client_cpu_pct,
                "/".join(str(n) for n in r.connections),
                "/".join(f"{100 * n / max(sum(r.split), 1):.0f}" for n in r.split),
                r.handler_runs,
            ]
        )
    print_table(
        f"each run: {args.seconds:g} s measured (after >= {args.warmup:g} s warm-up), "
        f"{args.concurrency} connections, "
        f"uvicorn --workers {args.workers}",
        [
            "#",
            "variant",
            "req/s",
            "p50 ms",
            "p99 ms",
            "max ms",
            "p99 at slot",
            "server CPU %",
            "client CPU %",
            "conns",
            "req %",
            "runs",
        ],
        rows,
    )

    by = {(r.repeat, r.variant): r for r in results}
    repeats = sorted({r.repeat for r in results})
    for variant in variants:
        if variant == BASELINE:
            continue
        ratio_rows = []
        p99s, p50s, rpss, slots = [], [], [], []
        for k in repeats:
            a, b = by[(k, BASELINE)], by[(k, variant)]
            p99s.append(b.pct_ms(99) / a.pct_ms(99))
            p50s.append(b.pct_ms(50) / a.pct_ms(50))
            rpss.append(b.rps / a.rps)
            if a.at_slot_ns and b.at_slot_ns:
                slots.append(b.pct_ms(99, True) / a.pct_ms(99, True))
            at_slot = b.pct_ms(99, True) / a.pct_ms(99, True)
            ratio_rows.append([k + 1, p99s[-1], p50s[-1], rpss[-1], at_slot])
        print_table(
            f"{variant} / {BASELINE}, per repeat",
            ["#", "p99 ratio", "p50 ratio", "req/s ratio", "p99 at slot ratio"],
            ratio_rows,
        )
        print(f"  p99:         {ratio_summary(p99s)}")
        print(f"  p50:         {ratio_summary(p50s)}")
        print(f"  req/s:       {ratio_summary(rpss)}")
        print(f"  p99 at slot: {ratio_summary(slots)}")
        verdict = "met" if statistics.median(p99s) <= 1.10 else "NOT met"
        print(f"  goal p99 within 10 % (median ratio <= 1.10): {verdict}")

    pooled = []
    for variant in variants:
        mine = [r for r in results if r.variant == variant]
        lat = sorted(x for r in mine for x in r.latencies_ns)
        slot = sorted(x for r in mine for x in r.at_slot_ns)
        pooled.append(
            [
                variant,
                statistics.median(r.rps for r in mine),
                percentile(lat, 50) / 1e6,
                percentile(lat, 99) / 1e6,
                percentile(lat, 99.9) / 1e6,
                lat[-1] / 1e6,
                percentile(slot, 99) / 1e6,
                statistics.median(r.server_cpu_pct for r in mine),
                len(lat),
            ]
        )
    print_table(
        "pooled over the repeats",
        [
            "variant",
            "req/s (median)",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "max ms",
            "p99 at slot",
            "server CPU %",
            "requests",
        ],
        pooled,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="discarded seconds, at least")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16, help="client connections")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn --workers")
    parser.add_argument("--every", type=int, default=10, help="the jobs' interval in seconds")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, from: {', '.join(VARIANTS)} (the first is the baseline)",
    )
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or BASELINE not in variants:
        parser.error(f"--variants: choose from {', '.join(VARIANTS)}, including {BASELINE!r}")
    if args.seconds < 2 * args.every - 2 * EDGE_S:
        print(f"note: --seconds {args.seconds:g} holds fewer than two slot boundaries")

    print(
        "fastapi_latency: an endpoint under load, the scheduler idle vs. 1,000 jobs "
        f"every {args.every} s in the same workers"
    )
    print(machine())
    with tempfile.TemporaryDirectory(prefix="anarchon-bench-") as tmp_name:
        tmp = Path(tmp_name)
        print(f"temp files: {filesystem(tmp_name)}", flush=True)
        results: list[Result] = []
        for k in range(args.repeats):
            order = variants[k % len(variants) :] + variants[: k % len(variants)]
            for variant in order:
                t = time.perf_counter()
                result = run_once(variant, k, args, tmp)
                results.append(result)
                print(
                    f"  repeat {k + 1} {variant}: {result.rps:,.0f} req/s, "
                    f"p99 {result.pct_ms(99):.2f} ms, {result.handler_runs} runs "
                    f"({time.perf_counter() - t:.1f} s)",
                    flush=True,
                )
    report(results, variants, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
