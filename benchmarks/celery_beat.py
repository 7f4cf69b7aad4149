"""Stock ``celery beat`` against anarchon beats: what reaches a real broker, and when.

Real ``celery beat`` processes of a generated Celery app with ``--entries`` interval
entries (default 1,000 entries every 1 s, each sending the task ``bench.noop`` with no
arguments) publish to a Redis broker (``$ANARCHON_BENCH_CELERY_BROKER``, default
``redis://127.0.0.1:6379/12``; the test suites use databases 14 and 15). Variants, run
in one process, the ratio variants in rotating order ``--repeats`` times:

* ``send_task loop``: one process calling ``app.send_task`` in a bare loop (no beat, no
  schedule): the ceiling of this machine and broker;
* ``send_task floor``: one process that, at every boundary of the ``--every`` grid,
  publishes the ``--entries`` messages a beat sends at that boundary in a bare
  ``send_task`` loop, each stamped with the boundary as its nominal time: the least
  lateness any beat on this machine can reach when every entry is due at the same
  instant (as anarchon's slots are: on a grid counted from the epoch);
* ``stock beat x1`` / ``x2``: ``celery beat -S celery.beat:PersistentScheduler`` with a
  fresh schedule file, one or two processes;
* ``anarchon x1`` / ``x4``: ``celery beat -S anarchon`` on the Redis lease store
  (``$ANARCHON_BENCH_CELERY_STORE``, default ``redis://127.0.0.1:6379/11``, a fresh
  key prefix per run): the store several hosts would share, with a store clock;
* ``anarchon x1 sqlite``: one anarchon beat on the default store, SQLite (a fresh file);
* ``anarchon x4, one SIGKILLed``: four beats, one killed halfway through the window,
  0.6 s after a slot (while runs of that slot are being claimed and sent);
* ``light load``: ``--light-every`` (10 s) entries, the floor, stock x1, anarchon x1 and
  anarchon x4 with one SIGKILLed: the load is under the ceiling, so lateness shows the scheduler,
  not saturation, and a 10-s slot's horizon (10 s) outlives the killed beat's leases
  (6 s), so its in-flight runs are taken over.

All beats run on this one machine: four beats compete for its cores (on four hosts each
would have its own), and every beat claims every slot (a lost claim is one store round
trip), so the x4 runs measure the claim traffic as much as the sends.

Every beat runs with ``-l warning`` (beat's default). Each run waits until every beat
has published (among the newest messages of the queue), then ``--warmup`` seconds, then
measures a ``--window``-second window (whole seconds), then lets the beats run
``--settle`` more seconds (longer for the SIGKILL run, so takeovers after the lease
expires are seen), stops them and reads the broker queue (the Redis list) directly. A
``before_task_publish`` hook in the generated app stamps each message with the wall
time it was published and the sender's pid, and, for stock beat, its nominal time: the
due time beat itself computed, the sent entry's ``last_run_at + run_every`` (read from
beat's ``apply_async`` frame). For anarchon the
nominal time is the slot (the ``anarchon_slot`` header). Figures:

* ``sends/s``: messages published within the window / window;
* ``late p50/p99``: publish time - nominal time, over messages whose nominal time lies
  in the window. A beat's first candidate claims at the slot; a random jitter (up to
  min(500 ms, interval / 4)) is waited only where no ranking exists, e.g. before the
  first registry read. Stock beat's nominal time is its own: an entry comes due one
  interval after it was last sent, so its entries drift apart by the time each send
  took and never fall due together;
* ``beat CPU``: utime + stime of the beat processes (and their children) over the
  window, from ``/proc``, in % of one core, summed over the beats; ``CPU ms/send``: the
  same CPU time per message sent in the window (less sensitive to a busy machine);
* ``dup``: anarchon: sends of a (job, slot) beyond the first (a takeover re-send, same
  task id and attempt >= 2, is counted apart); stock beat has no run identity, so per
  entry the sends of every beat but the busiest one;
* ``attempt>=2 (re-sent)``: anarchon only: sends by a takeover (attempt >= 2), and in
  brackets those of them whose run had already been sent (same task id);
* ``missing``: anarchon only: (job, slot) pairs of the window never sent.

Run: ``python -m benchmarks celery_beat`` or ``python -m benchmarks.celery_beat
[--entries 1000 --every 1 --window 10 --repeats 3]`` (about 10 minutes with the defaults).
The ratio variants (loop, floor, stock x1, anarchon x1) run ``--repeats`` times in
rotating order; their lateness is also given per repeat, median (min-max).
Every process is killed and every key written is deleted at the end.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from ._util import machine, percentile, print_table, ratio_summary
from .fastapi_latency import children, cpu_ticks

ROOT = Path(__file__).resolve().parent.parent
BROKER_URL = os.environ.get("ANARCHON_BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/12")
STORE_URL = os.environ.get("ANARCHON_BENCH_CELERY_STORE", "redis://127.0.0.1:6379/11")
TICK = os.sysconf("SC_CLK_TCK")
#: Lease (3 x heartbeat, the default) plus two sweep periods: a takeover is seen by then.
TAKEOVER_S = 6 + 2 * 2 + 2
#: When the SIGKILL lands: this far after a slot, while that slot's runs are being sent.
KILL_INTO_SLOT_S = 0.6
#: Messages looked at (the newest) to tell that every beat is sending.
RECENT = 2000

#: The generated Celery app (``bench_app.py``), configured from the environment.
APP_SOURCE = '''\
"""Generated by benchmarks/celery_beat.py."""
import os
import sys
import time

from celery import Celery, signals

N = int(os.environ["BENCH_ENTRIES"])
EVERY = float(os.environ["BENCH_EVERY"])
app = Celery(os.environ["BENCH_NAMESPACE"])
app.conf.update(
    broker_url=os.environ["BENCH_BROKER"],
    task_default_queue=os.environ["BENCH_QUEUE"],
    broker_connection_retry_on_startup=True,
    enable_utc=True,
    timezone="UTC",
    result_expires=None,
    anarchon_backend=os.environ.get("BENCH_STORE", "memory://"),
    beat_schedule={
        f"e{i:04d}": {
            "task": "bench.noop",
            "schedule": EVERY,
            "options": {"headers": {"bench_entry": f"e{i:04d}"}},
        }
        for i in range(N)
    },
)


@signals.before_task_publish.connect
def stamp(headers=None, **_):
    headers["bench_sent"] = time.time()
    headers["bench_pid"] = os.getpid()
    if "anarchon_slot" in headers or "bench_nominal" in headers:
        return
    frame = sys._getframe(1)  # stock beat: the entry in Scheduler.apply_async
    while frame is not None:
        if frame.f_code.co_name == "apply_async" and "entry" in frame.f_locals:
            entry = frame.f_locals["entry"]
            due = entry.last_run_at.timestamp() + entry.schedule.run_every.total_seconds()
            headers["bench_nominal"] = due
            return
        frame = frame.f_back
'''


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str  # "loop" | "floor" | "stock" | "anarchon"
    beats: int = 1
    store: str = "redis"  # anarchon only: "redis" | "sqlite"
    kill: bool = False
    light: bool = False


LOOP = Variant("send_task loop (ceiling)", "loop")
FLOOR = Variant("send_task floor (burst per boundary)", "floor")
STOCK1 = Variant("stock beat x1", "stock")
ANARCHON1 = Variant("anarchon x1 (redis store)", "anarchon")
RATIO_VARIANTS = (LOOP, FLOOR, STOCK1, ANARCHON1)
ONCE_VARIANTS = (
    Variant("stock beat x2", "stock", beats=2),
    Variant("anarchon x1 (sqlite store)", "anarchon", store="sqlite"),
    Variant("anarchon x4 (redis store)", "anarchon", beats=4),
    Variant("anarchon x4, one SIGKILLed", "anarchon", beats=4, kill=True),
)
LIGHT_VARIANTS = (
    Variant(FLOOR.name, "floor", light=True),
    Variant("stock beat x1", "stock", light=True),
    Variant("anarchon x1 (redis store)", "anarchon", light=True),
    Variant("anarchon x4, one SIGKILLed", "anarchon", beats=4, kill=True, light=True),
)


@dataclass
class Result:
    variant: Variant
    every: float
    window: float
    sent_in_window: int
    lateness_s: list[float]
    cpu_s: float
    duplicates: int = 0
    takeover_resends: int = 0
    takeovers: int = 0
    per_sender: list[int] = field(default_factory=list)
    missing: int | None = None
    expected: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.sent_in_window / self.window

    @property
    def cpu_pct(self) -> float:
        return 100 * self.cpu_s / self.window

    @property
    def cpu_ms_per_send(self) -> float:
        return 1000 * self.cpu_s / self.sent_in_window if self.sent_in_window else math.nan

    def late_ms(self, pct: float) -> float:
        return percentile(sorted(self.lateness_s), pct) * 1000


def _tree_ticks(pid: int) -> int:
    return cpu_ticks(pid) + sum(cpu_ticks(c) for c in children(pid))


class Run:
    """One variant's processes, queue and store keys; everything is removed at close."""

    def __init__(self, variant: Variant, tmp: Path, entries: int, every: float) -> None:
        self.variant = variant
        self.tmp = tmp
        self.tag = uuid.uuid4().hex[:8]
        self.queue = f"celerybench-{self.tag}"
        self.prefix = f"celerybench-{self.tag}"
        self.namespace = f"celerybench{self.tag}"
        self.broker = redis.Redis.from_url(BROKER_URL)
        store = f"{STORE_URL}?prefix={self.prefix}"
        if variant.store == "sqlite":
            store = f"sqlite:///{tmp / f'{self.tag}.sqlite3'}"
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tmp), str(ROOT)]),
            "BENCH_ENTRIES": str(entries),
            "BENCH_EVERY": str(every),
            "BENCH_NAMESPACE": self.namespace,
            "BENCH_BROKER": BROKER_URL,
            "BENCH_QUEUE": self.queue,
            "BENCH_STORE": store,
        }
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.tmp / f"{self.tag}-{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=self.tmp,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def start_beats(self) -> None:
        scheduler = (
            "anarchon" if self.variant.kind == "anarchon" else "celery.beat:PersistentScheduler"
        )
        for i in range(self.variant.beats):
            schedule = str(self.tmp / f"{self.tag}-{i}-schedule")
            argv = [sys.executable, "-m", "celery", "-A", "bench_app", "beat", "-S", scheduler]
            argv += ["-s", schedule, "-l", "warning"]
            self.spawn(f"beat{i}", argv)

    def start_loop(self, start: float, seconds: float) -> None:
        argv = [sys.executable, "-m", "benchmarks.celery_beat", "--loop-child"]
        self.spawn("loop", [*argv, f"{start:.3f}", f"{seconds:.3f}"])

    def start_floor(self, start: float, seconds: float, every: float) -> None:
        argv = [sys.executable, "-m", "benchmarks.celery_beat", "--floor-child"]
        self.spawn("floor", [*argv, f"{start:.3f}", f"{seconds:.3f}", f"{every:g}"])

    def wait_all_sending(self, timeout: float = 120) -> None:
        """Until every beat has published (stock x2 and anarchon x4: each sends some)."""
        deadline = time.monotonic() + timeout
        while True:
            recent = self.broker.lrange(self.queue, 0, RECENT - 1)  # LPUSH: newest first
            senders = {json.loads(raw)["headers"]["bench_pid"] for raw in recent}
            if len(senders) >= len(self.procs):
                return
            dead = [p for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(p.read_text()[-2000:] for p in self.tmp.glob(f"{self.tag}-*.log"))
                raise RuntimeError(
                    f"{self.variant.name}: {len(senders)} of {len(self.procs)} beats sent\n{logs}"
                )
            time.sleep(0.5)

    def messages(self) -> list[dict[str, Any]]:
        """The headers (plus ``id``) of every message in the queue, decoded."""
        found = []
        for raw in self.broker.lrange(self.queue, 0, -1):
            message = json.loads(raw)
            headers = dict(message["headers"])
            if message.get("properties", {}).get("body_encoding") == "base64":
                base64.b64decode(message["body"])  # decodable: a real Celery message
            found.append(headers)
        return found

    def close(self) -> None:
        for proc in self.procs:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for key in self.broker.scan_iter(match=f"*{self.queue}*"):
            self.broker.delete(key)
        self.broker.close()
        store = redis.Redis.from_url(STORE_URL)
        for key in store.scan_iter(match=f"{self.prefix}*", count=1000):
            store.delete(key)
        store.close()


def _sleep_until(wall: float) -> None:
    time.sleep(max(0.0, wall - time.time()))


def run_variant(variant: Variant, tmp: Path, args: argparse.Namespace) -> Result:
    every = args.light_every if variant.light else args.every
    window = args.window * 2 if variant.light else args.window
    entries = args.entries
    run = Run(variant, tmp, entries, every)
    try:
        if variant.kind == "loop":
            start = math.ceil(time.time()) + 3.0
            run.start_loop(start - args.warmup, window + args.warmup + 1)
        elif variant.kind == "floor":
            start = math.ceil(time.time()) + 3.0
            run.start_floor(start - args.warmup, window + args.warmup + 1, every)
        else:
            run.start_beats()
            run.wait_all_sending()
            start = math.ceil(time.time() + args.warmup)
        end = start + window
        _sleep_until(start)
        ticks0 = {p.pid: _tree_ticks(p.pid) for p in run.procs}
        last = dict(ticks0)
        killed = None
        if variant.kill:  # into a slot: runs of that slot in flight
            _sleep_until(start + math.ceil(window / 2 / every) * every + KILL_INTO_SLOT_S)
            killed = run.procs[0]
            last[killed.pid] = _tree_ticks(killed.pid)
            os.killpg(killed.pid, signal.SIGKILL)
        _sleep_until(end)
        for p in run.procs:
            if p is not killed:
                last[p.pid] = _tree_ticks(p.pid)
        cpu_s = sum(last[pid] - ticks0[pid] for pid in ticks0) / TICK
        if variant.kind in ("loop", "floor"):
            run.procs[0].wait(30 + every)
        else:
            time.sleep(TAKEOVER_S if variant.kill else args.settle)
            for p in run.procs:
                with suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGSTOP)  # freeze the queue before reading it
        messages = run.messages()
    finally:
        run.close()
    return analyse(variant, messages, start, end, every, cpu_s, run.namespace, entries)


def analyse(
    variant: Variant,
    messages: list[dict[str, Any]],
    start: float,
    end: float,
    every: float,
    cpu_s: float,
    namespace: str,
    entries: int,
) -> Result:
    in_window = [m for m in messages if start <= m["bench_sent"] < end]
    result = Result(variant, every, end - start, len(in_window), [], cpu_s)
    result.per_sender = sorted(Counter(m["bench_pid"] for m in in_window).values(), reverse=True)
    if variant.kind == "loop":
        return result
    if variant.kind == "floor":
        result.lateness_s = [
            m["bench_sent"] - m["bench_nominal"]
            for m in messages
            if start <= m["bench_nominal"] < end
        ]
        return result
    if variant.kind == "stock":
        per_entry: dict[str, Counter[int]] = defaultdict(Counter)
        for m in messages:
            nominal = m.get("bench_nominal")
            if nominal is None:
                continue
            if start <= nominal < end:
                result.lateness_s.append(m["bench_sent"] - nominal)
            if start <= m["bench_sent"] < end:
                per_entry[m["bench_entry"]][m["bench_pid"]] += 1
        result.duplicates = sum(
            sum(counts.values()) - max(counts.values()) for counts in per_entry.values()
        )
        return result
    seen: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for m in messages:
        slot = int(m["anarchon_slot"])
        seen[(m["anarchon_job"], slot)].append(m)
        if start <= slot / 1000 < end:
            result.lateness_s.append(m["bench_sent"] - slot / 1000)
            result.takeovers += int(m["anarchon_attempt"]) >= 2
    every_ms = round(every * 1000)
    first = math.ceil(start * 1000 / every_ms) * every_ms
    slots = range(first, round(end * 1000), every_ms)
    wanted = {(f"{namespace}:e{i:04d}", s) for i in range(entries) for s in slots}
    result.expected = len(wanted)
    result.missing = len(wanted - set(seen))
    for run, sends in seen.items():
        if run not in wanted or len(sends) < 2:
            continue
        ids = {m["id"] for m in sends}
        resend = len(ids) == 1 and max(int(m["anarchon_attempt"]) for m in sends) >= 2
        if resend:
            result.takeover_resends += len(sends) - 1
        else:
            result.duplicates += len(sends) - 1
    return result


def loop_child(start: float, seconds: float) -> None:
    """The ceiling: ``app.send_task`` in a bare loop, as fast as it goes."""
    import bench_app  # type: ignore[import-not-found]  # generated in the run's directory

    app = bench_app.app
    names = [f"e{i:04d}" for i in range(bench_app.N)]
    _sleep_until(start)
    end, i = start + seconds, 0
    with app.producer_or_acquire() as producer:
        while time.time() < end:
            name = names[i % len(names)]
            headers = {"bench_entry": name, "celery_beat_task": True}
            app.send_task("bench.noop", (), {}, headers=headers, producer=producer)
            i += 1


def floor_child(start: float, seconds: float, every: float) -> None:
    """The floor: at each boundary of the ``every`` grid, the entries a beat sends then,
    published in a bare loop, each stamped with the boundary."""
    import bench_app  # type: ignore[import-not-found]  # generated in the run's directory

    app = bench_app.app
    names = [f"e{i:04d}" for i in range(bench_app.N)]
    boundary = math.ceil(start / every) * every
    with app.producer_or_acquire() as producer:
        while boundary < start + seconds:
            _sleep_until(boundary)
            for name in names:
                headers = {"bench_entry": name, "celery_beat_task": True, "bench_nominal": boundary}
                app.send_task("bench.noop", (), {}, headers=headers, producer=producer)
            boundary += every


def report(results: dict[str, list[Result]], args: argparse.Namespace) -> None:
    def row(label: str, rs: list[Result]) -> tuple[Any, ...]:
        rate = statistics.median(r.rate for r in rs)
        late = [x for r in rs for x in r.lateness_s]
        p50 = percentile(sorted(late), 50) * 1000 if late else math.nan
        p99 = percentile(sorted(late), 99) * 1000 if late else math.nan
        cpu = statistics.median(r.cpu_pct for r in rs)
        per_send = statistics.median(r.cpu_ms_per_send for r in rs)
        kind = rs[0].variant.kind
        dup = sum(r.duplicates for r in rs) if kind not in ("loop", "floor") else "n/a"
        resend = (
            f"{sum(r.takeovers for r in rs)} ({sum(r.takeover_resends for r in rs)})"
            if kind == "anarchon"
            else "n/a"
        )
        missing = (
            f"{sum(r.missing or 0 for r in rs)}/{sum(r.expected or 0 for r in rs)}"
            if kind == "anarchon"
            else "n/a"
        )
        return (label, len(rs), rate, p50, p99, cpu, per_send, dup, resend, missing)

    headers = (
        "variant",
        "runs",
        "sends/s (median)",
        "late p50 ms",
        "late p99 ms",
        "beat CPU %",
        "CPU ms/send",
        "dup",
        "attempt>=2 (re-sent)",
        "missing/slots",
    )
    heavy = [row(name, rs) for name, rs in results.items() if not name.startswith("light")]
    if heavy:
        print_table(
            f"{args.entries} entries every {args.every:g} s, {args.window:g}-s windows "
            f"(lateness pooled over runs; CPU: % of one core, all beats together)",
            headers,
            heavy,
        )
    light = [
        row(name[len("light ") :], rs) for name, rs in results.items() if name.startswith("light")
    ]
    if light:
        print_table(
            f"light load: {args.entries} entries every {args.light_every:g} s, "
            f"{2 * args.window:g}-s windows (anarchon's jitter bound: "
            f"{min(500, args.light_every * 1000 / 4):.0f} ms)",
            headers,
            light,
        )
    if not all(v.name in results for v in RATIO_VARIANTS):
        return
    loop, floor, stock, ours = (results[v.name] for v in RATIO_VARIANTS)
    report_lateness(floor, stock, ours)
    ceiling = [a.rate / b.rate for a, b in zip(ours, loop, strict=True)]
    vs_stock = [a.rate / b.rate for a, b in zip(ours, stock, strict=True)]
    stock_ceiling = [a.rate / b.rate for a, b in zip(stock, loop, strict=True)]
    offered = args.entries / args.every
    print_table(
        f"sends/s ratios, per repeat (offered load {offered:,.0f}/s)",
        ("ratio", "median (min-max, n)"),
        [
            ("anarchon x1 / send_task loop", ratio_summary(ceiling)),
            ("anarchon x1 / stock beat x1", ratio_summary(vs_stock)),
            ("stock beat x1 / send_task loop", ratio_summary(stock_ceiling)),
        ],
    )


def _spread(values: Sequence[float]) -> str:
    """``median (min-max, n=N)`` of per-repeat figures."""
    if not values:
        return "n/a"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f}, n={len(values)})"


def report_lateness(floor: list[Result], stock: list[Result], ours: list[Result]) -> None:
    """Lateness per repeat of the ratio variants, and anarchon's against the floor and
    stock beat of the same repeat."""
    rows = [
        (
            r[0].variant.name,
            _spread([x.late_ms(50) for x in r]),
            _spread([x.late_ms(99) for x in r]),
        )
        for r in (floor, stock, ours)
    ]
    pairs = list(zip(ours, floor, stock, strict=True))
    rows.append(
        (
            "anarchon x1 - floor (same repeat)",
            _spread([a.late_ms(50) - f.late_ms(50) for a, f, _ in pairs]),
            _spread([a.late_ms(99) - f.late_ms(99) for a, f, _ in pairs]),
        )
    )
    rows.append(
        (
            "anarchon x1 - stock beat x1 (same repeat)",
            _spread([a.late_ms(50) - st.late_ms(50) for a, _, st in pairs]),
            _spread([a.late_ms(99) - st.late_ms(99) for a, _, st in pairs]),
        )
    )
    print_table(
        "lateness per repeat, ms: median (min-max, n)",
        ("variant", "late p50 ms", "late p99 ms"),
        rows,
    )


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--loop-child"]:
        loop_child(float(argv[1]), float(argv[2]))
        return
    if argv[:1] == ["--floor-child"]:
        floor_child(float(argv[1]), float(argv[2]), float(argv[3]))
        return
    parser = argparse.ArgumentParser(prog="python -m benchmarks.celery_beat", description=__doc__)
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--every", type=float, default=1.0, help="interval of each entry, s")
    parser.add_argument("--light-every", type=float, default=10.0, help="light-load interval")
    parser.add_argument("--window", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--settle", type=float, default=4.0, help="seconds run after a window")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the ratio variants")
    parser.add_argument(
        "--only", choices=("ratios", "once", "light"), action="append", help="variant groups"
    )
    args = parser.parse_args(argv)
    groups = args.only or ["ratios", "once", "light"]
    print(f"== celery beat ==\n{machine()}")
    print(f"broker: {BROKER_URL}  anarchon store: {STORE_URL} (lease), sqlite for the sqlite run")
    results: dict[str, list[Result]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="celerybench-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "bench_app.py").write_text(APP_SOURCE)
        plan: list[tuple[str, Variant]] = []
        if "ratios" in groups:
            for rep in range(args.repeats):
                turn = rep % len(RATIO_VARIANTS)
                order = RATIO_VARIANTS[turn:] + RATIO_VARIANTS[:turn]
                plan += [(v.name, v) for v in order]
        if "once" in groups:
            plan += [(v.name, v) for v in ONCE_VARIANTS]
        if "light" in groups:
            plan += [(f"light {v.name}", v) for v in LIGHT_VARIANTS]
        for label, variant in plan:
            t0 = time.perf_counter()
            result = run_variant(variant, tmp, args)
            results[label].append(result)
            print(
                f"  {label}: {result.rate:,.0f} sends/s, late p50 {result.late_ms(50):.0f} ms "
                f"p99 {result.late_ms(99):.0f} ms, CPU {result.cpu_pct:.0f} %, dup "
                f"{result.duplicates}, takeovers {result.takeovers} (re-sent "
                f"{result.takeover_resends}), missing "
                f"{result.missing}, sends per process {result.per_sender} "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    ordered = {label: results[label] for label in dict.fromkeys(label for label, _ in plan)}
    report(ordered, args)


if __name__ == "__main__":
    main()
