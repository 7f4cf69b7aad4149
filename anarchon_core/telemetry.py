"""Metrics and traces: Prometheus and OpenTelemetry, each used only when installed.

The engine reports every event of a run's life to one :class:`Telemetry` per started
scheduler. It always keeps the plain counters that ``Scheduler.stats`` shows, and
forwards each event to

- ``prometheus_client`` (the ``anarchon[prometheus]`` extra): counters, histograms
  and gauges named ``anarchon_*``, labelled by job (its store name, in the label
  ``job_name``) and a bounded word (outcome, status, kind, operation) — never by slot
  or instance, so that their number stays that of the jobs;
- ``opentelemetry-api`` (the ``anarchon[otel]`` extra): one span ``anarchon.run`` per
  handler call, current while the handler runs so that the handler's own spans nest
  under it.

Which of them is used is decided once, when the :class:`Telemetry` is built: a
missing package costs a no-op method call per event, nothing more. The metrics are
created once per process and registry, so any number of schedulers (and restarts of
one) share them; Prometheus adds the ``instance`` of each scraped process itself.

The label is ``job_name``, not ``job``: Prometheus sets ``job`` (and ``instance``)
on every scraped series itself and would rename ours to ``exported_job``.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections import Counter
from collections.abc import Iterable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from .records import Status

if TYPE_CHECKING:
    from opentelemetry.trace import Span, TracerProvider
    from prometheus_client import CollectorRegistry

    from .context import RunContext

__all__ = ["METRICS", "SPAN_NAME", "TRACER_NAME", "RunSpan", "Telemetry"]

#: The name of the span of one handler call, and of the tracer that starts it.
SPAN_NAME: Final = "anarchon.run"
TRACER_NAME: Final = "anarchon"

#: Every metric (as exposed: counters with their ``_total``) and its labels.
METRICS: Final[dict[str, tuple[str, ...]]] = {
    "anarchon_claims_total": ("job_name", "outcome"),
    "anarchon_takeovers_total": ("job_name", "outcome"),
    "anarchon_runs_total": ("job_name", "status"),
    "anarchon_fenced_total": ("job_name", "kind"),
    "anarchon_lost_leases_total": ("job_name",),
    "anarchon_handed_over_total": ("job_name",),
    "anarchon_abandoned_total": ("job_name",),
    "anarchon_not_started_total": ("job_name", "reason"),
    "anarchon_store_errors_total": ("job_name", "operation"),
    "anarchon_store_retries_total": ("operation",),
    "anarchon_claim_latency_seconds": ("job_name",),
    "anarchon_lateness_seconds": ("job_name",),
    "anarchon_run_duration_seconds": ("job_name",),
    "anarchon_last_success_timestamp_seconds": ("job_name",),
    "anarchon_job_interval_seconds": ("job_name",),
    "anarchon_fingerprint_mismatch": ("job_name",),
    "anarchon_store_clock_skew_seconds": (),
}

CLAIM_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
LATENESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1800,
    3600,
)


@functools.cache
def _prometheus_available() -> bool:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _otel_available() -> bool:
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


class _NoMetrics:
    """What the engine reports to when ``prometheus_client`` is not installed."""

    def claim(self, job: str, outcome: str, latency_s: float | None) -> None:
        pass

    def takeover(self, job: str, outcome: str) -> None:
        pass

    def run_started(self, job: str, lateness_s: float) -> None:
        pass

    def run_ended(self, job: str, status: str, duration_s: float, at_s: float) -> None:
        pass

    def event(self, name: str, job: str, label: str | None = None, amount: int = 1) -> None:
        pass

    def store_error(self, job: str, operation: str) -> None:
        pass

    def store_retry(self, operation: str) -> None:
        pass

    def gauge(self, name: str, job: str | None, value: float) -> None:
        pass


class _PrometheusMetrics(_NoMetrics):
    """The ``anarchon_*`` metrics of one registry (see :data:`METRICS`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter as PromCounter
        from prometheus_client import Gauge, Histogram

        def counter(name: str, doc: str) -> PromCounter:
            labels = METRICS[name]
            return PromCounter(name.removesuffix("_total"), doc, labels, registry=registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, METRICS[name], registry=registry, buckets=buckets)

        self.claims = counter("anarchon_claims_total", "Claim answers of the store, by outcome.")
        self.takeovers = counter(
            "anarchon_takeovers_total", "Takeover and retry answers of the store, by outcome."
        )
        self.runs = counter(
            "anarchon_runs_total", "Attempts whose outcome this instance recorded, by status."
        )
        self.counters: dict[str, PromCounter] = {
            "fenced": counter(
                "anarchon_fenced_total",
                "Heartbeats and finish marks the store rejected (stale token), by kind.",
            ),
            "lost_lease": counter(
                "anarchon_lost_leases_total",
                "Attempts that lost their lease (fenced or self-fenced) while running.",
            ),
            "handed_over": counter(
                "anarchon_handed_over_total", "Attempts released to a backup at stop()."
            ),
            "abandoned": counter(
                "anarchon_abandoned_total",
                "Slots not even claimed: past their horizon by the local clock.",
            ),
            "not_started": counter(
                "anarchon_not_started_total",
                "Won attempts not started: the store's answer came past the self-fence "
                "deadline or the slot's horizon, by reason.",
            ),
        }
        self.store_errors = counter(
            "anarchon_store_errors_total", "Failed store calls, by operation."
        )
        self.store_retries = counter(
            "anarchon_store_retries_total", "Store calls repeated after a failure, by operation."
        )
        self.claim_latency = histogram(
            "anarchon_claim_latency_seconds",
            "Round trip of one claim to the store.",
            CLAIM_LATENCY_BUCKETS,
        )
        self.lateness = histogram(
            "anarchon_lateness_seconds",
            "From a run's slot to its handler's start, every attempt.",
            LATENESS_BUCKETS,
        )
        self.duration = histogram(
            "anarchon_run_duration_seconds",
            "Handler time of the attempts counted in anarchon_runs_total.",
            DURATION_BUCKETS,
        )
        self.last_success = Gauge(
            "anarchon_last_success_timestamp_seconds",
            "When this instance last recorded a successful run (Unix time).",
            METRICS["anarchon_last_success_timestamp_seconds"],
            registry=registry,
            multiprocess_mode="max",
        )
        self.gauges: dict[str, Gauge] = {
            "interval": Gauge(
                "anarchon_job_interval_seconds",
                "The gap between the job's previous slot and its next one.",
                METRICS["anarchon_job_interval_seconds"],
                registry=registry,
                multiprocess_mode="max",
            ),
            "fingerprint_mismatch": Gauge(
                "anarchon_fingerprint_mismatch",
                "1 while live instances disagree about the job's schedule or options.",
                METRICS["anarchon_fingerprint_mismatch"],
                registry=registry,
                multiprocess_mode="livemax",
            ),
        }
        self._children: dict[tuple[Any, ...], Any] = {}
        self.skew = Gauge(
            "anarchon_store_clock_skew_seconds",
            "The last measured skew of the store's clock (store − local).",
            registry=registry,
            multiprocess_mode="livemostrecent",
        )

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once: a run reports six of them.

        ``labels()`` validates and stringifies its arguments on every call (about a
        tenth of the engine's CPU per run at 1,000 runs/s); the child it returns never
        changes for the registry's life.
        """
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def claim(self, job: str, outcome: str, latency_s: float | None) -> None:
        self._child(self.claims, job, outcome).inc()
        if latency_s is not None:
            self._child(self.claim_latency, job).observe(latency_s)

    def takeover(self, job: str, outcome: str) -> None:
        self._child(self.takeovers, job, outcome).inc()

    def run_started(self, job: str, lateness_s: float) -> None:
        self._child(self.lateness, job).observe(max(lateness_s, 0.0))

    def run_ended(self, job: str, status: str, duration_s: float, at_s: float) -> None:
        self._child(self.runs, job, status).inc()
        self._child(self.duration, job).observe(duration_s)
        if status == Status.SUCCESS:
            self._child(self.last_success, job).set(at_s)

    def event(self, name: str, job: str, label: str | None = None, amount: int = 1) -> None:
        metric = self.counters[name]
        child = self._child(metric, job, label) if label is not None else self._child(metric, job)
        child.inc(amount)

    def store_error(self, job: str, operation: str) -> None:
        self._child(self.store_errors, job, operation).inc()

    def store_retry(self, operation: str) -> None:
        self._child(self.store_retries, operation).inc()

    def gauge(self, name: str, job: str | None, value: float) -> None:
        if job is None:
            self.skew.set(value)
        else:
            self._child(self.gauges[name], job).set(value)


_NO_METRICS = _NoMetrics()
_metrics_lock = threading.Lock()
_metrics: weakref.WeakKeyDictionary[CollectorRegistry, _PrometheusMetrics] = (
    weakref.WeakKeyDictionary()
)


def _metrics_for(registry: CollectorRegistry | None) -> _NoMetrics:
    """The metrics of ``registry`` (default: the process's), created at the first call."""
    if not _prometheus_available():
        return _NO_METRICS
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    with _metrics_lock:
        metrics = _metrics.get(registry)
        if metrics is None:
            metrics = _metrics[registry] = _PrometheusMetrics(registry)
        return metrics


class RunSpan:
    """The span of one handler call; a do-nothing stand-in without OpenTelemetry.

    Used as a context manager around the call, during which the span is current;
    :meth:`end` sets the outcome. Left by an exception (the task was cancelled at
    stop) without :meth:`end`, the outcome is ``interrupted``.
    """

    __slots__ = ()

    def __enter__(self) -> RunSpan:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def end(
        self, outcome: str, error: BaseException | None = None, reason: str | None = None
    ) -> None:
        """Record the call's outcome (a status word) and, for a failure, its exception."""


_NO_SPAN = RunSpan()


class _Otel:
    """The parts of ``opentelemetry-api`` the spans use, imported once."""

    def __init__(self, tracer_provider: TracerProvider | None) -> None:
        from opentelemetry import trace

        self.tracer = trace.get_tracer(TRACER_NAME, _version(), tracer_provider=tracer_provider)
        self._explicit = tracer_provider is not None
        self._get_provider = trace.get_tracer_provider
        self._proxy = trace.ProxyTracerProvider
        self.use_span = trace.use_span
        self.status = trace.Status
        self.error = trace.StatusCode.ERROR
        # Each run is the root of a trace of its own, not a child of whatever span was
        # current when the scheduler started.
        self.root = trace.set_span_in_context(trace.INVALID_SPAN)

    @property
    def live(self) -> bool:
        """False while no SDK is configured: every span would be a no-op, so make none.

        The global provider is looked up per run, so an SDK set up after the scheduler
        started is used from then on (as the API's own proxy tracer would).
        """
        return self._explicit or not isinstance(self._get_provider(), self._proxy)


class _OtelRunSpan(RunSpan):
    __slots__ = ("_ended", "_otel", "_scope", "_span")

    def __init__(self, otel: _Otel, span: Span) -> None:
        self._otel = otel
        self._span = span
        self._ended = False
        self._scope: AbstractContextManager[Span] | None = None

    def __enter__(self) -> RunSpan:
        self._scope = self._otel.use_span(
            self._span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )
        self._scope.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._scope is not None:
            self._scope.__exit__(None, None, None)  # only makes the span not current again
        if not self._ended:  # left by an exception: the task was cancelled at stop
            reason = "stopping" if isinstance(exc, asyncio.CancelledError) else repr(exc)
            self.end(Status.INTERRUPTED, reason=reason)

    def end(
        self, outcome: str, error: BaseException | None = None, reason: str | None = None
    ) -> None:
        if self._ended:
            return
        self._ended = True
        span = self._span
        span.set_attribute("anarchon.outcome", str(outcome))
        if reason:
            span.set_attribute("anarchon.reason", reason)
        if outcome == Status.FAILED:
            if error is not None:
                span.record_exception(error)
            description = f"{type(error).__name__}: {error}" if error is not None else reason
            span.set_status(self._otel.status(self._otel.error, description))
        span.end()


class Telemetry:
    """Where the engine reports events: ``stats`` counters, Prometheus, OpenTelemetry.

    ``registry`` is the ``prometheus_client.CollectorRegistry`` to register the
    metrics in (default: the process's ``REGISTRY``); ``tracer_provider`` an
    OpenTelemetry ``TracerProvider`` (default: the global one). ``metrics=False`` or
    ``traces=False`` turns either off although its package is installed.
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        tracer_provider: TracerProvider | None = None,
        metrics: bool = True,
        traces: bool = True,
    ) -> None:
        #: Plain counters of this instance since start (``Scheduler.stats``).
        self.stats: Counter[str] = Counter()
        self.metrics = _metrics_for(registry) if metrics else _NO_METRICS
        self._otel = _Otel(tracer_provider) if traces and _otel_available() else None

    @property
    def prometheus(self) -> bool:
        """True when the events reach Prometheus metrics."""
        return self.metrics is not _NO_METRICS

    @property
    def tracing(self) -> bool:
        """True when handler calls get OpenTelemetry spans."""
        return self._otel is not None

    # -- claims and takeovers -------------------------------------------------------
    def claim(self, job: str, outcome: str, latency_s: float | None) -> None:
        """One answer to a claim (``latency_s`` is ``None`` when the store never answered)."""
        self.stats[f"claim_{outcome}"] += 1
        self.metrics.claim(job, outcome, latency_s)

    def takeover(self, job: str, outcome: str) -> None:
        """One answer to a takeover or retry claim of the backup sweep."""
        self.stats[f"takeover_{outcome}"] += 1
        self.metrics.takeover(job, outcome)

    def abandoned(self, job: str, count: int = 1) -> None:
        """Slots not claimed at all: past their horizon by the local clock."""
        self.stats["abandoned"] += count
        self.metrics.event("abandoned", job, amount=count)

    def not_started(self, job: str, reason: str) -> None:
        """A won attempt not started: its answer came too late (``fence`` or ``horizon``)."""
        self.stats[f"not_started_{reason}"] += 1
        self.metrics.event("not_started", job, reason)

    # -- runs -------------------------------------------------------------------------
    def run_started(self, job: str, lateness_s: float) -> None:
        """A won attempt starts; ``lateness_s`` = start − slot."""
        self.metrics.run_started(job, lateness_s)

    def run_span(self, job: str, ctx: RunContext) -> RunSpan:
        """A context manager around one handler call: its span, current while it runs."""
        otel = self._otel
        if otel is None or not otel.live:
            return _NO_SPAN
        span = otel.tracer.start_span(
            SPAN_NAME,
            context=otel.root,
            attributes={
                "anarchon.job": job,
                "anarchon.slot": ctx.slot,
                "anarchon.attempt": ctx.attempt,
                "anarchon.instance": ctx.instance_id,
                "anarchon.origin": str(ctx.origin),
            },
        )
        return _OtelRunSpan(otel, span)

    def run_ended(self, job: str, status: str, duration_s: float, at_ms: int) -> None:
        """This instance recorded an attempt's outcome (``at_ms``: when, epoch ms)."""
        self.stats[f"run_{status}"] += 1
        self.metrics.run_ended(job, status, duration_s, at_ms / 1000)

    def fenced(self, job: str, kind: str) -> None:
        """The store rejected a ``heartbeat`` or a ``finish`` of a stale attempt."""
        self.stats[f"fenced_{kind}"] += 1
        self.metrics.event("fenced", job, kind)

    def lost_lease(self, job: str) -> None:
        self.stats["lost_lease"] += 1
        self.metrics.event("lost_lease", job)

    def handed_over(self, job: str) -> None:
        self.stats["handed_over"] += 1
        self.metrics.event("handed_over", job)

    # -- the store and the cluster -----------------------------------------------------
    def store_error(self, operation: str, job: str | None = None) -> None:
        self.stats["store_errors"] += 1
        self.metrics.store_error(job or "", operation)

    def store_retry(self, operation: str) -> None:
        self.stats["store_retries"] += 1
        self.metrics.store_retry(operation)

    def job_interval(self, job: str, seconds: float) -> None:
        self.metrics.gauge("interval", job, seconds)

    def skew(self, skew_ms: int) -> None:
        self.metrics.gauge("skew", None, skew_ms / 1000)

    def fingerprints(self, jobs: Iterable[str], mismatched: set[str], *, changed: bool) -> None:
        """The result of one comparison of the live instances' job fingerprints."""
        if changed and mismatched:
            self.stats["fingerprint_mismatch"] += 1
        for job in jobs:
            self.metrics.gauge("fingerprint_mismatch", job, 1.0 if job in mismatched else 0.0)


@functools.cache
def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("anarchon")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "unknown"
