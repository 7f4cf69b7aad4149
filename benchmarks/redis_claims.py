"""Claims per second and claim latency: each Redis strategy against its raw primitive.

One process. Every strategy's backend is measured next to the primitive it is built
on, issued directly with **the same client** (the backend's own connection pool):

* ``lease``  (Lua claim script: run record + lease key with a TTL, overlap check)
  vs ``raw SET NX PX`` on a key per run;
* ``script`` (claim-only Lua script: the run record) vs ``raw SET NX PX``;
* ``stream-id`` (``TIME`` + ``XADD <slot>-0`` + ``XRANGE`` of the slot in one round
  trip) vs ``raw XADD <slot>-0`` with the same fields;
* ``idmp`` (``XADD … IDMP``, Redis >= 8.6 only) vs ``raw XADD IDMP``; on an older
  server this pair is skipped with the server's version.

Each repeat runs, for every variant in a rotating order, the *win* path (``--jobs``
jobs, one new slot each) and then the *lose* path (the same runs with other tokens).
Wins are measured in steady state: every job was claimed once before (the jobs index
is written), and the previous run of each job has finished (``lease``: no live run
to skip). The anarchon/raw ratio of time per claim is taken per repeat and reported
as median (min-max, n).

Run alone: ``python -m benchmarks.redis_claims [--url URL --jobs 1000 --repeats 7]``;
the URL defaults to ``$ANARCHON_BENCH_REDIS``, else the test server.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from anarchon_core.backend import ClaimRequest, Lease
from anarchon_core.backends import mask_url
from anarchon_core.backends.redis import RedisBackend
from anarchon_core.backends.redis._streams import idmp_xadd_command
from anarchon_core.errors import CapabilityError
from anarchon_core.records import Origin, Outcome, Status

from ._util import machine, print_table, ratio_summary, summary_ns

DEFAULT_URL = os.environ.get(
    "ANARCHON_BENCH_REDIS", os.environ.get("ANARCHON_TEST_REDIS", "redis://127.0.0.1:6379/0")
)
HORIZON_MS = 3_600_000
LEASE_MS = 6_000
US = 1_000.0
STRATEGIES = ("lease", "script", "stream-id", "idmp")
RAW = {
    "lease": "raw SET NX PX",
    "script": "raw SET NX PX",
    "stream-id": "raw XADD <slot>-0",
    "idmp": "raw XADD IDMP",
}

Claim = Callable[[int, int, str], Awaitable[bool]]  # (job index, slot, token) -> won


@dataclass
class Phase:
    """Samples of one variant on one path, pooled over repeats."""

    latencies_ns: list[int] = field(default_factory=list)
    elapsed_ns: list[int] = field(default_factory=list)  # per repeat


def _request(prefix: str, i: int, slot: int, token: str) -> ClaimRequest:
    return ClaimRequest(
        job=f"{prefix}.{i}",
        slot=slot,
        origin=Origin.SCHEDULE,
        token=token,
        instance_id="bench:1:abcdef",
        lease_ms=LEASE_MS,
        horizon_ms=HORIZON_MS,
        skip_overlap=True,  # the engine's default (overlap="skip")
        fingerprint="0123456789abcdef",
    )


def _fields(token: str, slot: int) -> list[str]:
    """What the stream strategies write per claim, for the raw XADD to write the same."""
    return [
        "token",
        token,
        "instance",
        "bench:1:abcdef",
        "origin",
        "schedule",
        "claimed",
        str(slot),
        "fingerprint",
        "0123456789abcdef",
    ]


def _anarchon(backend: RedisBackend, prefix: str) -> Claim:
    async def claim(i: int, slot: int, token: str) -> bool:
        answer = await backend.claim(_request(prefix, i, slot, token))
        if answer.outcome not in (Outcome.WON, Outcome.TAKEN):
            raise AssertionError(f"claim of job {i}@{slot} answered {answer.outcome}")
        return answer.outcome == Outcome.WON

    return claim


def _raw(strategy: str, backend: RedisBackend, prefix: str) -> Claim:
    client = backend.client
    base = f"{backend.prefix}:raw"

    async def set_nx(i: int, slot: int, token: str) -> bool:
        reply = await client.execute_command(
            "SET", f"{base}:{{{prefix}.{i}}}:{slot}", token, "NX", "PX", LEASE_MS
        )
        return reply is not None

    async def xadd(i: int, slot: int, token: str) -> bool:
        try:
            await client.execute_command(
                "XADD", f"{base}:{{{prefix}.{i}}}:stream", f"{slot}-0", *_fields(token, slot)
            )
        except ResponseError:
            return False
        return True

    async def xadd_idmp(i: int, slot: int, token: str) -> bool:
        key = f"{base}:{{{prefix}.{i}}}:idmp"
        fields = dict(zip(*[iter(_fields(token, slot))] * 2, strict=True))
        pipe = client.pipeline(transaction=True)
        pipe.execute_command(*idmp_xadd_command(key, slot, fields))
        pipe.execute_command("XREVRANGE", key, "+", "-", "COUNT", 1)
        entry, top = await pipe.execute()
        return bool(top) and top[0][0] == entry and top[0][1].get("token") == token

    return {"lease": set_nx, "script": set_nx, "stream-id": xadd, "idmp": xadd_idmp}[strategy]


async def _timed(claim: Claim, jobs: int, slot: int, expect: bool, phase: Phase) -> list[str]:
    tokens = [secrets.token_hex(16) for _ in range(jobs)]
    gc.collect()
    lat: list[int] = []
    clock = time.perf_counter_ns
    start = clock()
    for i in range(jobs):
        t0 = clock()
        won = await claim(i, slot, tokens[i])
        lat.append(clock() - t0)
        if won is not expect:
            raise AssertionError(f"claim of job {i}@{slot} gave won={won}, expected {expect}")
    phase.elapsed_ns.append(clock() - start)
    phase.latencies_ns += lat
    return tokens


async def _finish(backend: RedisBackend, prefix: str, slot: int, tokens: Sequence[str]) -> None:
    """End the won runs (not measured), so the next repeat's wins find no live run."""
    if backend.capabilities.finish:
        for i, token in enumerate(tokens):
            await backend.finish(Lease(f"{prefix}.{i}", slot, 1, token), Status.SUCCESS)


async def measure(
    url: str, jobs: int, repeats: int
) -> tuple[dict[tuple[str, str], Phase], dict[str, str], str]:
    """Interleave every variant ``repeats`` times; returns phases, skipped pairs, server."""
    prefix = f"bench-{secrets.token_hex(4)}"
    backends: dict[str, RedisBackend] = {}
    skipped: dict[str, str] = {}
    server = "?"
    for strategy in STRATEGIES:
        backend = RedisBackend(url, strategy=strategy, prefix=f"{prefix}-{strategy}")
        try:
            await backend.open()
        except CapabilityError as exc:
            skipped[strategy] = str(exc)
            continue
        backends[strategy] = backend
        server = backend.server
    variants: list[tuple[str, str, Claim]] = []
    for strategy, backend in backends.items():
        variants.append((strategy, strategy, _anarchon(backend, "job")))
        variants.append(
            (RAW[strategy] + f" ({strategy})", strategy, _raw(strategy, backend, "job"))
        )
    phases = {(name, path): Phase() for name, _, _ in variants for path in ("win", "lose")}
    now = await next(iter(backends.values())).now_ms()
    first = now - (repeats + 2) * 1000  # slots rise by 1 s per repeat and stay in the past
    try:
        for name, strategy, claim in variants:  # warm-up: every job claimed once
            tokens = await _timed(claim, jobs, first, True, Phase())
            if name == strategy:
                await _finish(backends[strategy], "job", first, tokens)
        for rep in range(repeats):
            slot = first + (rep + 1) * 1000
            shift = rep % len(variants)
            for name, strategy, claim in variants[shift:] + variants[:shift]:
                tokens = await _timed(claim, jobs, slot, True, phases[(name, "win")])
                await _timed(claim, jobs, slot, False, phases[(name, "lose")])
                if name == strategy:
                    await _finish(backends[strategy], "job", slot, tokens)
    finally:
        for strategy, backend in backends.items():
            await _delete(backend, f"{prefix}-{strategy}")
            await backend.close()
    return phases, skipped, server


async def _delete(backend: RedisBackend, prefix: str) -> None:
    client: Any = backend.client
    async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        await client.delete(key)


def report(
    phases: dict[tuple[str, str], Phase], skipped: dict[str, str], jobs: int, repeats: int
) -> None:
    rows = []
    for (name, path), phase in phases.items():
        rates = [jobs / (ns / 1e9) for ns in phase.elapsed_ns]
        p50, p99, worst = summary_ns(phase.latencies_ns, US)
        rows.append((name, path, statistics.median(rates), p50, p99, worst))
    print_table(
        f"claims, one process, one client ({jobs} claims x {repeats} interleaved repeats)",
        ("variant", "path", "claims/s (median)", "p50 us", "p99 us", "max us"),
        rows,
    )
    ratio_rows = []
    strategies = [s for s in STRATEGIES if (s, "win") in phases]
    for strategy in strategies:
        raw = RAW[strategy] + f" ({strategy})"
        for path in ("win", "lose"):
            a, b = phases[(strategy, path)], phases[(raw, path)]
            per_repeat = [x / y for x, y in zip(a.elapsed_ns, b.elapsed_ns, strict=True)]
            p50a, p99a, _ = summary_ns(a.latencies_ns, US)
            p50b, p99b, _ = summary_ns(b.latencies_ns, US)
            ratio_rows.append(
                (
                    f"{strategy} / {RAW[strategy]}",
                    path,
                    ratio_summary(per_repeat),
                    p50a / p50b,
                    p99a / p99b,
                )
            )
    print_table(
        "anarchon/raw (>1: anarchon is slower): time per claim per repeat, median "
        "(min-max, n); and of the pooled p50 and p99",
        ("comparison", "path", "time ratio", "p50 ratio", "p99 ratio"),
        ratio_rows,
    )
    for strategy, why in skipped.items():
        print(f"\n{strategy}: skipped: {why}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.redis_claims", description=__doc__)
    parser.add_argument(
        "--url", default=DEFAULT_URL, help="a Redis/Valkey URL (keys get a fresh prefix)"
    )
    parser.add_argument("--jobs", type=int, default=1000, help="claims per path per repeat")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats")
    args = parser.parse_args(argv)
    # The backend warns about a server without AOF; a benchmark server needs none.
    logging.getLogger("anarchon.backends.redis").setLevel(logging.ERROR)
    print(machine())
    phases, skipped, server = asyncio.run(measure(args.url, args.jobs, args.repeats))
    print(f"store: {server} at {mask_url(args.url)}")
    report(phases, skipped, args.jobs, args.repeats)


if __name__ == "__main__":
    main()
