"""Claims per second and claim latency: anarchon's SQLite backend against the raw primitive.

Single process (interleaved repeats, rotating order):

* ``sqlite backend``: ``SqliteBackend.claim(ClaimRequest(...))`` on a temp file;
* ``raw sqlite, thread``: the bare primitive with the stdlib ``sqlite3`` on a file in
  WAL mode (``synchronous=NORMAL``, like the backend): ``BEGIN IMMEDIATE``, one
  ``INSERT ... ON CONFLICT DO NOTHING``, ``COMMIT``, issued from one worker thread
  through ``run_in_executor`` exactly as the backend issues its statements;
* ``raw sqlite, direct``: the same primitive called inline (no thread hop);
* ``memory backend``: the in-process reference backend.

Each repeat runs the *win* path (a new ``(job, slot)`` per claim) then the *lose* path
(the same runs again with a different token). The anarchon/raw ratio is taken per
repeat and reported as the median with its spread.

Multi-process: ``--procs`` processes claim the same ``--contended`` runs on one file;
each run must be won exactly once (asserted), and total claims/s is reported for the
backend and for the raw primitive.

Run alone: ``python -m benchmarks.claims [--n 2000 --repeats 7 ...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import multiprocessing as mp
import os
import secrets
import sqlite3
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import TypeVar

from anarchon_core.backend import Backend, ClaimRequest
from anarchon_core.backends.memory import MemoryBackend
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.records import Origin, Outcome

from ._util import filesystem, machine, print_table, ratio_summary, summary_ns

T = TypeVar("T")

HORIZON_MS = 3_600_000
LEASE_MS = 6_000
US = 1_000.0
WAL_HEADER, WAL_FRAME_HEADER = 32, 24

RAW_SCHEMA = """
CREATE TABLE IF NOT EXISTS raw_runs (
    job           TEXT    NOT NULL,
    slot          INTEGER NOT NULL,
    token         TEXT    NOT NULL,
    instance_id   TEXT    NOT NULL,
    lease_expires INTEGER NOT NULL,
    PRIMARY KEY (job, slot)
)
"""
RAW_CLAIM = """
INSERT INTO raw_runs (job, slot, token, instance_id, lease_expires) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (job, slot) DO NOTHING
"""

Row = tuple[str, int, str]  # job, slot, token


def _raw_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(RAW_SCHEMA)
    return conn


def _raw_claim(conn: sqlite3.Connection, row: Row) -> bool:
    """The primitive: one row, ``BEGIN IMMEDIATE``/``COMMIT``; True if this call inserted."""
    job, slot, token = row
    conn.execute("BEGIN IMMEDIATE")
    try:
        won = conn.execute(RAW_CLAIM, (job, slot, token, "raw", slot + LEASE_MS)).rowcount == 1
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return won


class RawStore:
    """The raw primitive behind one worker thread, as :class:`SqliteBackend` runs SQL."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raw-sqlite")
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self._conn = await loop.run_in_executor(self._executor, _raw_connect, self.path)

    async def claim(self, row: Row) -> bool:
        assert self._conn is not None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, _raw_claim, self._conn, row)

    async def close(self) -> None:
        if self._conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._conn.close)
        self._executor.shutdown(wait=True)


def _request(row: Row) -> ClaimRequest:
    job, slot, token = row
    return ClaimRequest(
        job=job,
        slot=slot,
        origin=Origin.SCHEDULE,
        token=token,
        instance_id="bench",
        lease_ms=LEASE_MS,
        horizon_ms=HORIZON_MS,
        skip_overlap=True,  # the engine's default (overlap="skip")
        fingerprint="0123456789abcdef",
    )


def _rows(prefix: str, n: int, slot: int) -> list[Row]:
    return [(f"{prefix}.{i}", slot, secrets.token_hex(16)) for i in range(n)]


def _retoken(rows: Sequence[Row]) -> list[Row]:
    return [(job, slot, secrets.token_hex(16)) for job, slot, _ in rows]


# -- single process -------------------------------------------------------------------
@dataclass
class Phase:
    """Samples of one variant on one path, pooled over repeats."""

    latencies_ns: list[int] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)  # claims/s per repeat
    elapsed_ns: list[int] = field(default_factory=list)  # per repeat, for ratios


async def _timed_async(
    call: Callable[[T], Awaitable[bool]], items: Sequence[T], expect: bool, phase: Phase
) -> None:
    gc.collect()
    lat: list[int] = []
    clock = time.perf_counter_ns
    start = clock()
    for item in items:
        t0 = clock()
        won = await call(item)
        lat.append(clock() - t0)
        if won is not expect:
            raise AssertionError(f"claim {item} gave won={won}, expected {expect}")
    elapsed = clock() - start
    phase.latencies_ns += lat
    phase.elapsed_ns.append(elapsed)
    phase.rates.append(len(items) / (elapsed / 1e9))


def _timed_sync(conn: sqlite3.Connection, rows: Sequence[Row], expect: bool, phase: Phase) -> None:
    gc.collect()
    lat: list[int] = []
    clock = time.perf_counter_ns
    start = clock()
    for row in rows:
        t0 = clock()
        won = _raw_claim(conn, row)
        lat.append(clock() - t0)
        if won is not expect:
            raise AssertionError(f"raw claim {row} gave won={won}, expected {expect}")
    elapsed = clock() - start
    phase.latencies_ns += lat
    phase.elapsed_ns.append(elapsed)
    phase.rates.append(len(rows) / (elapsed / 1e9))


def _backend_call(backend: Backend) -> Callable[[ClaimRequest], Awaitable[bool]]:
    """``backend.claim`` answering True for WON, False for TAKEN (anything else fails)."""

    async def call(request: ClaimRequest) -> bool:
        claim = await backend.claim(request)
        if claim.outcome not in (Outcome.WON, Outcome.TAKEN):
            raise AssertionError(f"claim of {request.job}@{request.slot} answered {claim.outcome}")
        return claim.outcome == Outcome.WON

    return call


VARIANTS = ("sqlite backend", "raw sqlite, thread", "raw sqlite, direct", "memory backend")


async def _wal_pages(
    path: str, claim: Callable[[T], Awaitable[object]], items: Sequence[T]
) -> float:
    """WAL pages written per win claim: empty the WAL, claim, and read the WAL's size.

    ``items`` stay below the 1,000-page auto-checkpoint threshold, so nothing is lost.
    """
    probe = sqlite3.connect(path, isolation_level=None)
    try:
        busy, _, _ = probe.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        page = int(probe.execute("PRAGMA page_size").fetchone()[0])
        if busy or os.path.getsize(path + "-wal") != 0:
            return math.nan
        for item in items:
            await claim(item)
        frames = (os.path.getsize(path + "-wal") - WAL_HEADER) / (page + WAL_FRAME_HEADER)
    finally:
        probe.close()
    return frames / len(items)


async def single_process(
    tmp: Path, n: int, repeats: int
) -> tuple[dict[tuple[str, str], Phase], dict[str, float]]:
    """Interleave the variants ``repeats`` times; each does the win then the lose path.

    Also returns the WAL pages one win claim writes, for the backend and the primitive.
    """
    slot = time.time_ns() // 1_000_000 // 1000 * 1000
    backend = SqliteBackend(tmp / "anarchon.db")
    await backend.open()
    memory = MemoryBackend()
    raw = RawStore(str(tmp / "raw-thread.db"))
    await raw.open()
    direct = _raw_connect(str(tmp / "raw-direct.db"))
    phases: dict[tuple[str, str], Phase] = {
        (v, path): Phase() for v in VARIANTS for path in ("win", "lose")
    }
    # Warm-up (not measured): statements compile, the files grow their first pages.
    for row in _rows("warm.backend", 200, slot):
        await backend.claim(_request(row))
    for row in _rows("warm.raw", 200, slot):
        await raw.claim(row)
        _raw_claim(direct, row)
    try:
        for rep in range(repeats):
            shift = rep % len(VARIANTS)
            for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                rows = _rows(f"r{rep}.v{VARIANTS.index(variant)}", n, slot)
                again = _retoken(rows)
                win, lose = phases[(variant, "win")], phases[(variant, "lose")]
                if variant == "raw sqlite, direct":
                    _timed_sync(direct, rows, True, win)
                    _timed_sync(direct, again, False, lose)
                elif variant == "raw sqlite, thread":
                    await _timed_async(raw.claim, rows, True, win)
                    await _timed_async(raw.claim, again, False, lose)
                else:  # requests are built before the clock starts, like the raw rows
                    store = backend if variant == "sqlite backend" else memory
                    call = _backend_call(store)
                    await _timed_async(call, [_request(r) for r in rows], True, win)
                    await _timed_async(call, [_request(r) for r in again], False, lose)
        pages = {
            "sqlite backend": await _wal_pages(
                str(tmp / "anarchon.db"),
                backend.claim,
                [_request(r) for r in _rows("wal", 100, slot)],
            ),
            "raw sqlite, thread": await _wal_pages(
                str(tmp / "raw-thread.db"), raw.claim, _rows("wal", 100, slot)
            ),
        }
    finally:
        await backend.close()
        await raw.close()
        direct.close()
    return phases, pages


# -- multi-process contention -----------------------------------------------------------
def _contend_child(
    path_anarchon: str,
    path_raw: str,
    tasks: list[tuple[str, str]],
    n: int,
    slot: int,
    barrier: Barrier,
    out: str,
) -> None:
    """Claim the same ``n`` runs as every other process, once per task; write the results."""
    asyncio.run(_contend(path_anarchon, path_raw, tasks, n, slot, barrier, out))


async def _contend(
    path_anarchon: str,
    path_raw: str,
    tasks: list[tuple[str, str]],
    n: int,
    slot: int,
    barrier: Barrier,
    out: str,
) -> None:
    backend = SqliteBackend(path_anarchon)
    await backend.open()
    raw = RawStore(path_raw)
    await raw.open()
    loop = asyncio.get_running_loop()
    results = []
    try:
        for kind, prefix in tasks:
            rows = _rows(prefix, n, slot)
            requests = [_request(row) for row in rows]
            claim = _backend_call(backend)
            await loop.run_in_executor(None, barrier.wait)
            won: list[int] = []
            lat: list[int] = []
            clock = time.perf_counter_ns
            start = clock()
            for i in range(n):
                t0 = clock()
                if await (claim(requests[i]) if kind == "anarchon" else raw.claim(rows[i])):
                    won.append(i)
                lat.append(clock() - t0)
            end = clock()
            results.append({"kind": kind, "start": start, "end": end, "won": won, "latencies": lat})
    finally:
        await backend.close()
        await raw.close()
    Path(out).write_text(json.dumps(results))


@dataclass
class Contention:
    """Per-kind (``anarchon``/``raw``) total claims/s per repeat, latencies and ratios."""

    rates: dict[str, list[float]] = field(default_factory=lambda: {"anarchon": [], "raw": []})
    latencies_ns: dict[str, list[int]] = field(default_factory=lambda: {"anarchon": [], "raw": []})
    ratios: list[float] = field(default_factory=list)


def multi_process(tmp: Path, procs: int, n: int, repeats: int) -> Contention:
    """``procs`` processes claim the same ``n`` runs; assert each is won exactly once."""
    ctx = mp.get_context("spawn")
    slot = time.time_ns() // 1_000_000 // 1000 * 1000
    path_a, path_r = str(tmp / "contend-anarchon.db"), str(tmp / "contend-raw.db")

    async def create_layout() -> None:  # so that the first claims do not race the schema
        backend = SqliteBackend(path_a)
        await backend.open()
        await backend.close()
        raw = RawStore(path_r)
        await raw.open()
        await raw.close()

    asyncio.run(create_layout())
    tasks: list[tuple[str, str]] = []
    for rep in range(repeats):
        pair = [("anarchon", f"c{rep}.a"), ("raw", f"c{rep}.r")]
        tasks += pair if rep % 2 == 0 else pair[::-1]
    barrier = ctx.Barrier(procs)
    outs = [str(tmp / f"contend-{i}.json") for i in range(procs)]
    workers = [
        ctx.Process(target=_contend_child, args=(path_a, path_r, tasks, n, slot, barrier, outs[i]))
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(300)
        if w.exitcode != 0:
            raise RuntimeError(f"contention worker {w.pid} exited with {w.exitcode}")
    per_proc = [json.loads(Path(o).read_text()) for o in outs]
    result = Contention()
    elapsed: dict[str, float] = {}
    for t, (kind, prefix) in enumerate(tasks):
        parts = [p[t] for p in per_proc]
        wins = Counter(i for part in parts for i in part["won"])
        if len(wins) != n or any(c != 1 for c in wins.values()):
            doubled = sum(1 for c in wins.values() if c > 1)
            raise AssertionError(
                f"{kind} {prefix}: {len(wins)} of {n} runs won, {doubled} won more than once"
            )
        span = (max(p["end"] for p in parts) - min(p["start"] for p in parts)) / 1e9
        result.rates[kind].append(procs * n / span)
        for part in parts:
            result.latencies_ns[kind] += part["latencies"]
        elapsed[kind] = span
        if t % 2 == 1:  # both halves of this repeat are in
            result.ratios.append(elapsed["anarchon"] / elapsed["raw"])
    return result


# -- reporting --------------------------------------------------------------------------
def report_single(
    phases: dict[tuple[str, str], Phase], pages: dict[str, float], n: int, repeats: int
) -> None:
    rows = []
    for variant in VARIANTS:
        for path in ("win", "lose"):
            phase = phases[(variant, path)]
            p50, p99, worst = summary_ns(phase.latencies_ns, US)
            rows.append((variant, path, statistics.median(phase.rates), p50, p99, worst))
    print_table(
        f"claims, one process ({n} claims x {repeats} interleaved repeats per variant and path)",
        ("variant", "path", "claims/s (median)", "p50 us", "p99 us", "max us"),
        rows,
    )
    ratio_rows = []
    for path in ("win", "lose"):
        a = phases[("sqlite backend", path)].elapsed_ns
        for other in ("raw sqlite, thread", "raw sqlite, direct"):
            b = phases[(other, path)].elapsed_ns
            ratio_rows.append(
                (
                    f"sqlite backend / {other}",
                    path,
                    ratio_summary([x / y for x, y in zip(a, b, strict=True)]),
                )
            )
    print_table(
        "time per claim ratio, per repeat (>1: the backend is slower; median (min-max, n))",
        ("comparison", "path", "ratio"),
        ratio_rows,
    )
    print(
        "WAL pages written per win claim: "
        + ", ".join(f"{name} {value:.1f}" for name, value in pages.items())
    )


def report_multi(result: Contention, procs: int, n: int, repeats: int) -> None:
    rows = []
    for kind, label in (("anarchon", "sqlite backend"), ("raw", "raw sqlite, thread")):
        p50, p99, worst = summary_ns(result.latencies_ns[kind], US)
        rates = result.rates[kind]
        rows.append(
            (
                label,
                statistics.median(rates),
                f"{min(rates):,.0f}-{max(rates):,.0f}",
                p50,
                p99,
                worst,
            )
        )
    print_table(
        f"contention: {procs} processes claim the same {n:,} runs on one file "
        f"(each won exactly once: checked; {repeats} interleaved repeats)",
        ("variant", "total claims/s", "spread", "p50 us", "p99 us", "max us"),
        rows,
    )
    print(f"time ratio backend/raw under contention: {ratio_summary(result.ratios)}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.claims", description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="claims per variant and repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--contended", type=int, default=2000, help="runs every process claims")
    parser.add_argument("--contention-repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"== claims ==\n{machine()}")
    with tempfile.TemporaryDirectory(prefix="anarchon-bench-") as name:
        tmp = Path(name)
        phases, pages = asyncio.run(single_process(tmp, args.n, args.repeats))
        report_single(phases, pages, args.n, args.repeats)
        result = multi_process(tmp, args.procs, args.contended, args.contention_repeats)
        report_multi(result, args.procs, args.contended, args.contention_repeats)
        print(f"SQLite files on {filesystem(str(tmp))}, synchronous=NORMAL")


if __name__ == "__main__":
    main()
