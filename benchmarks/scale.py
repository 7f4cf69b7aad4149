"""Scale: one timer, batched claims and k candidates: what a slot costs as replicas grow.

Three sections:

1. **Real processes.** ``--procs`` N OS processes (``multiprocessing`` spawn), each one
   ``anarchon_core.Scheduler`` with the same ``--jobs`` J jobs ``every(--every)``, on
   each of ``--stores`` (an isolated, empty store per run: a temp SQLite file, a fresh
   PostgreSQL database, a fresh Redis key prefix ``?strategy=lease``). Async handlers
   append ``(job, slot, attempt, start, jitter)`` to a list written at the end. Judged
   are the slots of a window that starts after two registry refreshes (every view of
   the registry is complete) and ends before the last slots' claims could still be
   waiting; every figure below is a delta over that window:

   * runs per slot (must be exactly 1), slots missed, slots run twice;
   * claims sent per run (``Scheduler.stats`` ``claim_*`` deltas, summed over the
     processes), claim requests (``claim_many`` round trips) and registry reads,
     counted by a wrapper around each process's backend; the largest registry entry and
     one whole registry read in bytes, read from the store at the end of the window;
   * what the store did per run, counted at the server: Redis ``INFO commandstats``
     (scripts and the commands they call) and ``INFO cpu``; PostgreSQL
     ``pg_stat_database`` transactions of the run's database, calls of the backend's
     claim functions (``pg_stat_user_functions`` with ``track_functions=pl`` set on
     the benchmark's connections), and the CPU of its server processes (``/proc``);
     SQLite has no server: the client-side counts are all there is;
   * lateness (handler start - slot, which includes the jitter waited; and the same
     minus ``ctx.jitter_ms``), and the CPU of each process (``getrusage``: user + sys
     seconds per second of the window).

2. **Virtual time.** Many schedulers on one in-memory store on a looptime event loop
   (as ``tests/virtual.py``): the protocol without processes. Claims per run and runs
   per slot are counted by the store per slot; the wall time per virtual second shows
   what each instance pays per run and per registry read.

3. **Arithmetic** for 1,000 replicas x 100,000 jobs ``every("1m")``: claims per second
   with k candidates against every instance claiming, and the registry traffic (each
   instance registers its ``InstanceInfo``, which lists each job's store name and
   fingerprint, and, with k set, reads every instance's every heartbeat), from one
   InstanceInfo measured with ``anarchon_core.backend.instance_json``.

Run: ``python -m benchmarks scale`` (defaults, about 4-5 minutes), or with options
``python -m benchmarks.scale --procs 2,8,32 --every 1s,1s,10s --jobs 1000
--seconds 30 --stores sqlite,postgres,redis --candidates 2``; ``--quick`` for a smoke
run of under a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing as mp
import os
import secrets
import statistics
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from ._scale_worker import job_names, real_child, virtual_child
from ._util import machine, percentile, print_table

POSTGRES_URL = os.environ.get(
    "ANARCHON_BENCH_POSTGRES",
    os.environ.get("ANARCHON_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"),
)
REDIS_URL = os.environ.get(
    "ANARCHON_BENCH_REDIS", os.environ.get("ANARCHON_TEST_REDIS", "redis://127.0.0.1:6379/0")
)
STORES = ("sqlite", "postgres", "redis")
HEARTBEAT_MS = 2000  # the engine's default: the registry is read this often
#: Snapshots are taken this long before a slot boundary, after the previous slot's claims.
MARK_BEFORE_MS = 200
#: The cluster for the arithmetic section.
ARITH_REPLICAS = 1000
ARITH_JOBS = 100_000
ARITH_INTERVAL_S = 60


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _cpu_pressure_us() -> int | None:
    """Microseconds some runnable task waited for a CPU, since boot (Linux PSI)."""
    try:
        with open("/proc/pressure/cpu", encoding="ascii") as psi:
            return int(psi.readline().rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


def _interval_ms(every: str) -> int:
    from anarchon_core.durations import parse_duration_ms

    return parse_duration_ms(every)


# -- stores ----------------------------------------------------------------------------
@dataclass
class Store:
    """One isolated store for one run, and how to read its server-side counters."""

    name: str
    cfg: dict[str, Any]  # what a worker needs to build its backend
    description: str
    counters: Any = None  # .snapshot() -> dict, .close()


class RedisCounters:
    """``INFO commandstats`` and ``INFO cpu`` of the whole server (others' traffic too)."""

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5)

    def snapshot(self) -> dict[str, Any]:
        stats = self.client.info("commandstats")
        cpu = self.client.info("cpu")
        commands = {
            key.removeprefix("cmdstat_"): (value["calls"], value["usec"])
            for key, value in stats.items()
        }
        return {"commands": commands, "cpu": cpu["used_cpu_sys"] + cpu["used_cpu_user"]}

    @staticmethod
    def delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
        calls = usec = scripts = 0
        for name, (c, u) in b["commands"].items():
            c0, u0 = a["commands"].get(name, (0, 0))
            if name in ("info",):  # the benchmark's own sampling
                continue
            calls += c - c0
            usec += u - u0
            if name in ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"):
                scripts += c - c0
        return {
            "commands": calls,
            "scripts": scripts,
            "usec": usec,
            "cpu_s": b["cpu"] - a["cpu"],
        }

    def close(self) -> None:
        self.client.close()


class PostgresCounters:
    """The run database's transactions, claim-function calls and server-process CPU."""

    def __init__(self, conninfo: str, dbname: str, prefix: str) -> None:
        import psycopg

        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.dbname = dbname
        self.prefix = prefix
        self.tick = os.sysconf("SC_CLK_TCK")

    def _cpu_of(self, pids: Sequence[int]) -> dict[int, float]:
        out = {}
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[pid] = (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime
        return out

    def snapshot(self) -> dict[str, Any]:
        with self.conn.transaction():
            db = self.conn.execute(
                "SELECT xact_commit + xact_rollback, tup_inserted, tup_updated, tup_deleted,"
                " tup_returned FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
            funcs: dict[str, int] = dict(
                self.conn.execute("SELECT funcname, calls FROM pg_stat_user_functions").fetchall()
            )
            pids = [
                r[0]
                for r in self.conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid()"
                ).fetchall()
            ]
        assert db is not None
        return {
            "xacts": db[0],
            "tup_written": db[1] + db[2] + db[3],
            "tup_returned": db[4],
            "funcs": funcs,
            "cpu": self._cpu_of(pids),
        }

    def delta(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
        def calls(suffix: str) -> int:
            # The functions are named prefix + kind + "_" + a hash of the layout.
            def kind(name: str) -> bool:
                rest = name.removeprefix(self.prefix)
                return rest != name and rest.rsplit("_", 1)[0] == suffix

            return int(
                sum(v for n, v in b["funcs"].items() if kind(n))
                - sum(v for n, v in a["funcs"].items() if kind(n))
            )

        cpu = sum(v - a["cpu"].get(pid, 0.0) for pid, v in b["cpu"].items())
        return {
            "xacts": b["xacts"] - a["xacts"] - 1,  # minus the snapshot's own transaction
            "tup_written": b["tup_written"] - a["tup_written"],
            "claim_fn": calls("claim"),
            "claim_many_fn": calls("claim_many"),
            "cpu_s": cpu,
        }

    def close(self) -> None:
        self.conn.close()


def _with_params(url: str, **params: str) -> str:
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


def _with_db(url: str, dbname: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + dbname))


def _masked(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{parts.port}", query=""))


@contextlib.contextmanager
def open_store(name: str, tmp: Path, procs: int, pg_pool: int | None) -> Iterator[Store]:
    """An isolated, empty store ``name`` for one run; removed afterwards."""
    run_id = secrets.token_hex(3)
    if name == "sqlite":
        path = tmp / f"scale-{run_id}.sqlite3"
        yield Store(
            name,
            {"store": name, "url": f"sqlite:///{path}", "run_id": run_id},
            f"SQLite file {path.name} (WAL, one file shared by the processes)",
        )
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.unlink(str(path) + suffix)
    elif name == "postgres":
        import psycopg
        from psycopg import sql

        dbname = f"anarchon_scale_{run_id}"
        with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
            version = conn.execute("SHOW server_version").fetchone()
        # track_functions on the benchmark's own connections only (a superuser setting).
        conninfo = _with_params(_with_db(POSTGRES_URL, dbname), options="-c track_functions=pl")
        pool = pg_pool or max(1, min(4, 80 // procs))
        counters = PostgresCounters(_with_db(POSTGRES_URL, dbname), dbname, "anarchon_")
        try:
            yield Store(
                name,
                {
                    "store": name,
                    "conninfo": conninfo,
                    "schema": "public",
                    "pg_pool": pool,
                    "run_id": run_id,
                },
                f"PostgreSQL {version[0] if version else '?'} at {_masked(POSTGRES_URL)}, "
                f"fresh database {dbname}, pool max_size={pool} per process",
                counters,
            )
        finally:
            counters.close()
            with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(dbname)
                    )
                )
    elif name == "redis":
        import redis

        prefix = f"anarchon-scale-{run_id}"
        url = _with_params(REDIS_URL, strategy="lease", prefix=prefix)
        rcounters = RedisCounters(REDIS_URL)
        version = rcounters.client.info("server").get("redis_version", "?")
        try:
            yield Store(
                name,
                {"store": name, "url": url, "run_id": run_id},
                f"Redis {version} at {_masked(REDIS_URL)} (shared server), lease strategy, "
                f"key prefix {prefix}",
                rcounters,
            )
        finally:
            rcounters.close()
            with redis.Redis.from_url(REDIS_URL, socket_timeout=10) as client:
                keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
                for start in range(0, len(keys), 500):
                    client.delete(*keys[start : start + 500])
    else:
        raise ValueError(f"unknown store {name!r}: choose from {', '.join(STORES)}")


async def _registry_sizes(cfg: dict[str, Any]) -> tuple[int, int]:
    """The largest registry entry and one whole registry read, in bytes of JSON, as the
    store holds them while the processes run (read once, after the window's last mark)."""
    from anarchon_core.backend import instance_json

    from ._scale_worker import _backend

    backend = _backend(cfg)
    try:
        await backend.open()
        live = await backend.instances()
    except Exception:  # a store without a registry
        return 0, 0
    finally:
        await backend.close()
    sizes = [len(instance_json(info).encode()) for info in live]
    return max(sizes, default=0), sum(sizes)


async def _prepare(cfg: dict[str, Any]) -> None:
    """Create the store's layout once, before the processes race to."""
    from ._scale_worker import _backend

    backend = _backend(cfg)
    await backend.open()
    await backend.close()


# -- one real run ----------------------------------------------------------------------
@dataclass
class RealResult:
    store: str
    procs: int
    jobs: int
    every: str
    candidates: int | None
    slots: int = 0
    due: int = 0
    executions: int = 0
    missed: int = 0
    twice: int = 0
    claims: int = 0
    won: int = 0
    requests: int = 0
    registry_reads: int = 0
    registry_ms: float = math.nan
    window_s: float = 0.0
    lateness: list[int] = field(default_factory=list)
    beyond_jitter: list[int] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    server: dict[str, float] = field(default_factory=dict)
    description: str = ""
    start_up_s: float = 0.0
    calls: dict[str, float] = field(default_factory=dict)
    #: Share of the window in which some runnable task on the host waited for a CPU.
    pressure: float = math.nan
    #: Scheduler.stats deltas over the window, summed over the processes.
    events: dict[str, int] = field(default_factory=dict)
    #: The largest registry entry and one whole registry read (every live entry), bytes.
    entry_bytes: int = 0
    read_bytes: int = 0
    error: str = ""


def run_real(
    store_name: str,
    procs: int,
    jobs: int,
    every: str,
    seconds: float,
    candidates: int | None,
    tmp: Path,
    pg_pool: int | None,
) -> RealResult:
    result = RealResult(store_name, procs, jobs, every, candidates)
    interval = _interval_ms(every)
    with open_store(store_name, tmp, procs, pg_pool) as store:
        result.description = store.description
        cfg = {**store.cfg, "jobs": jobs, "every": every, "candidates": candidates}
        asyncio.run(_prepare(cfg))
        ctx = mp.get_context("spawn")
        ready, go = ctx.Barrier(procs + 1), ctx.Barrier(procs + 1)
        times = ctx.Array("q", 4)
        outs = [str(tmp / f"{store.cfg['run_id']}-{i}.json") for i in range(procs)]
        workers = [
            ctx.Process(target=real_child, args=(cfg, i, ready, go, times, outs[i]), daemon=True)
            for i in range(procs)
        ]
        t_spawn = time.perf_counter()
        for w in workers:
            w.start()
        try:
            ready.wait(timeout=60 + 5 * procs)
            result.start_up_s = time.perf_counter() - t_spawn
            start_ms = _wall_ms() + 1000
            warm = 2 * HEARTBEAT_MS + 1000  # two registry reads: every view is complete
            first = -(-(start_ms + warm) // interval) * interval
            stop_ms = start_ms + int(seconds * 1000)
            tail = min(interval // 4, 500) + 250 + 1500  # jitter, the watcher, a margin
            end = (stop_ms - tail) // interval * interval
            if end <= first:
                raise SystemExit(
                    f"--seconds {seconds:g} is too short for --every {every}: no slot would "
                    f"be judged (warm-up {warm} ms, tail {tail} ms)"
                )
            mark_a, mark_b = first - MARK_BEFORE_MS, end - MARK_BEFORE_MS
            times[:] = [start_ms, mark_a, mark_b, stop_ms]
            go.wait(timeout=30)
            snaps, psi = [], []
            for mark in (mark_a, mark_b):
                time.sleep(max(mark - _wall_ms(), 0) / 1000)
                snaps.append(store.counters.snapshot() if store.counters else None)
                psi.append(_cpu_pressure_us())
            if psi[0] is not None and psi[1] is not None:
                result.pressure = (psi[1] - psi[0]) / 1000 / (mark_b - mark_a)
            result.entry_bytes, result.read_bytes = asyncio.run(_registry_sizes(cfg))
            for w in workers:
                w.join(timeout=max(stop_ms - _wall_ms(), 0) / 1000 + 60)
            bad = [w.exitcode for w in workers if w.exitcode != 0]
            if bad:
                raise RuntimeError(f"{len(bad)} worker(s) failed, exit codes {bad}")
        finally:
            for w in workers:
                if w.is_alive():
                    w.kill()
                    w.join(5)
        outputs = [json.loads(Path(o).read_text()) for o in outs]
        for o in outs:
            os.unlink(o)
        _judge(result, outputs, range(first, end, interval))
        if store.counters and snaps[0] is not None:
            result.server = store.counters.delta(snaps[0], snaps[1])
    return result


def _judge(result: RealResult, outputs: list[dict[str, Any]], slots: range) -> None:
    """Runs per slot, lateness, claims and CPU over the judged window."""
    lo, hi = slots.start, slots.stop
    counts: Counter[tuple[int, int]] = Counter()
    for out in outputs:
        for job, slot, _attempt, start, jitter in out["records"]:
            if lo <= slot < hi:
                counts[job, slot] += 1
                result.lateness.append(start - slot)
                result.beyond_jitter.append(start - slot - jitter)
    result.lateness.sort()
    result.beyond_jitter.sort()
    result.slots = len(slots)
    result.due = len(slots) * result.jobs
    result.executions = sum(counts.values())
    result.missed = sum(1 for j in range(result.jobs) for s in slots if counts[j, s] == 0)
    result.twice = sum(1 for c in counts.values() if c > 1)
    calls: Counter[str] = Counter()
    events: Counter[str] = Counter()
    registry_s = 0.0
    for out in outputs:
        a, b = out["snapshots"]
        for key, value in b["stats"].items():
            events[key] += value - a["stats"].get(key, 0)
        for key, value in b["stats"].items():
            if key.startswith("claim_"):
                result.claims += value - a["stats"].get(key, 0)
        result.won += b["stats"].get("claim_won", 0) - a["stats"].get("claim_won", 0)
        for key, value in b["calls"].items():
            calls[key] += value - a["calls"].get(key, 0)
        registry_s += b["seconds"]["instances"] - a["seconds"]["instances"]
        window = (b["t"] - a["t"]) / 1000
        result.cpu.append((b["cpu"] - a["cpu"]) / window)
        result.window_s = window
    result.requests = calls["claim_many"] + calls["claim"]
    result.registry_reads = calls["instances"]
    if calls["instances"]:
        result.registry_ms = 1000 * registry_s / calls["instances"]
    result.calls = dict(calls)
    result.events = {key: value for key, value in sorted(events.items()) if value}


# -- virtual time ----------------------------------------------------------------------
def run_virtual_child(cfg: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """One virtual cluster in a fresh process (its memory is freed afterwards)."""
    out = tmp / f"virtual-{secrets.token_hex(3)}.json"
    proc = mp.get_context("spawn").Process(target=virtual_child, args=(cfg, str(out)))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"virtual run {cfg} failed with exit code {proc.exitcode}")
    result: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    return result


def role_cost_us(instances: int, k: int = 2, calls: int = 20_000) -> float:
    """CPU µs of one ``Candidates.turn`` with a view of ``instances`` (what each instance
    computes for every run of every job)."""
    from anarchon_core.engine.candidates import Candidates

    names = [f"scale.{i:06d}" for i in range(100)]
    view = Candidates(k, "me-0", stale_after_ms=10**12)
    view.update({f"me-{i}": dict.fromkeys(names, "fp") for i in range(instances)}, 0)
    t0 = time.process_time()
    for n in range(calls):
        view.turn(names[n % 100], "fp", (n // 100) * 1000, 0)
    return (time.process_time() - t0) * 1e6 / calls


# -- the arithmetic --------------------------------------------------------------------
def registry_figures(jobs: int) -> dict[str, float]:
    """Bytes, encode and decode time and decoded memory of one InstanceInfo with ``jobs``,
    as an engine builds it (each job's store name and fingerprint)."""
    from anarchon_core import Scheduler
    from anarchon_core.backend import InstanceInfo, instance_json
    from anarchon_core.engine.registry import job_digest

    scheduler = Scheduler("memory://")

    async def handler(ctx: Any) -> None:
        return None

    for name in job_names(jobs):
        scheduler.every(name, f"{ARITH_INTERVAL_S}s", handler)
    info = InstanceInfo(
        instance_id="host-0123:12345:abcdef",
        host="host-0123",
        pid=12345,
        version="0.0.0",
        started_at=_wall_ms(),
        last_seen=_wall_ms(),
        jobs=job_digest(scheduler.jobs.values()),
    )
    t0 = time.perf_counter()
    text = instance_json(info)
    encode = time.perf_counter() - t0
    decode = math.inf
    for _ in range(3):  # the best of three: the collector may run during one
        t0 = time.perf_counter()
        decoded = InstanceInfo.from_json(json.loads(text))
        decode = min(decode, time.perf_counter() - t0)
        del decoded
    tracemalloc.start()  # the memory a decoded InstanceInfo holds (timed without tracing)
    decoded = InstanceInfo.from_json(json.loads(text))
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del decoded
    empty = instance_json(
        InstanceInfo("host-0123:12345:abcdef", "host-0123", 12345, "0.0.0", 0, 0, {})
    )
    return {
        "jobs": jobs,
        "bytes": len(text.encode()),
        "bytes_per_job": (len(text.encode()) - len(empty.encode())) / jobs,
        "bytes_empty": len(empty.encode()),
        "encode_s": encode,
        "decode_s": decode,
        "decoded_bytes": held,
    }


def arithmetic(
    reg: dict[str, float],
    results: Sequence[RealResult],
    k: int,
    role_us: float,
) -> None:
    replicas, jobs, interval = ARITH_REPLICAS, ARITH_JOBS, ARITH_INTERVAL_S
    scale = jobs / reg["jobs"]  # the registry figures were measured with reg["jobs"] jobs
    info_bytes = reg["bytes_empty"] + reg["bytes_per_job"] * jobs
    runs_s = jobs / interval
    reads_s = replicas / (HEARTBEAT_MS / 1000)
    read_bytes = replicas * info_bytes
    print(
        f"\n== arithmetic: {replicas:,} replicas x {jobs:,} jobs every {interval} s "
        f"({runs_s:,.0f} runs/s on average; every slot of every job is due at the top of "
        f"the minute) =="
    )
    from anarchon_core.engine.slots import DUE_PER_TURN as per_turn

    claims_k = (k + 1) * runs_s
    # The slot loop takes at most DUE_PER_TURN due runs per turn and sends one claim_many
    # per turn with a run to claim: a turn holds one of this instance's k candidate runs
    # with probability 1 - (1 - k/replicas)^per_turn; the watcher runs come due together
    # at the end of the jitter window and leave in one more request.
    turns = math.ceil(jobs / per_turn)
    watched = jobs / replicas
    requests_k = turns * (1 - (1 - k / replicas) ** per_turn) + math.ceil(watched / per_turn)
    claims_all = replicas * runs_s
    burst_window = min(500, interval * 1000 // 4) / 1000  # default jitter, clamped
    rows: list[tuple[object, ...]] = [
        ("claims/s, average", f"{claims_k:,.0f}", f"{claims_all:,.0f}"),
        (
            "claims per top-of-minute burst",
            f"{(k + 1) * jobs:,.0f} ({k * jobs:,} in {burst_window:g} s + {jobs:,} watcher)",
            f"{replicas * jobs:,.0f} in {burst_window:g} s",
        ),
        (
            f"claim requests per minute ({per_turn} due runs per loop turn)",
            f"{replicas * requests_k:,.0f} ({requests_k:.0f} per instance)",
            f"{replicas * turns:,} ({turns} per instance)",
        ),
        (
            "ranking per instance (role() per run)",
            f"{runs_s:,.0f}/s x {role_us:.1f} us = {runs_s * role_us / 1e4:.2f} % of a core",
            "none",
        ),
    ]
    print_table(
        f"claims: k={k} candidates (+1 watcher) vs every instance claiming",
        ("", f"k={k}", "every instance"),
        rows,
    )
    # What each store would spend on those claims, from this run's own per-run figures.
    store_rows = []
    for r in results:
        if r.procs != min(x.procs for x in results if x.store == r.store) or not r.due:
            continue
        runs = r.due
        claims_per_run = r.claims / runs if runs else math.nan
        if r.store == "sqlite":
            store_rows.append(
                (
                    "sqlite",
                    "n/a",
                    "n/a",
                    "one file on one host: 1,000 replicas on many hosts cannot share it",
                )
            )
            continue
        cpu_per_run = r.server.get("cpu_s", math.nan) / runs
        per_claim = cpu_per_run / claims_per_run
        store_rows.append(
            (
                r.store,
                f"{per_claim * 1e6:.0f} us",
                f"{claims_k * per_claim:.2f} / {claims_all * per_claim:,.0f}",
                f"measured at N={r.procs}: {cpu_per_run * 1e6:.0f} us server CPU per run "
                f"/ {claims_per_run:.2f} claims (includes finish, heartbeats, registry)",
            )
        )
    print_table(
        "store CPU for the claims (server CPU per claim, an upper bound: per run / claims per run)",
        ("store", "CPU per claim", f"cores needed k={k} / every", "basis"),
        store_rows,
    )
    from anarchon_core.engine.registry import MISMATCH_CHECK_PERIODS as checks

    mb = info_bytes / 1e6
    decode_s = reg["decode_s"] * scale
    period = HEARTBEAT_MS / 1000
    held_mb = reg["decoded_bytes"] * scale / 1e6
    empty = reg["bytes_empty"]
    measured = f", measured with {reg['jobs']:,.0f} jobs" if scale != 1 else ""
    reg_rows = [
        ("one InstanceInfo JSON", f"{mb:,.1f} MB ({reg['bytes_per_job']:.0f} B/job{measured})"),
        (
            "registry writes (register each heartbeat)",
            f"{reads_s:,.0f}/s x {mb:,.1f} MB = {reads_s * info_bytes / 1e9:,.1f} GB/s",
        ),
        (
            "one registry read (instances())",
            f"{replicas:,} x {mb:,.1f} MB = {read_bytes / 1e9:,.1f} GB",
        ),
        (
            "registry reads, cluster",
            f"{reads_s:,.0f}/s = {reads_s * read_bytes / 1e12:,.1f} TB/s out of the store",
        ),
        (
            "decode of one read, per instance",
            f"{replicas:,} x {decode_s:.2f} s = {replicas * decode_s:,.0f} s of CPU every "
            f"{period:g} s ({replicas * decode_s / period:,.0f} cores)",
        ),
        (
            "decoded registry held per instance",
            f"{replicas:,} x {held_mb:,.0f} MB = {replicas * held_mb / 1e3:,.0f} GB",
        ),
        (
            "with candidates=None",
            f"read every {checks * period:g} s (fingerprint check) instead of every "
            f"{period:g} s: 1/{checks} of the above, still O(replicas^2 x jobs)",
        ),
        (
            "the same registry without the job digests",
            f"{replicas:,} x {empty:.0f} B = {replicas * empty / 1e3:,.0f} KB per read, "
            f"{reads_s * replicas * empty / 1e6:,.0f} MB/s for the cluster",
        ),
    ]
    print_table(
        f"registry: every instance registers every {HEARTBEAT_MS / 1000:g} s and, with "
        f"candidates set, reads every live instance's InstanceInfo (each job's name and "
        f"fingerprint)",
        ("", "figure"),
        reg_rows,
    )


# -- report ----------------------------------------------------------------------------
def report_real(results: Sequence[RealResult]) -> None:
    rows: list[tuple[object, ...]] = []
    for r in results:
        rows.append(
            (
                r.store,
                r.procs,
                f"{r.jobs:,} every {r.every}",
                r.slots,
                r.due,
                r.executions / r.due if r.due else math.nan,
                r.missed,
                r.twice,
            )
        )
    print_table(
        "runs per slot over the judged window (must be exactly 1.00, none missed, none twice)",
        ("store", "N", "jobs", "slots", "runs due", "runs/slot", "missed", "ran twice"),
        rows,
    )
    rows = []
    for r in results:
        due = r.due or 1
        instants = r.slots or 1
        server = r.server
        if r.store == "redis" and server:
            at_server = (
                f"{server['scripts'] / due:.2f} scripts, {server['commands'] / due:.1f} cmds, "
                f"{server['usec'] / due:.0f} us cmd, {1e6 * server['cpu_s'] / due:.0f} us CPU"
            )
        elif r.store == "postgres" and server:
            at_server = (
                f"{server['claim_fn'] / due:.2f} claim fn, "
                f"{server['claim_many_fn'] / instants:.1f} claim_many/slot, "
                f"{server['xacts'] / due:.2f} xacts, {server['tup_written'] / due:.1f} rows, "
                f"{1e6 * server['cpu_s'] / due:.0f} us CPU"
            )
        else:
            at_server = "no server (client counts only)"
        rows.append(
            (
                r.store,
                r.procs,
                r.claims / due,
                r.won / due,
                r.requests / instants,
                r.registry_reads / r.window_s if r.window_s else math.nan,
                r.registry_ms,
                r.entry_bytes,
                r.read_bytes / 1e3,
                r.registry_reads / r.window_s * r.read_bytes / 1e6 if r.window_s else math.nan,
                at_server,
            )
        )
    print_table(
        "claims per run (client: Scheduler.stats claim_* deltas summed over processes; "
        "server: per run)",
        (
            "store",
            "N",
            "claims/run",
            "won/run",
            "requests/slot",
            "reg reads/s",
            "ms/read",
            "entry B",
            "read KB",
            "reg MB/s",
            "at the server, per run",
        ),
        rows,
    )
    rows = []
    for r in results:
        due = r.due or 1
        claims = ", ".join(
            f"{key.removeprefix('claim_')} {value / due:.3f}"
            for key, value in r.events.items()
            if key.startswith("claim_")
        )
        other = ", ".join(
            f"{key} {value:,}"
            for key, value in r.events.items()
            if not key.startswith(("claim_", "run_"))
        )
        rows.append((r.store, r.procs, claims, other or "-"))
    print_table(
        "claim outcomes per run due, and other events in the window (Scheduler.stats deltas, "
        "all processes)",
        ("store", "N", "claim outcomes per run", "other events (counts)"),
        rows,
    )
    rows = []
    for r in results:
        cpu = r.cpu or [math.nan]
        rows.append(
            (
                r.store,
                r.procs,
                percentile(r.lateness, 50),
                percentile(r.lateness, 99),
                percentile(r.beyond_jitter, 99),
                r.lateness[-1] if r.lateness else math.nan,
                statistics.mean(cpu),
                max(cpu),
                sum(cpu),
                100 * r.pressure,
                r.start_up_s,
            )
        )
    print_table(
        "lateness (handler start - slot, ms; includes the jitter) and CPU per process "
        "(user+sys s per s of the window)",
        (
            "store",
            "N",
            "p50",
            "p99",
            "p99 - jitter",
            "max",
            "CPU/proc",
            "max CPU",
            "cores",
            "host CPU wait %",
            "start-up s",
        ),
        rows,
    )
    print(
        "  cores = the processes' CPU summed; host CPU wait % = share of the window in which "
        "some runnable task on the host (any tenant) waited for a CPU (/proc/pressure/cpu)"
    )
    for r in results:
        print(f"  {r.store} N={r.procs}: {r.description}; window {r.window_s:.1f} s")


def report_virtual(results: Sequence[dict[str, Any]]) -> None:
    rows: list[tuple[object, ...]] = []
    for v in results:
        due = v["due"] or 1
        rows.append(
            (
                f"{v['instances']} x {v['jobs']:,}",
                "every" if v["candidates"] is None else v["candidates"],
                "decoded (no JSON)" if v["memo_registry"] else "JSON (as stores)",
                v["slots"],
                v["due"],
                v["executions"] / due,
                v["missed"],
                v["twice"],
                v["claims"] / due,
                v["requests"] / max(v["slots"], 1) / v["instances"],
                v["wall_per_virtual_s"],
                v["registry_s_per_virtual_s"],
                v["total_wall_s"],
                v["max_rss_mib"],
            )
        )
    print_table(
        "virtual time: one in-memory store, every 1 s jobs, default jitter and heartbeat",
        (
            "instances x jobs",
            "k",
            "registry",
            "slots",
            "runs due",
            "runs/slot",
            "missed",
            "twice",
            "claims/run",
            "requests/inst/slot",
            "wall s per virt s",
            "of it registry",
            "total wall s",
            "max RSS MiB",
        ),
        rows,
    )


def _parse_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _parse_virtual(text: str) -> list[tuple[int, int, bool]]:
    """``200x100,200x2000m``: instances x jobs, ``m`` = registry kept decoded."""
    out = []
    for item in _parse_list(text):
        memo = item.endswith("m")
        n, j = item.rstrip("m").split("x")
        out.append((int(n), int(j), memo))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__)
    parser.add_argument("--procs", default="2,8", help="process counts N (comma list)")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument(
        "--every", default="1s", help="job interval, one for all N or one per --procs entry"
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="run length per store and N")
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--candidates", default="2", help="k, or 'none' (every instance claims)")
    parser.add_argument(
        "--virtual",
        default="200x20,200x100m",
        help="virtual clusters INSTANCESxJOBS, comma list; a trailing 'm' keeps the "
        "registry decoded in the store (no JSON per read); '' skips the section",
    )
    parser.add_argument("--virtual-every", action="store_true", help="also k=None virtually")
    parser.add_argument(
        "--arith-jobs", type=int, default=ARITH_JOBS, help="jobs to measure the InstanceInfo with"
    )
    parser.add_argument(
        "--pg-pool", type=int, default=None, help="PostgreSQL pool size per process"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of under a minute")
    args = parser.parse_args(argv)
    if args.quick:
        args.procs, args.jobs, args.seconds, args.every = "2", 100, 10.0, "1s"
        args.virtual, args.arith_jobs = "20x50,50x100m", 20_000
    k = None if args.candidates.lower() in ("none", "all", "every") else int(args.candidates)
    procs = [int(x) for x in _parse_list(args.procs)]
    everys = _parse_list(args.every)
    if len(everys) == 1:
        everys *= len(procs)
    if len(everys) != len(procs):
        raise SystemExit("--every takes one interval, or one per --procs entry")
    stores = _parse_list(args.stores)
    t_all = time.perf_counter()
    print(f"== scale ==\n{machine()}")
    print(
        f"N processes x {args.jobs:,} jobs, candidates={args.candidates}, "
        f"{args.seconds:g} s per run; stores {', '.join(stores)}"
    )
    results: list[RealResult] = []
    with tempfile.TemporaryDirectory(prefix="anarchon-scale-") as name:
        tmp = Path(name)
        for store in stores:
            for n, every in zip(procs, everys, strict=True):
                t0 = time.perf_counter()
                try:
                    r = run_real(store, n, args.jobs, every, args.seconds, k, tmp, args.pg_pool)
                except Exception as exc:  # report and go on with the other stores
                    print(f"  {store} N={n}: FAILED: {type(exc).__name__}: {exc}", flush=True)
                    r = RealResult(store, n, args.jobs, every, k, error=str(exc))
                    results.append(r)
                    continue
                results.append(r)
                print(
                    f"  {store} N={n} every {every}: {time.perf_counter() - t0:.0f} s, "
                    f"runs/slot {r.executions / max(r.due, 1):.3f}, "
                    f"claims/run {r.claims / max(r.due, 1):.2f}, lateness p99 "
                    f"{percentile(r.lateness, 99):.0f} ms",
                    flush=True,
                )
        done = [r for r in results if not r.error]
        if done:
            report_real(done)
            print(
                "  entry B = the largest registry entry as JSON, read KB = one registry read "
                "(every live entry), both read from the store at the end of the window; reg "
                "MB/s = registry reads/s x read KB: what the store serves and the processes decode"
            )
            print(
                "  requests/slot = claim round trips per slot, all processes: the slot loop "
                "takes at most 256 due runs per turn (DUE_PER_TURN) and sends one claim_many "
                "per turn, plus one for its watcher runs"
            )
        virtual: list[dict[str, Any]] = []
        for n, j, memo in _parse_virtual(args.virtual):
            for kk in [k if k is not None else 2] + ([None] if args.virtual_every else []):
                cfg = {"instances": n, "jobs": j, "candidates": kk, "memo_registry": memo}
                t0 = time.perf_counter()
                virtual.append(run_virtual_child(cfg, tmp))
                label = f"{n}x{j}{' (registry decoded)' if memo else ''} k={kk}"
                print(f"  virtual {label}: {time.perf_counter() - t0:.0f} s", flush=True)
        if virtual:
            report_virtual(virtual)
    role_200 = role_cost_us(200)
    role_1000 = role_cost_us(ARITH_REPLICAS)
    print(
        f"ranking cost: Candidates.turn() {role_200:.1f} us with 200 live instances, "
        f"{role_1000:.1f} us with {ARITH_REPLICAS:,} (per run, per instance)"
    )
    reg = registry_figures(args.arith_jobs)
    arithmetic(reg, done, k if k is not None else 2, role_1000)
    summary(done, virtual, reg, k)
    print(f"\n[scale: {time.perf_counter() - t_all:.0f} s]")
    failed = [r for r in results if r.error or r.missed or r.twice]
    if failed:
        raise SystemExit(
            "FAILED: "
            + "; ".join(
                f"{r.store} N={r.procs}: " + (r.error or f"{r.missed} missed, {r.twice} ran twice")
                for r in failed
            )
        )


def summary(
    results: Sequence[RealResult],
    virtual: Sequence[dict[str, Any]],
    reg: dict[str, float],
    k: int | None,
) -> None:
    print("\nsummary:")
    if results:
        ok = all(r.missed == 0 and r.twice == 0 and r.executions == r.due for r in results)
        per_run = [r.claims / r.due for r in results if r.due]
        print(
            f"- real processes: every judged slot ran exactly once: {'yes' if ok else 'NO'}; "
            f"claims per run {min(per_run):.2f}-{max(per_run):.2f} across stores and N "
            f"(k={k}: at most {'N' if k is None else k + 1} expected)"
        )
        for r in results:
            if r.missed or r.twice:
                ev = r.events
                print(
                    f"- {r.store} N={r.procs}: {r.missed:,} of {r.due:,} slots missed, "
                    f"{r.twice:,} ran twice; in the window the processes saw "
                    f"{ev.get('claim_expired', 0):,} claims answered expired (past the horizon), "
                    f"{ev.get('not_started_horizon', 0):,} runs won but not started (the answer "
                    f"came past the horizon), {ev.get('claim_skipped', 0):,} skipped (overlap); "
                    f"registry reads took {r.registry_ms:.0f} ms each"
                )
        worst = max(results, key=lambda r: percentile(r.lateness, 99))
        print(
            f"- worst lateness p99 {percentile(worst.lateness, 99):.0f} ms "
            f"({worst.store}, N={worst.procs}); busiest run used "
            f"{max(sum(r.cpu) for r in results):.2f} cores of {len(os.sched_getaffinity(0))}"
        )
    for v in virtual:
        print(
            f"- virtual {v['instances']} x {v['jobs']:,} (k={v['candidates']}): "
            f"{v['claims'] / max(v['due'], 1):.2f} claims/run, "
            f"{v['executions'] / max(v['due'], 1):.2f} runs/slot, "
            f"{v['wall_per_virtual_s']:.2f} wall s per virtual s "
            f"({v['registry_s_per_virtual_s']:.2f} s in registry reads)"
        )
    per_job = reg["bytes_per_job"]
    print(
        f"- the limit at 1,000 replicas x 100,000 jobs is the registry, not the claims: "
        f"each InstanceInfo lists every job's name and fingerprint ({per_job:.0f} B/job, "
        f"{(reg['bytes_empty'] + per_job * ARITH_JOBS) / 1e6:.1f} MB), and every instance reads "
        f"all of them every heartbeat: O(replicas^2 x jobs) bytes per "
        f"{HEARTBEAT_MS / 1000:g} s"
    )


if __name__ == "__main__":
    main()
