"""Metrics, traces and log fields of the engine, in one process on the memory store."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import REGISTRY, CollectorRegistry
from test_scheduler import wait_for

from anarchon_core import MemoryBackend, RunContext, Scheduler, Status
from anarchon_core.backend import Lease
from anarchon_core.records import HistoryQuery, Origin, RunRecord
from anarchon_core.telemetry import METRICS, SPAN_NAME, Telemetry

ALLOWED_LABELS = {"job_name", "outcome", "status", "kind", "operation", "le"}


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def history(backend: MemoryBackend, job: str | None = None) -> list[RunRecord]:
    return await backend.history(HistoryQuery(job=job, limit=10_000))


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A tracer provider of its own (the global one can be set once per process)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def run_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == SPAN_NAME]


def test_counters_match_the_history_after_slots_and_one_takeover(
    monkeypatch: pytest.MonkeyPatch, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """Two instances, three jobs (succeeding, failing, one frozen runner taken over)."""
    provider, exporter = spans
    registry = CollectorRegistry()
    backend = MemoryBackend()
    frozen: list[int] = []  # the slot of the first `long` run: its runner freezes

    real_heartbeat = backend.heartbeat

    async def heartbeat(leases: Sequence[Lease], lease_ms: int) -> list[bool]:
        if any(lease.job == "long" and [lease.slot] == frozen for lease in leases):
            raise ConnectionError("the frozen runner's heartbeats never arrive")
        return await real_heartbeat(leases, lease_ms)

    monkeypatch.setattr(backend, "heartbeat", heartbeat)

    def make(instance: str) -> Scheduler:
        s = Scheduler(
            backend,
            instance_id=instance,
            heartbeat_ms=100,  # a healthy runner keeps its lease through 500 ms stalls
            lease_ms=600,
            jitter_ms=0,
            metrics_registry=registry,
            tracer_provider=provider,
        )

        @s.every("tick", "100ms")
        async def tick(ctx: RunContext) -> None:
            pass

        @s.every("flaky", "300ms")
        def flaky(ctx: RunContext) -> None:
            raise ValueError("always")

        @s.every("long", "1s")
        async def long(ctx: RunContext) -> None:
            if not frozen:
                frozen.append(ctx.slot)
            if ctx.slot == frozen[0] and ctx.attempt == 1:
                await asyncio.sleep(30)  # until cancelled: its lease is lost
            await asyncio.sleep(0.02)

        return s

    a, b = make("A"), make("B")

    async def main() -> None:
        await a.start()
        await wait_for(lambda: _has(backend, "long", 1, Status.RUNNING), timeout=3)
        await b.start()
        await wait_for(lambda: _has(backend, "long", 2, Status.SUCCESS), timeout=3)
        await asyncio.sleep(0.7)
        await a.stop()
        await b.stop()

    run(main())
    records = run(history(backend))
    by = Counter((r.job, r.status) for r in records)
    assert by[("long", Status.INTERRUPTED)] == 1
    assert by[("tick", Status.SUCCESS)] >= 3  # how many depends on the load; all are compared
    assert by[("flaky", Status.FAILED)] >= 3
    assert a.stats["lost_lease"] == 1

    stats = Counter(a.stats) + Counter(b.stats)
    for job in ("tick", "flaky", "long"):
        mine = [r for r in records if r.job == job]
        started = [r for r in mine if r.attempt >= 1]
        won = [r for r in mine if r.attempt == 1 and r.origin == Origin.SCHEDULE]
        taken_over = [r for r in mine if r.attempt >= 2]
        for status in (Status.SUCCESS, Status.FAILED):
            recorded = sum(r.status == status for r in mine)
            assert value(registry, "anarchon_runs_total", job_name=job, status=status) == recorded
        assert value(registry, "anarchon_claims_total", job_name=job, outcome="won") == len(won)
        assert value(registry, "anarchon_takeovers_total", job_name=job, outcome="won") == len(
            taken_over
        )
        skipped = sum(r.status == Status.SKIPPED for r in mine)
        assert value(registry, "anarchon_claims_total", job_name=job, outcome="skipped") == skipped
        ended = sum(r.status in (Status.SUCCESS, Status.FAILED) for r in mine)
        assert value(registry, "anarchon_run_duration_seconds_count", job_name=job) == ended
        assert value(registry, "anarchon_lateness_seconds_count", job_name=job) == len(started)
        answers = sum(
            value(registry, "anarchon_claims_total", job_name=job, outcome=o)
            for o in ("won", "taken", "skipped", "paused", "expired", "early")
        )
        assert value(registry, "anarchon_claim_latency_seconds_count", job_name=job) == answers
        assert answers >= len(won)

    assert value(registry, "anarchon_takeovers_total", job_name="long", outcome="won") == 1
    assert value(registry, "anarchon_lost_leases_total", job_name="long") == 1
    assert value(registry, "anarchon_store_errors_total", job_name="", operation="heartbeat") >= 1
    assert value(registry, "anarchon_job_interval_seconds", job_name="tick") == pytest.approx(0.1)
    assert value(registry, "anarchon_job_interval_seconds", job_name="long") == pytest.approx(1.0)
    last = value(registry, "anarchon_last_success_timestamp_seconds", job_name="tick")
    assert time.time() - 2 < last <= time.time()
    assert value(registry, "anarchon_last_success_timestamp_seconds", job_name="flaky") == 0

    # Scheduler.stats and the metrics count the same events.
    for outcome in ("won", "taken", "skipped"):
        total = sum(
            value(registry, "anarchon_claims_total", job_name=j, outcome=outcome)
            for j in ("tick", "flaky", "long")
        )
        assert stats[f"claim_{outcome}"] == total
    assert stats["run_success"] == by[("tick", Status.SUCCESS)] + by[("long", Status.SUCCESS)]
    assert stats["run_failed"] == by[("flaky", Status.FAILED)]
    assert stats["takeover_won"] == 1

    # Bounded labels: no slot, no instance, only the documented label names.
    names = set()
    for metric in registry.collect():
        for sample in metric.samples:
            names.add(metric.name)
            assert set(sample.labels) <= ALLOWED_LABELS, sample
            assert not {"A", "B"} & set(sample.labels.values()), sample
            assert not any(str(r.slot) in sample.labels.values() for r in records), sample
    assert {n.removesuffix("_total") for n in METRICS} >= names

    # One span per attempt, with the outcome the history recorded.
    by_attempt = {(s.attributes["anarchon.job"], s.attributes["anarchon.slot"],
                   s.attributes["anarchon.attempt"]): s for s in run_spans(exporter)}  # fmt: skip
    assert len(by_attempt) == len(run_spans(exporter))
    assert set(by_attempt) == {(r.job, r.slot, r.attempt) for r in records if r.attempt >= 1}
    for r in records:
        if r.attempt >= 1:
            span = by_attempt[(r.job, r.slot, r.attempt)]
            assert span.attributes is not None
            assert span.attributes["anarchon.outcome"] == r.status
            assert span.attributes["anarchon.instance"] == r.instance_id
            assert span.attributes["anarchon.origin"] == r.origin


async def _has(backend: MemoryBackend, job: str, attempt: int, status: Status) -> bool:
    return any(r.attempt == attempt and r.status == status for r in await history(backend, job))


def test_spans_nest_handler_spans_and_record_failures(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    user = provider.get_tracer("user-code")
    backend = MemoryBackend()

    async def main() -> None:
        s = Scheduler(
            backend,
            instance_id="solo",
            heartbeat_ms=50,
            jitter_ms=0,
            metrics_registry=CollectorRegistry(),
            tracer_provider=provider,
        )

        @s.every("async.ok", "200ms")
        async def async_ok(ctx: RunContext) -> None:
            with user.start_as_current_span("inner.async"):
                await asyncio.sleep(0)

        @s.every("sync.ok", "200ms")
        def sync_ok(ctx: RunContext) -> None:
            with user.start_as_current_span("inner.sync"):
                pass

        @s.every("boom", "200ms")
        async def boom(ctx: RunContext) -> None:
            raise RuntimeError("kaput")

        @s.every("slow", "200ms", timeout_ms=20)
        async def slow(ctx: RunContext) -> None:
            await asyncio.sleep(5)

        with user.start_as_current_span("app.startup"):  # runs must not nest under it
            await s.start()
        await wait_for(lambda: _has(backend, "sync.ok", 1, Status.SUCCESS))
        await wait_for(lambda: _has(backend, "slow", 1, Status.FAILED))
        await s.stop()

    run(main())
    finished = exporter.get_finished_spans()
    runs = {s.context.span_id: s for s in run_spans(exporter)}
    for inner_name, job in (("inner.async", "async.ok"), ("inner.sync", "sync.ok")):
        inner = [s for s in finished if s.name == inner_name]
        assert inner, f"no {inner_name} span"
        for child in inner:
            assert child.parent is not None, f"{inner_name} is not nested"
            parent = runs[child.parent.span_id]
            assert parent.attributes is not None
            assert parent.attributes["anarchon.job"] == job
            assert parent.attributes["anarchon.outcome"] == "success"
            assert parent.status.status_code == StatusCode.UNSET
    boom = [s for s in runs.values() if s.attributes and s.attributes["anarchon.job"] == "boom"]
    assert boom
    assert boom[0].status.status_code == StatusCode.ERROR
    assert boom[0].status.description == "RuntimeError: kaput"
    assert [e.name for e in boom[0].events] == ["exception"]
    assert boom[0].events[0].attributes is not None
    assert boom[0].events[0].attributes["exception.type"] == "RuntimeError"
    slow = [s for s in runs.values() if s.attributes and s.attributes["anarchon.job"] == "slow"]
    assert slow and slow[0].status.status_code == StatusCode.ERROR
    assert slow[0].attributes is not None
    assert slow[0].attributes["anarchon.reason"] == "timed out after 20 ms"
    assert all(span.parent is None for span in runs.values()), "each run is a trace of its own"
    first = next(iter(runs.values()))
    assert first.attributes is not None
    assert set(first.attributes) >= {
        "anarchon.job",
        "anarchon.slot",
        "anarchon.attempt",
        "anarchon.instance",
        "anarchon.origin",
        "anarchon.outcome",
    }
    assert first.attributes["anarchon.instance"] == "solo"
    assert first.instrumentation_scope is not None
    assert first.instrumentation_scope.name == "anarchon"


def test_schedulers_share_the_default_registry() -> None:
    """Any number of schedulers (and restarts) in one process: no duplicated timeseries."""
    backend = MemoryBackend()

    async def main() -> None:
        schedulers = [Scheduler(backend, instance_id=f"i{n}", jitter_ms=0) for n in range(2)]
        for s in schedulers:
            s.every("shared.default", "100ms", _noop)
        for wanted in (1, 2):
            for s in schedulers:
                await s.start()
            await wait_for(functools.partial(_successes, backend, wanted))
            for s in schedulers:
                await s.stop()

    before = value(REGISTRY, "anarchon_runs_total", job_name="shared.default", status="success")
    run(main())
    after = value(REGISTRY, "anarchon_runs_total", job_name="shared.default", status="success")
    successes = sum(r.status == Status.SUCCESS for r in run(history(backend)))
    assert after - before == successes >= 2


async def _noop(ctx: RunContext) -> None:
    pass


async def _successes(backend: MemoryBackend, at_least: int) -> bool:
    return sum(r.status == Status.SUCCESS for r in await history(backend)) >= at_least


def test_log_records_carry_the_run_fields(caplog: pytest.LogCaptureFixture) -> None:
    backend = MemoryBackend()

    async def main() -> None:
        s = Scheduler(backend, instance_id="logs", jitter_ms=0, heartbeat_ms=50)

        @s.every("talk", "100ms")
        def talk(ctx: RunContext) -> None:
            ctx.logger.info("hello from the handler", extra={"order": 7})

        @s.every("fail", "100ms")
        async def fail(ctx: RunContext) -> None:
            raise ValueError("no")

        await s.start()
        await wait_for(lambda: _has(backend, "talk", 1, Status.SUCCESS))
        await wait_for(lambda: _has(backend, "fail", 1, Status.FAILED))
        await s.stop()

    with caplog.at_level(logging.INFO, logger="anarchon"):
        run(main())
    mine = [r for r in caplog.records if r.name.startswith("anarchon")]
    assert len(mine) >= 4
    for record in mine:
        for field in ("job", "slot", "attempt", "instance"):
            assert hasattr(record, field), (field, record.getMessage())
        assert record.__dict__["instance"] == "logs"
    hello = [r for r in mine if r.getMessage() == "hello from the handler"]
    assert hello
    assert hello[0].__dict__["job"] == "talk"
    assert hello[0].__dict__["attempt"] == 1
    assert hello[0].__dict__["order"] == 7
    assert isinstance(hello[0].__dict__["slot"], int)
    failed = [r for r in mine if "run failed" in r.getMessage()]
    assert failed and failed[0].__dict__["job"] == "fail"
    assert failed[0].levelno == logging.ERROR  # a handler that raised: for error trackers
    assert failed[0].exc_info is not None


def test_telemetry_can_be_turned_off() -> None:
    telemetry = Telemetry(metrics=False, traces=False)
    assert not telemetry.prometheus and not telemetry.tracing
    telemetry.claim("job", "won", 0.01)
    telemetry.run_ended("job", "success", 0.5, 0)
    with telemetry.run_span("job", _ctx()) as span:
        span.end("success")
    assert telemetry.stats == {"claim_won": 1, "run_success": 1}


def _ctx() -> RunContext:
    async def make() -> RunContext:
        return RunContext(
            job="job",
            slot=0,
            attempt=1,
            instance_id="x",
            origin=Origin.SCHEDULE,
            loop=asyncio.get_running_loop(),
            logger=logging.getLogger("anarchon"),
        )

    return run(make())


ABSENT = """
import asyncio, json, sys
sys.modules["prometheus_client"] = None  # import fails: the extras are not installed
sys.modules["opentelemetry"] = None
from anarchon_core import MemoryBackend, Scheduler
from anarchon_core.telemetry import Telemetry

async def main():
    s = Scheduler(MemoryBackend(), instance_id="bare", jitter_ms=0, heartbeat_ms=50)
    ran = []
    s.every("bare", "100ms", lambda ctx: ran.append(ctx.slot))
    await s.start()
    await asyncio.sleep(0.45)
    await s.stop()
    t = Telemetry()
    print(json.dumps({"stats": dict(s.stats), "ran": len(ran),
                      "prometheus": t.prometheus, "tracing": t.tracing}))

asyncio.run(main())
"""


def test_without_the_extras_everything_still_runs() -> None:
    """``prometheus_client`` and ``opentelemetry`` absent: no metrics, no spans, no error."""
    out = subprocess.run(
        [sys.executable, "-c", ABSENT], capture_output=True, text=True, timeout=60, check=True
    )
    result = json.loads(out.stdout)
    assert result["prometheus"] is False and result["tracing"] is False
    assert result["ran"] >= 2
    assert result["stats"]["claim_won"] == result["ran"]
    assert result["stats"]["run_success"] == result["ran"]
    assert "Traceback" not in out.stderr
