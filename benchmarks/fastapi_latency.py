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
  worker at the same instant, the worst burst;
* ``1000 jobs own process``: the web workers as in ``idle``, and the 1,000 jobs in one
  scheduler process of their own beside them (``python -m benchmarks._fastapi_app``, its
  own SQLite file): the deployment the FastAPI guide suggests when the app's p99
  matters. Its CPU counts in ``server CPU``.

For each run a load generator in its own process (an asyncio httpx client with
keep-alive connections spread evenly over the workers) sends requests for the warm-up
(discarded) and then ``--seconds``, in one of two shapes (``--load``, default both):

* ``closed`` loop: ``--concurrency`` connections, each sending its next request as soon
  as the last one is answered. It measures the most the machine serves: on 2 cores the
  client (about one core by itself) and the workers saturate the CPU, so every request
  queues behind any CPU the scheduler takes, and a slow answer also delays (and so
  hides) the requests that connection would have sent meanwhile (coordinated omission);
* ``open`` loop: requests *scheduled* at a fixed ``--rate``, whatever the answers do,
  handed to the first free connection of a pool of ``--open-connections`` (128: both
  workers would have to stall for 160 ms at 800/s, 550 ms at 230/s, to exhaust it); if
  all are busy the request waits in a queue (counted as ``pool full``). By default the
  rate is half the req/s of a short closed-loop probe (``idle``, ``--probe-seconds``)
  run once at the start, so that it is clearly below saturation on any machine (~800/s
  on the quiet 2-core development machine, where the closed loop serves ~1,700/s) and
  the same for every open-loop run, so the variants stay comparable; pass ``--rate`` to
  fix it. Latency is measured from the request's *scheduled* send time, not the actual
  one: the standard correction for coordinated omission (as in wrk2), so a stall costs
  every request scheduled during it, and the client's own lateness counts too (shown as
  ``send lag``: on 2 cores the client shares the CPU with the workers, so their bursts
  delay it as well). It measures what a user of an app with spare capacity sees: the
  question the issue asks.

Both are reported because they answer different questions: the closed loop, the cost
under saturation (throughput and queueing); the open loop, the latency at a realistic
load below it. The measured window is placed on the 10 s grid so that it holds two slot
boundaries, each at least 2.5 s from its edges. Runs (every load x variant) are
interleaved in rotating order, ``--repeats`` times; every repeat gives, per load, the
ratios ``1000 jobs / idle`` for p99, p50 and requests/s, reported as the median with its
spread. "p99 at slot" is the p99 of the requests sent (open loop: scheduled) within 1 s
after a slot boundary (the jitter, the claims, the runs and their finishes happen then).

Run alone: ``python -m benchmarks.fastapi_latency [--seconds 20 --repeats 4]`` (about
14 minutes); ``--load open`` for a quick check of the open loop only.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing as mp
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ._util import filesystem, machine, percentile, print_table, ratio_summary

ROOT = Path(__file__).resolve().parent.parent
#: The variants: name -> (jobs, jitter_ms or None for the scheduler's default, whether
#: the jobs run in a scheduler process of their own instead of the web workers).
VARIANTS: dict[str, tuple[int, int | None, bool]] = {
    "idle": (1, None, False),
    "1000 jobs": (1000, None, False),
    "1000 jobs no jitter": (1000, 0, False),
    "1000 jobs own process": (1000, None, True),
}
BASELINE = "idle"
#: The slot boundaries must lie at least this far inside the measured window.
EDGE_S = 2.5
#: The load shapes (see the module docstring).
LOADS = ("closed", "open")
#: The default open-loop rate as a fraction of the closed loop's idle req/s (the probe).
OPEN_FRACTION = 0.5
#: Seconds a run takes beyond its warm-up and window, for the announced duration: the
#: wait for the window's phase on the slot grid (1.25 s on average), the server's start
#: and stop (measured: ~25 s per run with the 20 s + 2 s defaults).
OVERHEAD_S = 3.0


@dataclass
class Result:
    load: str
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
    #: Open loop: actual send time minus scheduled time (waiting for a connection, or the
    #: client's event loop being late), per request; empty for the closed loop.
    lags_ns: list[int] = field(default_factory=list)
    #: Open loop: the requests scheduled in the window that were also answered in it.
    answered: int | None = None
    #: Open loop: the requests of the window scheduled while every connection was busy.
    pool_full: int = 0

    @property
    def rps(self) -> float:
        """Answers per second of the window. Open loop: the achieved rate, counting only
        the answers that came within the window (every request scheduled is answered
        in the end, so counting them all would give the scheduled rate whatever
        happened); it falls below ``--rate`` if the server or the client lags."""
        answered = len(self.latencies_ns) if self.answered is None else self.answered
        return answered / self.seconds

    def lag_ms(self, pct: float) -> float:
        return percentile(sorted(self.lags_ns), pct) / 1e6

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
    conn: Connection,
    port: int,
    concurrency: int,
    workers: int,
    t0: float,
    t1: float,
    rate: float | None = None,
) -> None:
    """Closed loop (``rate`` None): ``concurrency`` connections, each sending its next
    request when the last one answered, until the wall time ``t1``; records requests
    started after ``t0``. Open loop: requests scheduled every ``1 / rate`` s until ``t1``,
    each sent on the first free one of the ``concurrency`` connections (waiting in a
    queue if none is), its latency counted from its scheduled time; records requests
    scheduled after ``t0``.

    The connections are spread evenly over the server's workers: a worker accepts every
    connection that is pending when it wakes, so 16 connections opened at once often all
    land on one worker. A connection that lands on a worker that already has its share
    is closed and opened again (during the warm-up), so that every run has the same
    shape and both workers serve the load their scheduler shares the CPU with."""
    result = asyncio.run(_client(port, concurrency, workers, t0, t1, rate))
    conn.send(result)
    conn.close()


async def _client(
    port: int, concurrency: int, workers: int, t0: float, t1: float, rate: float | None
) -> dict[str, Any]:
    import httpx

    offset = time.perf_counter_ns() - time.time_ns()  # wall ns -> perf_counter ns
    start_ns = int(t0 * 1e9) + offset
    stop_ns = int(t1 * 1e9) + offset
    starts = array("q")
    latencies = array("q")
    lags = array("q")
    pids: Counter[int] = Counter()
    errors: list[str] = []
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    share = math.ceil(concurrency / workers)
    connections: Counter[int] = Counter()

    # One TLS context for all (unused on http://, but httpx builds one per client by
    # default, loading the CA bundle: ~60 ms of this event loop per connection opened).
    tls = ssl.create_default_context()

    def new_client() -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=30, verify=tls
        )

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
            await (requests(client) if rate is None else scheduled_requests(client))
        finally:
            await client.aclose()

    async def ping(client: httpx.AsyncClient) -> tuple[int, int] | None:
        """One ``GET /ping``: the answering worker's pid and when the answer came (ns);
        None once a failure is recorded (the benchmark then fails)."""
        try:
            response = await client.get("/ping")
            end = time.perf_counter_ns()
            if response.status_code != 200:
                errors.append(f"status {response.status_code}")
                return None
            return int(response.json()["pid"]), end
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            errors.append(repr(exc))
            return None

    async def requests(client: httpx.AsyncClient) -> None:
        while (begin := time.perf_counter_ns()) < stop_ns:
            answer = await ping(client)
            if answer is None:
                continue
            pid, end = answer
            if begin >= start_ns:
                starts.append(begin - start_ns)
                latencies.append(end - begin)
                pids[pid] += 1

    # Open loop: the scheduled send times (perf_counter ns), None to stop a connection.
    due_times: asyncio.Queue[int | None] = asyncio.Queue()
    in_flight = 0
    pool_full = 0  # requests of the window scheduled while every connection was busy

    async def dispatch(period_ns: float) -> None:
        """Put each request's scheduled time in the queue at that time. The schedule is
        absolute (``first + i * period``), so a late wake-up (this loop busy with
        answers) sends the overdue requests at once rather than shifting the rest."""
        nonlocal pool_full
        first = time.perf_counter_ns()
        i = 0
        while (due := first + int(i * period_ns)) < stop_ns:
            delay = due - time.perf_counter_ns()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            if due >= start_ns and in_flight + due_times.qsize() >= concurrency:
                pool_full += 1
            due_times.put_nowait(due)
            i += 1
        for _ in range(concurrency):
            due_times.put_nowait(None)

    async def scheduled_requests(client: httpx.AsyncClient) -> None:
        nonlocal in_flight
        while (due := await due_times.get()) is not None:
            begin = time.perf_counter_ns()
            in_flight += 1
            try:
                answer = await ping(client)
            finally:
                in_flight -= 1
            if answer is None:
                continue
            pid, end = answer
            if due >= start_ns:
                starts.append(due - start_ns)
                latencies.append(end - due)  # from the scheduled time: see client_main
                lags.append(begin - due)
                pids[pid] += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    tasks = [connection(i) for i in range(concurrency)]
    if rate is not None:
        tasks.append(dispatch(1e9 / rate))
    await asyncio.gather(*tasks)
    return {
        "starts": starts,
        "latencies": latencies,
        "lags": lags,
        "pool_full": pool_full,
        "pids": dict(pids),
        "connections": dict(connections),
        "errors": errors,
        "cpu_pct": 100 * (time.process_time() - cpu0) / (time.perf_counter() - wall0),
    }


# -- one run: a server, a load, a teardown --------------------------------------------
def run_once(
    load: str, variant: str, repeat: int, args: argparse.Namespace, tmp_root: Path
) -> Result:
    jobs, jitter, own_process = VARIANTS[variant]
    open_loop = load == "open"
    interval = float(args.every)
    tmp = Path(tempfile.mkdtemp(prefix=f"run{repeat}-", dir=tmp_root))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("ANARCHON_BACKEND",)}
    env.update(
        ANARCHON_ENABLED="1",
        ANARCHON_BENCH_JOBS=str(1 if own_process else jobs),
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
    alone: subprocess.Popen[bytes] | None = None
    if own_process:  # its own directory: its own SQLite file
        (tmp / "scheduler").mkdir()
        alone = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._fastapi_app"],
            env={**env, "ANARCHON_BENCH_JOBS": str(jobs)},
            cwd=tmp / "scheduler",
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp.glob("ready-*"))) < args.workers or (
            alone is not None and not list(tmp.glob("scheduler-ready-*"))
        ):
            failed = server.poll() is not None or (alone is not None and alone.poll() is not None)
            if failed or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{_tail(tmp)}")
            time.sleep(0.05)
        workers = children(server.pid) + ([alone.pid] if alone is not None else [])
        t0 = window_start(time.time(), args.warmup, interval)
        t1 = t0 + args.seconds
        ctx = mp.get_context("spawn")
        receive, send = ctx.Pipe(duplex=False)
        client = ctx.Process(
            target=client_main,
            args=(
                send,
                port,
                args.open_connections if open_loop else args.concurrency,
                args.workers,
                t0,
                t1,
                args.rate if open_loop else None,
            ),
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
        for proc in (server, alone):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
        for proc in (server, alone):
            if proc is not None:
                proc.wait(30)
        handler_runs = sum(int(p.read_text()) for p in tmp.glob("*runs-*"))
    finally:
        for proc in (server, alone):
            if proc is not None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()
    if got["errors"]:
        raise RuntimeError(f"{load} {variant}: failed requests: {got['errors'][:5]}\n{_tail(tmp)}")
    # Requests started (open loop: scheduled) within 1 s after a slot boundary (jitter
    # 0-500 ms, then the claims).
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
    answered = sum(
        st + lat < args.seconds * 1e9
        for st, lat in zip(got["starts"], got["latencies"], strict=True)
    )
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    return Result(
        load=load,
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
        lags_ns=list(got["lags"]),
        answered=answered if open_loop else None,
        pool_full=got.get("pool_full", 0),
    )


def _tail(tmp: Path) -> str:
    path = tmp / "server.log"
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


# -- report ---------------------------------------------------------------------------
def report(
    results: list[Result], load: str, variants: Sequence[str], args: argparse.Namespace
) -> None:
    """The tables of one load: each run, the ratios to the baseline per repeat, pooled."""
    results = [r for r in results if r.load == load]
    if not results:
        return
    open_loop = load == "open"
    rows = []
    for r in results:
        row: list[object] = [
            r.repeat + 1,
            r.variant,
            round(r.rps),
            r.pct_ms(50),
            r.pct_ms(99),
        ]
        if open_loop:
            row.append(r.pct_ms(99.9))
        row += [r.pct_ms(100), r.pct_ms(99, at_slot=True)]
        if open_loop:
            row += [r.lag_ms(99), 100 * r.pool_full / max(len(r.latencies_ns), 1)]
        row += [
            r.server_cpu_pct,
            r.client_cpu_pct,
            "/".join(str(n) for n in r.connections),
            "/".join(f"{100 * n / max(sum(r.split), 1):.0f}" for n in r.split),
            r.handler_runs,
        ]
        rows.append(row)
    if open_loop:
        shape = (
            f"OPEN loop at {args.rate:g} req/s scheduled "
            f"({getattr(args, 'rate_source', 'from --rate')}), latency from the scheduled "
            f"time, a pool of {args.open_connections} connections"
        )
        headers = ["#", "variant", "req/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms"]
        headers += ["p99 at slot", "send lag p99", "pool full %"]
    else:
        shape = f"CLOSED loop, {args.concurrency} connections"
        headers = ["#", "variant", "req/s", "p50 ms", "p99 ms", "max ms", "p99 at slot"]
    headers += ["server CPU %", "client CPU %", "conns", "req %", "runs"]
    print_table(
        f"{shape}; each run: {args.seconds:g} s measured (after >= {args.warmup:g} s "
        f"warm-up), uvicorn --workers {args.workers}",
        headers,
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
            f"{load} loop: {variant} / {BASELINE}, per repeat",
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
                lat[-1] / 1e6 if lat else math.nan,
                percentile(slot, 99) / 1e6,
                statistics.median(r.server_cpu_pct for r in mine),
                len(lat),
            ]
        )
    print_table(
        f"{load} loop: pooled over the repeats",
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
    if open_loop:
        lags = sorted(x for r in results for x in r.lags_ns)
        late = percentile(lags, 99) / 1e6
        if late > 5:
            print(
                f"  note: p99 send lag {late:.1f} ms: the client (sharing the CPU with the "
                "workers) or its pool did not keep the schedule; the latencies include that "
                "wait (see the docstring)"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="discarded seconds, at least")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument(
        "--load",
        choices=(*LOADS, "both"),
        default="both",
        help="closed loop, open loop or both, interleaved (default)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=16, help="closed loop: client connections"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="open loop: requests/s scheduled (default 0: half the req/s of a closed-loop "
        "idle probe run at the start)",
    )
    parser.add_argument(
        "--probe-seconds",
        type=float,
        default=5.0,
        help="measured seconds of that probe",
    )
    parser.add_argument(
        "--open-connections",
        type=int,
        default=128,
        help="open loop: the pool of keep-alive connections",
    )
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
    if args.rate < 0 or args.open_connections < 1 or args.probe_seconds <= 0:
        parser.error("--rate must be >= 0, --open-connections and --probe-seconds > 0")
    if args.seconds < 2 * args.every - 2 * EDGE_S:
        print(f"note: --seconds {args.seconds:g} holds fewer than two slot boundaries")
    loads = list(LOADS) if args.load == "both" else [args.load]
    runs = [(load, variant) for load in loads for variant in variants]
    per_run = args.seconds + args.warmup + OVERHEAD_S
    probe = "open" in loads and not args.rate
    expected = args.repeats * len(runs) * per_run
    if probe:
        expected += args.probe_seconds + args.warmup + OVERHEAD_S

    print(
        "fastapi_latency: an endpoint under load, the scheduler idle vs. 1,000 jobs "
        f"every {args.every} s in the same workers"
    )
    print(machine())
    print(
        f"{args.repeats} repeats x {len(runs)} runs ({' and '.join(loads)} loop x "
        f"{len(variants)} variants), ~{per_run:.0f} s each"
        f"{', after a rate probe' if probe else ''}: expect about {expected / 60:.1f} minutes"
    )
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="anarchon-bench-") as tmp_name:
        tmp = Path(tmp_name)
        print(f"temp files: {filesystem(tmp_name)}", flush=True)
        if probe:
            probe_args = argparse.Namespace(**{**vars(args), "seconds": args.probe_seconds})
            found = run_once("closed", BASELINE, -1, probe_args, tmp).rps
            args.rate = max(round(OPEN_FRACTION * found, -1), 10.0)
            args.rate_source = (
                f"{100 * OPEN_FRACTION:.0f} % of the {found:,.0f} req/s of a "
                f"{args.probe_seconds:g} s closed-loop {BASELINE} probe"
            )
            print(f"open-loop rate: {args.rate:g} req/s ({args.rate_source})", flush=True)
        results: list[Result] = []
        for k in range(args.repeats):
            order = runs[k % len(runs) :] + runs[: k % len(runs)]
            for load, variant in order:
                t = time.perf_counter()
                result = run_once(load, variant, k, args, tmp)
                results.append(result)
                lag = f", send lag p99 {result.lag_ms(99):.2f} ms" if result.lags_ns else ""
                print(
                    f"  repeat {k + 1} {load} {variant}: {result.rps:,.0f} req/s, "
                    f"p99 {result.pct_ms(99):.2f} ms{lag}, {result.handler_runs} runs "
                    f"({time.perf_counter() - t:.1f} s)",
                    flush=True,
                )
    print(f"all runs: {time.perf_counter() - start:.0f} s")
    for load in loads:
        report(results, load, variants, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
