"""Claims per second and claim latency on the brokers: each backend against its raw primitive.

For every broker that answers (a broker that does not is reported and skipped), in one
process, with interleaved repeats in rotating order:

* ``rabbitmq backend``: ``RabbitMQBackend.claim(ClaimRequest(...))``;
* ``raw amqp``: the same broker operation issued directly with aiormq on one
  publisher-confirm channel: ``queue.declare`` (``nowait``, the backend's arguments)
  then a persistent, mandatory ``basic.publish``, waiting for its ``basic.ack``/``nack``;
* ``nats backend``: ``NatsBackend.claim(ClaimRequest(...))``;
* ``raw nats kv``: the same operation with nats-py directly: ``KeyValue.update(key,
  value, last=0)`` (a JetStream publish with ``Nats-Expected-Last-Subject-Sequence: 0``).

Each repeat runs the *win* path (a new run per claim: must answer won) then the *lose*
path (the same runs again with new tokens: must answer taken), one claim at a time
(latency), then the win path with ``--concurrency`` claims in flight (throughput). The
backend/raw ratio is taken per repeat and reported as the median with its spread.

The batched part (``--batch``, 1,000 by default) times, per repeat, ``--batch`` claims
awaited one after the other against the same number as one ``claim_many``, each on runs
of its own, win path then lose path, taking turns (which goes first alternates per
repeat); the single/batch ratio is taken per repeat, median with its spread.

Nothing is left behind: RabbitMQ run queues expire by themselves (a 30 s horizon plus a
1 s margin) and the marker exchange is deleted; the NATS bucket is deleted.

Run alone: ``python -m benchmarks.broker_claims [--n 500 --repeats 5 --concurrency 64
--batch 1000 --part single|batched]``;
the brokers are ``$ANARCHON_BENCH_RABBITMQ`` and ``$ANARCHON_BENCH_NATS`` (default: local).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from anarchon_core.backend import Backend, ClaimRequest
from anarchon_core.records import Origin, Outcome

from ._util import machine, print_table, ratio_summary, summary_ns

RABBITMQ_URL = os.environ.get("ANARCHON_BENCH_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("ANARCHON_BENCH_NATS", "nats://127.0.0.1:4222")
HORIZON_MS = 30_000
US = 1_000.0

Claim = Callable[[str, int, str], Awaitable[bool]]  # (job, slot, token) -> won?


@dataclass
class Phase:
    """Samples of one variant on one path, pooled over repeats."""

    latencies_ns: list[int] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    elapsed_ns: list[int] = field(default_factory=list)


@dataclass
class Pair:
    """A broker's backend and raw primitive, opened, with their cleanup."""

    broker: str
    backend: Claim
    raw: Claim
    close: Callable[[], Awaitable[None]]
    store: Backend


def _request(job: str, slot: int, token: str) -> ClaimRequest:
    return ClaimRequest(
        job=job,
        slot=slot,
        origin=Origin.SCHEDULE,
        token=token,
        instance_id="bench",
        lease_ms=0,
        horizon_ms=HORIZON_MS,
        skip_overlap=False,
        fingerprint="0123456789abcdef",
    )


def _backend_claim(backend: Backend) -> Claim:
    async def claim(job: str, slot: int, token: str) -> bool:
        answer = await backend.claim(_request(job, slot, token))
        if answer.outcome not in (Outcome.WON, Outcome.TAKEN):
            raise AssertionError(f"claim of {job}@{slot} answered {answer.outcome}")
        return answer.outcome == Outcome.WON

    return claim


def _body(job: str, slot: int, token: str) -> bytes:
    """A payload like the backends' claim records, so both sides move the same bytes."""
    record = {"job": job, "slot": slot, "token": token, "instance_id": "bench", "t": slot}
    return json.dumps(record, separators=(",", ":")).encode()


# -- the brokers --------------------------------------------------------------------------
async def open_rabbitmq() -> Pair:
    import aiormq
    import aiormq.exceptions
    from pamqp.commands import Basic

    from anarchon_core.backends.rabbitmq import RabbitMQBackend

    prefix = f"anarchon-bench-{secrets.token_hex(4)}."
    backend = RabbitMQBackend(RABBITMQ_URL, prefix=prefix, margin_ms=1000)
    await backend.open()
    connection = await aiormq.connect(RABBITMQ_URL)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    arguments: dict[str, Any] = {
        "x-max-length": 1,
        "x-overflow": "reject-publish",
        "x-expires": backend.queue_expiry_ms(HORIZON_MS),
        "x-queue-type": "classic",
    }
    properties = Basic.Properties(delivery_mode=2, content_type="application/json")

    async def raw(job: str, slot: int, token: str) -> bool:
        queue = f"{prefix}raw.{job}@{slot}"
        await channel.queue_declare(queue, durable=True, arguments=arguments, nowait=True)
        try:
            await channel.basic_publish(
                _body(job, slot, token), routing_key=queue, mandatory=True, properties=properties
            )
        except aiormq.exceptions.DeliveryError:
            return False
        return True

    async def close() -> None:
        marker = await connection.channel(publisher_confirms=False)
        await marker.exchange_delete(backend.layout_marker(1))
        await connection.close()
        await backend.close()

    return Pair("rabbitmq", _backend_claim(backend), raw, close, backend)


async def open_nats() -> Pair:
    import nats
    import nats.js.errors
    from nats.js import api

    from anarchon_core.backends.nats import NatsBackend

    bucket = f"anarchon_bench_{secrets.token_hex(4)}"
    backend = NatsBackend(f"{NATS_URL}/?bucket={bucket}")
    await backend.open()
    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    kv = await js.create_key_value(api.KeyValueConfig(bucket=f"{bucket}_raw", history=1, ttl=3600))

    async def raw(job: str, slot: int, token: str) -> bool:
        try:
            await kv.update(f"c.{job}.{slot}", _body(job, slot, token), last=0)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    async def close() -> None:
        await js.delete_key_value(bucket)
        await js.delete_key_value(f"{bucket}_raw")
        await nc.close()
        await backend.close()

    return Pair("nats", _backend_claim(backend), raw, close, backend)


# -- measuring ------------------------------------------------------------------------------
async def _sequential(
    claim: Claim, runs: Sequence[tuple[str, int]], win: bool, phase: Phase
) -> None:
    gc.collect()
    clock = time.perf_counter_ns
    lat: list[int] = []
    start = clock()
    for job, slot in runs:
        t0 = clock()
        won = await claim(job, slot, secrets.token_hex(16))
        lat.append(clock() - t0)
        if won is not win:
            raise AssertionError(f"claim of {job}@{slot} gave won={won}, expected {win}")
    elapsed = clock() - start
    phase.latencies_ns += lat
    phase.elapsed_ns.append(elapsed)
    phase.rates.append(len(runs) / (elapsed / 1e9))


async def _concurrent(
    claim: Claim, runs: Sequence[tuple[str, int]], limit: int, phase: Phase
) -> None:
    gc.collect()
    gate = asyncio.Semaphore(limit)
    clock = time.perf_counter_ns
    lat: list[int] = []

    async def one(job: str, slot: int) -> None:
        async with gate:
            t0 = clock()
            if not await claim(job, slot, secrets.token_hex(16)):
                raise AssertionError(f"claim of {job}@{slot} lost a fresh run")
            lat.append(clock() - t0)

    start = clock()
    await asyncio.gather(*(one(job, slot) for job, slot in runs))
    elapsed = clock() - start
    phase.latencies_ns += lat
    phase.elapsed_ns.append(elapsed)
    phase.rates.append(len(runs) / (elapsed / 1e9))


def _runs(tag: str, n: int) -> list[tuple[str, int]]:
    slot = time.time_ns() // 1_000_000
    return [(f"{tag}.{i}", slot) for i in range(n)]


async def measure(
    pair: Pair, n: int, repeats: int, concurrency: int
) -> dict[tuple[str, str], Phase]:
    variants = {"backend": pair.backend, "raw": pair.raw}
    phases = {(v, p): Phase() for v in variants for p in ("win", "lose", "concurrent")}
    for kind, claim in variants.items():  # warm-up, not measured
        for job, slot in _runs(f"warm.{kind}", 50):
            await claim(job, slot, "w")
    order = list(variants)
    for rep in range(repeats):
        for kind in order[rep % 2 :] + order[: rep % 2]:
            claim = variants[kind]
            runs = _runs(f"r{rep}.{kind}", n)
            await _sequential(claim, runs, True, phases[(kind, "win")])
            await _sequential(claim, runs, False, phases[(kind, "lose")])
            await _concurrent(
                claim, _runs(f"c{rep}.{kind}", n), concurrency, phases[(kind, "concurrent")]
            )
    return phases


# -- batched: n singles in a row against one claim_many ------------------------------------
SINGLES, BATCH = "singles", "claim_many"


async def _timed_claims(store: Backend, variant: str, requests: list[ClaimRequest]) -> int:
    """Nanoseconds for ``requests`` sent as ``variant``; checks every answer is one outcome."""
    gc.collect()
    start = time.perf_counter_ns()
    if variant == BATCH:
        answers = await store.claim_many(requests)
    else:
        answers = [await store.claim(request) for request in requests]
    elapsed = time.perf_counter_ns() - start
    outcomes = {answer.outcome for answer in answers}
    if len(answers) != len(requests) or len(outcomes) != 1:
        raise AssertionError(f"{variant}: {len(answers)} answers, outcomes {outcomes}")
    return elapsed


async def measure_batched(store: Backend, n: int, repeats: int) -> dict[tuple[str, str], list[int]]:
    """Per variant and path (win, lose), the elapsed ns of each repeat."""
    samples: dict[tuple[str, str], list[int]] = {
        (v, p): [] for v in (SINGLES, BATCH) for p in ("win", "lose")
    }
    warm = [_request(job, slot, "w") for job, slot in _runs("warm.batch", 100)]
    await store.claim_many(warm)  # warm-up, not measured
    order = [SINGLES, BATCH]
    for rep in range(repeats):
        for variant in order[rep % 2 :] + order[: rep % 2]:
            runs = _runs(f"b{rep}.{variant}", n)
            wins = [_request(job, slot, secrets.token_hex(16)) for job, slot in runs]
            samples[(variant, "win")].append(await _timed_claims(store, variant, wins))
            losses = [_request(job, slot, secrets.token_hex(16)) for job, slot in runs]
            samples[(variant, "lose")].append(await _timed_claims(store, variant, losses))
    return samples


def report_batched(
    broker: str, samples: dict[tuple[str, str], list[int]], n: int, repeats: int
) -> None:
    rows: list[tuple[Any, ...]] = []
    for path in ("win", "lose"):
        for variant in (SINGLES, BATCH):
            elapsed = samples[(variant, path)]
            rates = [n / (ns / 1e9) for ns in elapsed]
            rows.append(
                (
                    path,
                    f"{n} x claim" if variant == SINGLES else f"claim_many({n})",
                    statistics.median(elapsed) / 1e6,
                    f"{min(elapsed) / 1e6:.1f}-{max(elapsed) / 1e6:.1f}",
                    statistics.median(rates),
                )
            )
        single, batch = samples[(SINGLES, path)], samples[(BATCH, path)]
        ratio = ratio_summary([a / b for a, b in zip(single, batch, strict=True)])
        rows.append((path, "singles / claim_many", ratio, "", ""))
    print_table(
        f"{broker}: {n} claims in a row vs one claim_many, {repeats} interleaved repeats",
        ("path", "variant", "ms (median)", "ms (min-max)", "claims/s (median)"),
        rows,
    )


def report(broker: str, phases: dict[tuple[str, str], Phase], n: int, repeats: int, c: int) -> None:
    rows: list[tuple[Any, ...]] = []
    for kind in ("backend", "raw"):
        label = f"{broker} backend" if kind == "backend" else f"raw {broker}"
        for path in ("win", "lose", "concurrent"):
            phase = phases[(kind, path)]
            p50, p99, worst = summary_ns(phase.latencies_ns, US)
            shown = f"win, {c} in flight" if path == "concurrent" else path
            rows.append((label, shown, statistics.median(phase.rates), p50, p99, worst))
    print_table(
        f"{broker}: {n} claims x {repeats} interleaved repeats per variant and path",
        ("variant", "path", "claims/s (median)", "p50 us", "p99 us", "max us"),
        rows,
    )
    ratios = []
    for path in ("win", "lose", "concurrent"):
        a, b = phases[("backend", path)].elapsed_ns, phases[("raw", path)].elapsed_ns
        ratios.append((path, ratio_summary([x / y for x, y in zip(a, b, strict=True)])))
    print_table(
        f"{broker}: time ratio backend / raw, per repeat (>1: the backend is slower)",
        ("path", "ratio median (min-max, n)"),
        ratios,
    )


async def bench(
    broker: str, opener: Callable[[], Awaitable[Pair]], args: argparse.Namespace
) -> bool:
    try:
        pair = await opener()
    except Exception as exc:
        print(f"\n{broker}: skipped, the broker does not answer ({type(exc).__name__}: {exc})")
        return False
    phases, batched = None, None
    try:
        if args.part in (None, "single"):
            phases = await measure(pair, args.n, args.repeats, args.concurrency)
        if args.part in (None, "batched") and args.batch > 0:
            batched = await measure_batched(pair.store, args.batch, args.repeats)
    finally:
        await pair.close()
    if phases is not None:
        report(broker, phases, args.n, args.repeats, args.concurrency)
    if batched is not None:
        report_batched(broker, batched, args.batch, args.repeats)
    return True


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.broker_claims", description=__doc__)
    parser.add_argument("--n", type=int, default=500, help="claims per variant, path and repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=64, help="claims in flight")
    parser.add_argument("--only", choices=("rabbitmq", "nats"), help="one broker only")
    parser.add_argument("--batch", type=int, default=1000, help="claims per claim_many (0: none)")
    parser.add_argument("--part", choices=("single", "batched"), help="one part only")
    args = parser.parse_args(argv)
    print(f"== broker claims ==\n{machine()}")
    print(f"RabbitMQ: {RABBITMQ_URL.split('@')[-1]}  NATS: {NATS_URL.split('@')[-1]}")

    async def run() -> None:
        for broker, opener in (("rabbitmq", open_rabbitmq), ("nats", open_nats)):
            if args.only in (None, broker):
                await bench(broker, opener, args)

    asyncio.run(run())


if __name__ == "__main__":
    main()
