"""Batched claims and finishes on PostgreSQL: ``n`` single calls in a row against one batch.

One process, one pooled connection (autocommit, the default ``prepare_threshold``), on
a scratch schema. Each repeat times, on runs of its own:

* ``claim, win``: ``n`` new runs (``overlap=skip``, as the engine claims by default),
  ``claim`` awaited one after the other, against one ``claim_many`` of ``n``;
* ``claim, lose``: the same runs again with other tokens (every answer ``taken``);
* ``finish``: the won runs' ``finish`` one after the other, against one ``finish_many``.

The single and the batched variant take turns (which goes first alternates per repeat)
on separate job sets in the same table, so that a noisy neighbour slows both alike; the
open runs are finished, untimed, before the next repeat's wins, as in a service that has
been running for a while. The single/batch ratio is taken per repeat and reported as
median (min-max, n).

Run: ``python -m benchmarks.postgres_batch [--url URL --n 100 --repeats 15]``; the URL
defaults to ``$ANARCHON_BENCH_POSTGRES``, else the test server.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import secrets
import statistics
import time
from collections.abc import Sequence

from psycopg import sql

from anarchon_core.backend import ClaimRequest, FinishRequest, Lease
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.records import Origin, Outcome, Status

from ._util import machine, print_table, ratio_summary
from .postgres_claims import DEFAULT_URL, server_line

HORIZON_MS = 3_600_000
LEASE_MS = 60_000
SINGLE, BATCH = "single", "batch"
PHASES = ("claim, win", "claim, lose", "finish")


def _request(job: str, slot: int, token: str) -> ClaimRequest:
    return ClaimRequest(
        job=job,
        slot=slot,
        origin=Origin.SCHEDULE,
        token=token,
        instance_id="bench:1:abcdef",
        lease_ms=LEASE_MS,
        horizon_ms=HORIZON_MS,
        skip_overlap=True,
        fingerprint="0123456789abcdef",
    )


async def _claims(backend: PostgresBackend, variant: str, requests: list[ClaimRequest]) -> int:
    """Nanoseconds to decide ``requests`` one by one or as one batch."""
    t0 = time.perf_counter_ns()
    if variant == SINGLE:
        answers = [await backend.claim(r) for r in requests]
    else:
        answers = await backend.claim_many(requests)
    elapsed = time.perf_counter_ns() - t0
    if len(answers) != len(requests):
        raise AssertionError(f"{len(answers)} answers to {len(requests)} claims")
    return elapsed


async def _finishes(backend: PostgresBackend, variant: str, leases: list[Lease]) -> int:
    t0 = time.perf_counter_ns()
    if variant == SINGLE:
        done = [await backend.finish(lease, Status.SUCCESS) for lease in leases]
    else:
        done = await backend.finish_many([FinishRequest(le, Status.SUCCESS) for le in leases])
    elapsed = time.perf_counter_ns() - t0
    if not all(done):
        raise AssertionError("a finish was refused")
    return elapsed


async def run_bench(url: str, n: int, repeats: int) -> dict[tuple[str, str], list[int]]:
    """Per (phase, variant), the nanoseconds of each repeat."""
    times: dict[tuple[str, str], list[int]] = {(p, v): [] for p in PHASES for v in (SINGLE, BATCH)}
    schema = f"anarchon_bench_{secrets.token_hex(4)}"
    backend = PostgresBackend(url, schema=schema, min_size=1, max_size=1)
    await backend.open()
    try:
        jobs = {v: [f"batch.{v}.{i}" for i in range(n)] for v in (SINGLE, BATCH)}
        base = await backend.now_ms() - 600_000
        # Warm-up, untimed: every job gets its row, psycopg prepares every statement.
        for variant in (SINGLE, BATCH):
            for rep in range(-6, 0):
                warm = [_request(job, base + rep, secrets.token_hex(16)) for job in jobs[variant]]
                await _claims(backend, variant, warm)
                leases = [Lease(r.job, r.slot, 1, r.token) for r in warm]
                await _finishes(backend, variant, leases)
        for rep in range(repeats):
            order = (SINGLE, BATCH) if rep % 2 == 0 else (BATCH, SINGLE)
            slot = base + 1 + rep
            won = {v: [_request(j, slot, secrets.token_hex(16)) for j in jobs[v]] for v in order}
            lost = {
                v: [_request(r.job, slot, secrets.token_hex(16)) for r in won[v]] for v in order
            }
            gc.collect()
            for variant in order:
                times[("claim, win", variant)].append(await _claims(backend, variant, won[variant]))
            for variant in order:
                lose = await _claims(backend, variant, lost[variant])
                times[("claim, lose", variant)].append(lose)
            for variant in order:
                leases = [Lease(r.job, r.slot, 1, r.token) for r in won[variant]]
                times[("finish", variant)].append(await _finishes(backend, variant, leases))
        await _check(backend, jobs, base + repeats)
    finally:
        pool = backend._pool
        if pool is not None:
            async with pool.connection() as conn:
                drop = sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema))
                await conn.execute(drop)
        await backend.close()
    return times


async def _check(backend: PostgresBackend, jobs: dict[str, list[str]], slot: int) -> None:
    """Both variants decided alike: every last run was won once and finished."""
    for variant in (SINGLE, BATCH):
        again = [_request(job, slot, "check") for job in jobs[variant]]
        answers = await backend.claim_many(again)
        if {a.outcome for a in answers} != {Outcome.TAKEN}:
            raise AssertionError(f"{variant}: the last runs were not recorded")


def report(times: dict[tuple[str, str], list[int]], n: int, repeats: int) -> None:
    rows = []
    for phase in PHASES:
        single, batch = times[(phase, SINGLE)], times[(phase, BATCH)]
        ms = [statistics.median(t) / 1e6 for t in (single, batch)]
        spread = [f"{min(t) / 1e6:.2f}-{max(t) / 1e6:.2f}" for t in (single, batch)]
        ratios = [s / b for s, b in zip(single, batch, strict=True)]
        rows.append(
            (
                phase,
                ms[0],
                spread[0],
                ms[1],
                spread[1],
                ratio_summary(ratios),
                n / (ms[1] / 1e3),
            )
        )
    print_table(
        f"{n} decisions, one connection ({repeats} interleaved repeats): milliseconds per "
        f"{n}, median and range; single/batch time per repeat (>1: the batch is faster)",
        (
            "phase",
            f"{n} singles ms",
            "range",
            "1 batch ms",
            "range",
            "single/batch",
            "batched/s",
        ),
        rows,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.postgres_batch", description=__doc__
    )
    parser.add_argument("--url", default=DEFAULT_URL, help="a PostgreSQL URL (a scratch schema)")
    parser.add_argument("--n", type=int, default=100, help="decisions per variant and repeat")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    print(f"== postgres batches ==\n{machine()}\n{asyncio.run(server_line(args.url))}")
    report(asyncio.run(run_bench(args.url, args.n, args.repeats)), args.n, args.repeats)


if __name__ == "__main__":
    main()
