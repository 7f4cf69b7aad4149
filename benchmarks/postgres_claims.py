"""Claims per second and claim latency: anarchon's PostgreSQL backend against the raw primitive.

One process, one connection: the backend runs with a pool of exactly one connection,
and the raw primitive borrows that same connection from the pool, so both go through
the same psycopg ``AsyncConnection`` (autocommit, the same ``prepare_threshold``):

* ``anarchon, overlap=skip``: ``PostgresBackend.claim`` as the engine sends it by
  default (the claim function also locks the job's row and checks for a live run);
* ``anarchon, overlap=allow``: the same call with ``skip_overlap=False``;
* ``raw INSERT … ON CONFLICT``: ``INSERT INTO raw_runs … ON CONFLICT (job, slot) DO
  NOTHING`` on a table keyed ``(job, slot)``; won when a row was inserted.

Each repeat runs, for every variant in a rotating order, the *win* path (``--n`` new
runs) and then the *lose* path (the same runs with other tokens). Wins are measured in
steady state: every job already has its row (a warm-up claimed each once) and the
previous runs have finished, as in a service that has been running for a while.
The anarchon/raw ratio is taken per repeat and reported as median (min-max).

Run alone: ``python -m benchmarks.postgres_claims [--url URL --n 1000 --repeats 7]``;
the URL defaults to ``$ANARCHON_BENCH_POSTGRES``, else the test server.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from anarchon_core.backend import ClaimRequest
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.records import Origin, Outcome

from ._util import machine, print_table, ratio_summary, summary_ns

DEFAULT_URL = os.environ.get(
    "ANARCHON_BENCH_POSTGRES",
    os.environ.get("ANARCHON_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"),
)
HORIZON_MS = 3_600_000
LEASE_MS = 6_000
US = 1_000.0
RAW = "raw INSERT … ON CONFLICT"
SKIP, ALLOW = "anarchon, overlap=skip", "anarchon, overlap=allow"
VARIANTS = (SKIP, ALLOW, RAW)

RAW_SCHEMA = """
CREATE TABLE {raw} (
    job           text COLLATE "C" NOT NULL,
    slot          bigint NOT NULL,
    token         text   NOT NULL,
    instance_id   text   NOT NULL,
    lease_expires bigint NOT NULL,
    PRIMARY KEY (job, slot)
)
"""
RAW_CLAIM = """
INSERT INTO {raw} (job, slot, token, instance_id, lease_expires) VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (job, slot) DO NOTHING
"""

Row = tuple[str, int, str]  # job, slot, token
Conn = psycopg.AsyncConnection[tuple[Any, ...]]


@dataclass
class Phase:
    """Samples of one variant on one path, pooled over repeats."""

    latencies_ns: list[int] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)  # claims/s per repeat
    elapsed_ns: list[int] = field(default_factory=list)  # per repeat, for ratios
    wal_bytes: list[float] = field(default_factory=list)  # per claim, per repeat


class Bench:
    """A fresh schema holding the backend's tables and the raw table; dropped at the end."""

    def __init__(self, url: str) -> None:
        self.schema = f"anarchon_bench_{secrets.token_hex(4)}"
        self.backend = PostgresBackend(url, schema=self.schema, min_size=1, max_size=1)
        self.raw_table = sql.Identifier(self.schema, "raw_runs")
        self.raw_claim = sql.SQL(RAW_CLAIM).format(raw=self.raw_table).as_string(None)

    async def __aenter__(self) -> Bench:
        await self.backend.open()
        await self.on_conn(
            lambda conn: conn.execute(sql.SQL(RAW_SCHEMA).format(raw=self.raw_table))
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        drop = sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(self.schema))
        await self.on_conn(lambda conn: conn.execute(drop))
        await self.backend.close()

    async def on_conn(self, work: Callable[[Conn], Awaitable[Any]]) -> Any:
        """Run ``work`` on the backend's one pooled connection (the same for every variant)."""
        pool = self.backend._pool
        assert pool is not None
        async with pool.connection() as conn:
            return await work(conn)

    async def finish_all(self) -> None:
        """End every open run at once, untimed: the steady state before the next wins."""
        runs = sql.Identifier(self.schema, "anarchon_runs")
        query = sql.SQL(
            "UPDATE {} SET state = 'success', lease_expires = 0 WHERE state = 'running'"
        )
        await self.on_conn(lambda conn: conn.execute(query.format(runs)))

    async def wal_lsn(self) -> int:
        async def read(conn: Conn) -> int:
            cur = await conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
            row = await cur.fetchone()
            assert row is not None
            return int(row[0])

        return int(await self.on_conn(read))


def _request(row: Row, skip_overlap: bool) -> ClaimRequest:
    job, slot, token = row
    return ClaimRequest(
        job=job,
        slot=slot,
        origin=Origin.SCHEDULE,
        token=token,
        instance_id="bench:1:abcdef",
        lease_ms=LEASE_MS,
        horizon_ms=HORIZON_MS,
        skip_overlap=skip_overlap,
        fingerprint="0123456789abcdef",
    )


async def _claim_backend(bench: Bench, rows: Sequence[Row], skip: bool, win: bool) -> list[int]:
    expected = Outcome.WON if win else Outcome.TAKEN
    lat: list[int] = []
    clock = time.perf_counter_ns
    backend = bench.backend
    for row in rows:
        t0 = clock()
        claim = await backend.claim(_request(row, skip))
        lat.append(clock() - t0)
        if claim.outcome != expected:
            raise AssertionError(f"claim of {row[:2]} answered {claim.outcome}, not {expected}")
    return lat


async def _claim_raw(bench: Bench, rows: Sequence[Row], win: bool) -> list[int]:
    async def run(conn: Conn) -> list[int]:
        lat: list[int] = []
        clock = time.perf_counter_ns
        query = bench.raw_claim
        cur = conn.cursor()  # reused, as the backend reuses one per connection
        for job, slot, token in rows:
            t0 = clock()
            await cur.execute(query, (job, slot, token, "bench:1:abcdef", slot + LEASE_MS))
            lat.append(clock() - t0)
            if (cur.rowcount == 1) is not win:
                raise AssertionError(f"raw claim of {(job, slot)} gave rowcount {cur.rowcount}")
        return lat

    result: list[int] = await bench.on_conn(run)
    return result


async def _chunk(bench: Bench, variant: str, rows: Sequence[Row], win: bool) -> list[int]:
    if variant == RAW:
        return await _claim_raw(bench, rows, win)
    return await _claim_backend(bench, rows, variant == SKIP, win)


async def run_bench(url: str, n: int, repeats: int, chunk: int) -> dict[tuple[str, str], Phase]:
    """Per repeat and path, the variants alternate every ``chunk`` claims (rotating who
    goes first), so that a noisy neighbour slows all of them alike."""
    phases = {(v, path): Phase() for v in VARIANTS for path in ("win", "lose")}
    async with Bench(url) as bench:
        jobs = {v: [f"bench.{i}.{v.split()[-1]}" for i in range(n)] for v in VARIANTS}
        base = (await bench.backend.now_ms()) - 60_000
        # Warm-up, untimed: every job gets its row, psycopg prepares every statement.
        for variant in VARIANTS:
            rows = [(job, base, secrets.token_hex(16)) for job in jobs[variant]]
            await _chunk(bench, variant, rows, True)
        await bench.finish_all()
        for rep in range(repeats):
            wins = {
                v: [(j, base + 1 + rep, secrets.token_hex(16)) for j in jobs[v]] for v in VARIANTS
            }
            loses = {v: [(j, s, secrets.token_hex(16)) for j, s, _ in wins[v]] for v in VARIANTS}
            for path, batches in (("win", wins), ("lose", loses)):
                gc.collect()
                spent = dict.fromkeys(VARIANTS, 0)
                for k, start in enumerate(range(0, n, chunk)):
                    order = VARIANTS[k % len(VARIANTS) :] + VARIANTS[: k % len(VARIANTS)]
                    for variant in order:
                        before = await bench.wal_lsn()
                        lat = await _chunk(
                            bench, variant, batches[variant][start : start + chunk], path == "win"
                        )
                        phases[(variant, path)].wal_bytes.append(
                            (await bench.wal_lsn() - before) / len(lat)
                        )
                        phases[(variant, path)].latencies_ns += lat
                        spent[variant] += sum(lat)
                for variant in VARIANTS:
                    phase = phases[(variant, path)]
                    phase.elapsed_ns.append(spent[variant])
                    phase.rates.append(n / (spent[variant] / 1e9))
            await bench.finish_all()
    return phases


def report(phases: dict[tuple[str, str], Phase], n: int, repeats: int) -> None:
    rows = []
    for variant in VARIANTS:
        for path in ("win", "lose"):
            phase = phases[(variant, path)]
            p50, p99, worst = summary_ns(phase.latencies_ns, US)
            wal = statistics.median(phase.wal_bytes)
            rows.append((variant, path, statistics.median(phase.rates), p50, p99, worst, wal))
    print_table(
        f"claims, one process, one connection ({n} claims x {repeats} interleaved repeats)",
        ("variant", "path", "claims/s (median)", "p50 us", "p99 us", "max us", "WAL B/claim"),
        rows,
    )
    ratio_rows = []
    for variant in (SKIP, ALLOW):
        for path in ("win", "lose"):
            a, b = phases[(variant, path)], phases[(RAW, path)]
            per_repeat = [x / y for x, y in zip(a.elapsed_ns, b.elapsed_ns, strict=True)]
            p50a, p99a, _ = summary_ns(a.latencies_ns, US)
            p50b, p99b, _ = summary_ns(b.latencies_ns, US)
            ratio_rows.append(
                (f"{variant} / raw", path, ratio_summary(per_repeat), p50a / p50b, p99a / p99b)
            )
    print_table(
        "anarchon/raw (>1: anarchon is slower): time per claim per repeat, median "
        "(min-max, n); and of the pooled p50 and p99",
        ("comparison", "path", "time ratio", "p50 ratio", "p99 ratio"),
        ratio_rows,
    )


async def server_line(url: str) -> str:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'),"
            " current_setting('fsync'), inet_server_addr()::text"
        )
        row = await cur.fetchone()
    assert row is not None
    version, sync, fsync, addr = row
    return (
        f"PostgreSQL {version} at {addr or 'a Unix socket'}, synchronous_commit={sync}, "
        f"fsync={fsync}; psycopg {psycopg.__version__}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.postgres_claims", description=__doc__
    )
    parser.add_argument(
        "--url", default=DEFAULT_URL, help="a PostgreSQL URL (a scratch schema is used)"
    )
    parser.add_argument("--n", type=int, default=1000, help="claims per variant, path and repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--chunk", type=int, default=50, help="claims per turn of a variant")
    args = parser.parse_args(argv)
    print(f"== postgres claims ==\n{machine()}\n{asyncio.run(server_line(args.url))}")
    phases = asyncio.run(run_bench(args.url, args.n, args.repeats, args.chunk))
    report(phases, args.n, args.repeats)


if __name__ == "__main__":
    main()
