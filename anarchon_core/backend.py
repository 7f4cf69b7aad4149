"""The backend contract: what a store must guarantee for the scheduler to be correct.

A backend stores two things. The *run* of ``(job, slot)``: the single record every
instance contends for, holding the current attempt, its token, its lease expiry and
its state. The *history*: one record per attempt, keyed ``(job, slot, attempt)``
(attempt 0 for slots that ran nothing). Every operation below is one atomic
decision of the store; "now" always means the store's clock where it has one.

Two capability levels exist (:class:`Capabilities`). *Lease* backends implement
every method. *Claim-only* backends implement :meth:`Backend.claim` and
:meth:`Backend.history` (and :meth:`Backend.finish` where they can record an
outcome); the base class answers the lease operations with
:class:`~anarchon_core.errors.CapabilityError`.

A new backend is one module implementing this class plus its scheme in
:mod:`anarchon_core.backends`; the conformance suite in ``tests/backends`` proves it.
Backends convert driver errors to :class:`~anarchon_core.errors.BackendUnavailable`
(retryable) or :class:`~anarchon_core.errors.BackendError` at their boundary.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from .errors import CapabilityError, ConfigurationError
from .names import validate_namespace
from .records import HistoryQuery, Origin, Outcome, RunRecord, Status
from .redact import brief

__all__ = [
    "DEFINITION_BACKENDS",
    "EARLY_TOLERANCE_MS",
    "LEASE_BACKENDS",
    "MAX_ERROR_CHARS",
    "NOT_STARTED",
    "PENDING",
    "SCHEMA_VERSION",
    "Backend",
    "Capabilities",
    "Claim",
    "ClaimRequest",
    "DueRun",
    "FinishRequest",
    "InstanceInfo",
    "Lease",
    "PruneScope",
    "StoredDefinition",
    "TakeoverRequest",
    "bound_error",
    "instance_json",
    "local_note",
    "overlap_reason",
    "wall_clock_ms",
]

T = TypeVar("T")

#: The layout version every store records; a store holding a newer one is refused.
SCHEMA_VERSION = 1

#: Named in the error a claim-only backend gives for a lease-only feature.
LEASE_BACKENDS = "sqlite://, postgresql://, redis://?strategy=lease"

#: Named in the error of a store that keeps no job definitions.
DEFINITION_BACKENDS = (
    "sqlite://, postgresql://, django:// (MySQL/MariaDB too), redis://?strategy=lease, nats://"
)

#: Largest ``error`` text kept in history, in characters.
MAX_ERROR_CHARS = 2000
#: A claim for a slot later than the store's now plus this is answered ``EARLY``.
EARLY_TOLERANCE_MS = 1000
#: The run state of a manual request that no instance has started yet (not a status).
PENDING = "pending"
#: The error of the attempt-0 record of a manual request that expired before it started.
NOT_STARTED = "not started within the claim horizon"


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def overlap_reason(slot: int) -> str:
    """The error of a ``skipped`` record: the run of the same job it overlapped.

    Every store writes this text inside its claim (SQL and Lua stores format it
    themselves, to the character): the slot in UTC, to the millisecond.
    """
    t = _EPOCH + dt.timedelta(milliseconds=slot)
    when = f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t:%H:%M:%S}.{t.microsecond // 1000:03d}Z"
    return f"overlapped the run of {when}, still running"


def wall_clock_ms() -> int:
    """The local wall clock in epoch ms: the store clock of stores that have none."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can promise (docs/guarantees.md, docs/architecture.md)."""

    lease: bool
    """Leases, heartbeats, takeover, fencing, overlap, catch-up and hand-over."""
    store_clock: bool
    """Expiry and the claim horizon are judged by the store's own clock."""
    finish: bool
    """The outcome of a run (success/failed) can be written after the claim."""
    finish_in_transaction: bool = False
    """:meth:`Backend.finish_in_transaction`: the outcome can commit inside the caller's
    own transaction on the store's database (the Django ORM's ``transactional=True``)."""


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """Ask to run ``(job, slot)``.

    ``job`` is the name as stored (namespace applied). The claim is accepted only
    while ``slot >= now - horizon_ms`` and ``slot <= now + 1000`` (early claims are
    answered :attr:`Outcome.EARLY`).
    """

    job: str
    slot: int
    origin: Origin
    token: str
    instance_id: str
    lease_ms: int
    horizon_ms: int
    skip_overlap: bool
    fingerprint: str = ""
    version: int | None = None
    """The stored definition's version the claiming replica planned with (``None``: a
    code job, not checked). Another version, or none, is answered ``STALE``."""


@dataclass(frozen=True, slots=True)
class StoredDefinition:
    """One job definition as a store keeps it: its store name, the version the store
    issued at its last change, and its JSON text (``None``: removed, a tombstone kept
    so that replicas reading changes since a version learn of the removal)."""

    job: str
    version: int
    body: str | None


@dataclass(frozen=True, slots=True)
class TakeoverRequest:
    """Ask to run attempt ``attempt + 1`` of a run whose attempt ``attempt`` is over.

    Succeeds only if the run is still at ``attempt`` (compare-and-set) and either its
    lease expired by the store's clock or its retry became due.
    """

    job: str
    slot: int
    attempt: int
    token: str
    instance_id: str
    lease_ms: int
    horizon_ms: int
    max_attempts: int
    skip_overlap: bool


@dataclass(frozen=True, slots=True)
class Claim:
    """The store's verdict. ``attempt`` is set when ``outcome`` is ``WON``."""

    outcome: Outcome
    attempt: int = 0
    store_now: int | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """What a runner holds: the attempt it runs and the token that proves it."""

    job: str
    slot: int
    attempt: int
    token: str


@dataclass(frozen=True, slots=True)
class FinishRequest:
    """One attempt's outcome for :meth:`Backend.finish_many` (see :meth:`Backend.finish`)."""

    lease: Lease
    status: Status
    error: str | None = None
    meta: dict[str, Any] | None = None
    retry_in_ms: int | None = None


@dataclass(frozen=True, slots=True)
class DueRun:
    """A run some instance must continue or start.

    ``expired``: its lease expired; ``retry``: its retry became due; ``manual``: a
    pending manual request (attempt 0) waiting for an instance that has the job.
    """

    job: str
    slot: int
    attempt: int
    origin: Origin
    reason: Literal["expired", "retry", "manual"]


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """One instance as the registry shows it (the dashboard and the CLI need only the store URL).

    ``jobs`` is the digest of the instance's job set: each job's store name and its
    definition fingerprint (``{"billing:sync": "0f3a9c1e5b7d2a64"}``), what the candidate
    ranking needs to find the instances that hold a job with the same definition. The
    jobs' schedules and options are in the store's job table (the stored definitions,
    which ``sync_code_jobs`` fills with the code jobs), not here: an entry stays a few
    hundred bytes plus a few dozen per job, since every ranking instance reads every
    entry every heartbeat.
    """

    instance_id: str
    host: str
    pid: int
    version: str
    started_at: int
    last_seen: int
    jobs: dict[str, str]
    skew_ms: int = 0
    """The instance's last measured clock skew, store − local (docs/guarantees.md)."""
    targets: tuple[str, ...] = ()
    """The targets the instance holds: a stored definition runs only where its target is."""

    def to_json(self) -> dict[str, Any]:
        """The JSON shape kept in stores and shown by the CLI and the API."""
        return {
            "instance_id": self.instance_id,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "started_at": self.started_at,
            "last_seen": self.last_seen,
            "jobs": self.jobs,
            "skew_ms": self.skew_ms,
            "targets": list(self.targets),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InstanceInfo:
        """Read :meth:`to_json`'s shape back (``skew_ms`` and ``targets`` may be missing:
        older writers). An older writer's ``jobs`` map each job to its whole spec (a dict
        with its ``fingerprint``): only the fingerprint is kept, so that replicas of both
        versions rank each other during a rolling upgrade."""
        return cls(
            instance_id=str(data["instance_id"]),
            host=str(data["host"]),
            pid=int(data["pid"]),
            version=str(data["version"]),
            started_at=int(data["started_at"]),
            last_seen=int(data["last_seen"]),
            jobs={str(job): _fingerprint_of(value) for job, value in dict(data["jobs"]).items()},
            skew_ms=int(data.get("skew_ms", 0)),
            targets=tuple(str(t) for t in data.get("targets", ())),
        )


def _fingerprint_of(value: object) -> str:
    """A job's fingerprint in a registry entry: the value itself, or an older writer's
    spec's ``fingerprint`` ('' where it has none)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        fingerprint = value.get("fingerprint")
        return fingerprint if isinstance(fingerprint, str) else ""
    return ""


@dataclass(frozen=True, slots=True)
class PruneScope:
    """The jobs a :meth:`Backend.prune` may touch: the given store names, one namespace, or all.

    A store is shared by services (each with its own ``namespace``) and each decides the
    retention of its own jobs, so pruning is scoped; only ``anarchon prune --all`` prunes
    every job. A namespace holds no ``:`` (:mod:`anarchon_core.names`), so the store
    names of namespace ``ns`` are exactly those starting with ``"ns:"``.
    """

    jobs: frozenset[str] | None = None
    """Only these store names (empty: nothing)."""
    prefix: str | None = None
    """Only the store names starting with this (``"{namespace}:"``)."""

    @classmethod
    def of(cls, jobs: Collection[str] | None = None, namespace: str | None = None) -> PruneScope:
        """Validate :meth:`Backend.prune`'s ``jobs`` and ``namespace`` (at most one of them).

        :raises ConfigurationError: both given, ``jobs`` is a single string, or the
            namespace is not valid.
        """
        if jobs is not None and namespace is not None:
            raise ConfigurationError("prune takes jobs or a namespace, not both")
        if namespace is not None:
            return cls(prefix=f"{validate_namespace(namespace)}:")
        if jobs is None:
            return cls()
        names = [] if isinstance(jobs, str) else list(jobs)
        if isinstance(jobs, str) or not all(isinstance(job, str) for job in names):
            raise ConfigurationError(
                f"prune jobs {brief(jobs)} is not valid: give a collection of store names"
            )
        return cls(jobs=frozenset(names))

    @property
    def everything(self) -> bool:
        return self.jobs is None and self.prefix is None

    def matches(self, job: str) -> bool:
        """Whether the store name ``job`` is in scope."""
        if self.jobs is not None:
            return job in self.jobs
        return self.prefix is None or job.startswith(self.prefix)

    def select(self, jobs: Collection[str]) -> list[str]:
        """The store names of ``jobs`` in scope, sorted."""
        return sorted(job for job in jobs if self.matches(job))


class Backend(ABC):
    """One store. Instances are used from one event loop; methods are coroutines."""

    capabilities: Capabilities
    name: str = "backend"

    # -- life cycle --------------------------------------------------------------
    #: Settings of the store's server that break a guarantee (Redis without AOF, with
    #: an evicting memory policy), found by :meth:`open`: a starting scheduler logs each
    #: once; read-only tools (history, the dashboard) do not.
    setting_warnings: tuple[str, ...] = ()

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Connect and create the layout idempotently (concurrent first starts are safe).

        :raises SchemaVersionError: the store was written by a newer anarchon.
        :raises BackendUnavailable: the store cannot be reached.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Idempotent."""

    def describe(self) -> str:
        """The store's URL or path for logs and banners, credentials masked."""
        return self.name

    @property
    def local_to(self) -> str | None:
        """``"host"`` or ``"process"``: the store coordinates only the processes of one
        host (a local file) or one process (memory); ``None``: any host that reaches it."""
        return None

    @abstractmethod
    async def now_ms(self) -> int:
        """The store's clock in epoch ms (the local clock where the store has none)."""

    # -- the claim ---------------------------------------------------------------
    @abstractmethod
    async def claim(self, request: ClaimRequest) -> Claim:
        """Atomically decide who runs ``(job, slot)``, in one store round trip.

        The first claim of a run wins: it records the run (attempt 1, the token, a lease
        of ``lease_ms`` on lease backends) and a ``running`` (claim-only: ``claimed``)
        history record. Every later claim of the same run gets ``TAKEN`` and writes
        nothing. Before recording a win the store checks, inside the same decision:
        the horizon (``EXPIRED``, nothing written), early claims (``EARLY``), a paused
        job (records ``paused``, attempt 0, returns ``PAUSED``) and, when
        ``skip_overlap``, another live run of the job: one whose lease has not expired
        (records ``skipped``, attempt 0, returns ``SKIPPED``). Either record also makes
        later claims of the run ``TAKEN``.

        A claim repeated with the same token (after an ambiguous failure) returns
        ``WON`` again if that token holds the run and its lease is live by the store's
        clock; ``LAPSED`` (nothing written) if that token holds the run but its lease has
        expired: the attempt must not start, and a backup takes the run over.

        A request with a ``version`` (a stored definition's) is checked after the horizon
        and before pause: unless the store holds that very version of the job's
        definition, the answer is ``STALE`` and nothing is written. A run already decided
        is still answered ``TAKEN``.
        """

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        """Claim several runs in one store request; one answer per request, in order.

        Each request is decided exactly as :meth:`claim` would decide it alone, in the
        order given (two requests of one job see each other: a won run makes a later
        one ``SKIPPED`` under ``skip_overlap``). The batch is not atomic: each decision
        stands on its own. An error means no answer is known for any request; a retry
        with the same tokens is safe, as for one claim. This default sends the claims
        concurrently; stores override it with one round trip.
        """
        return await _all_or_raise([self.claim(request) for request in requests])

    # -- lease operations (lease backends) -----------------------------------------
    async def heartbeat(self, leases: Sequence[Lease], lease_ms: int) -> list[bool]:
        """Extend each lease to ``now + lease_ms``, in one batched store call.

        Returns one verdict per lease: ``False`` when the token no longer holds the run
        (taken over, cancelled, finished or released): the runner is fenced and must
        stop. A stale token never changes anything.
        """
        raise self._no_lease("heartbeats")

    async def finish(
        self,
        lease: Lease,
        status: Status,
        *,
        error: str | None = None,
        meta: dict[str, Any] | None = None,
        retry_in_ms: int | None = None,
    ) -> bool:
        """Record the attempt's outcome, only if ``lease.token`` still holds the run.

        ``status`` is ``success`` or ``failed``; ``meta`` is a JSON-serialisable dict.
        With ``retry_in_ms`` (failed only) the run stays open: any instance may take
        attempt + 1 once ``now >= retry time`` (see :meth:`due_runs`). Returns ``False``
        (and changes nothing) for a stale token; repeating a finish with the same token
        and status returns ``True``.
        """
        raise self._no_lease("finish")

    def finish_in_transaction(
        self, conn: Any, lease: Lease, status: Status, *, meta: dict[str, Any] | None = None
    ) -> bool:
        """:meth:`finish`, sent on ``conn``: the caller's own driver connection to the
        store's database (``sqlite3``, psycopg), inside the transaction it holds open.

        The outcome then commits or rolls back with the caller's writes: a handler's
        writes and its run's outcome become one (the Django ORM's ``transactional=True``).
        Fenced as :meth:`finish` is: ``False`` if ``lease`` no longer holds the run.
        Synchronous, on the caller's thread; only when ``capabilities.finish_in_transaction``.
        """
        raise CapabilityError(
            f"{self.describe()} cannot finish a run inside the caller's transaction: "
            "use a SQL store (sqlite://, postgresql://, django://) for it"
        )

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[bool]:
        """:meth:`finish` for several attempts in one store request, answers in order.

        Each is fenced by its own token exactly as alone. An error means no answer is
        known for any of them; repeating them is safe (a repeated finish answers
        ``True``). This default sends them concurrently; stores override it.
        """
        return await _all_or_raise(
            [
                self.finish(
                    r.lease, r.status, error=r.error, meta=r.meta, retry_in_ms=r.retry_in_ms
                )
                for r in requests
            ]
        )

    async def release(self, lease: Lease) -> bool:
        """Hand the run over: end this attempt as ``interrupted`` and expire the lease now.

        The token stops holding the run, so anything the released runner sends later is
        rejected, and a backup takes attempt + 1 without waiting for expiry. Fenced by
        token: a stale token changes nothing and gets ``False``.
        """
        raise self._no_lease("hand-over")

    async def due_runs(self, jobs: Collection[str]) -> list[DueRun]:
        """Runs of ``jobs`` whose lease expired or whose retry is due, in one store call.

        Judged by the store's clock. Called by every instance once per heartbeat period,
        so runs are continued even after every original loser restarted.
        """
        raise self._no_lease("takeover")

    async def take_over(self, request: TakeoverRequest) -> Claim:
        """Compare-and-set the run from ``request.attempt`` to ``request.attempt + 1``.

        ``WON`` with the new attempt (the previous attempt's record, if still
        ``running``, becomes ``interrupted``); ``TAKEN`` if the attempt moved on or the
        lease is live again; ``EXHAUSTED`` if ``request.attempt >= max_attempts`` (the
        run ends ``interrupted``); ``EXPIRED`` if past the horizon (likewise ended);
        ``BLOCKED`` if ``skip_overlap`` and another run of the job is live. A due retry
        that may not run (exhausted or expired) ends ``failed``: its failure stands.
        Repeated with the same token, it answers ``WON`` again while the attempt it
        started holds a live lease and ``LAPSED`` once that lease has expired.

        ``attempt=0`` starts a pending manual request (see :meth:`trigger`) as attempt 1;
        past its horizon it ends ``interrupted`` with an attempt-0 record.
        """
        raise self._no_lease("takeover")

    async def last_scheduled_slot(self, job: str) -> int | None:
        """The latest slot of ``job`` recorded by a scheduled or catch-up run (any status).

        Manual runs do not count. ``None`` when the job has no record (first deploy).
        """
        raise self._no_lease("catch-up")

    # -- history -----------------------------------------------------------------
    @abstractmethod
    async def history(self, query: HistoryQuery) -> list[RunRecord]:
        """History records matching ``query``, ordered by ``(slot, job, attempt)`` descending.

        ``query.before`` continues a page after a record (a cursor): records added
        meanwhile sort before it, so paging never repeats or skips one.
        """

    async def prune(
        self,
        older_than_ms: int,
        *,
        jobs: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> int:
        """Delete terminal records of slots older than ``older_than_ms`` (epoch ms).

        Only the jobs in scope (see :class:`PruneScope`): the store names in ``jobs``, or
        those of ``namespace`` (``"{namespace}:..."``); neither means every job in the
        store, which only an explicit ``anarchon prune --all`` asks for. Records of other
        jobs are never touched, so services sharing a store keep their own retention.
        Never deletes a job's latest record, its latest scheduled or catch-up run (the
        start of catch-up), nor any non-terminal record. Returns the number of history
        records deleted.

        :raises ConfigurationError: both ``jobs`` and ``namespace``, or a bad namespace.
        """
        PruneScope.of(jobs, namespace)
        return 0

    # -- job definitions ----------------------------------------------------------------
    async def write_definition(self, job: str, body: str | None, *, expected: int | None) -> int:
        """Store (``body``) or remove (``None``) the definition of ``job``; return its new
        version, in one atomic step.

        The version comes from one counter per store, issued in commit order: every
        change gets a higher one than every change committed before it, so a replica
        that read changes up to ``v`` finds all later ones with :meth:`definitions_since`.
        ``expected`` is the version the writer read (0: none, it must not exist; ``None``:
        whatever it is). A removal keeps a tombstone (``body`` ``None``) with its version;
        removing a definition that does not exist writes nothing and returns 0.

        :raises ConflictError: the store holds another version than ``expected`` (with
            the version it holds; 0 for none); nothing was written.
        """
        raise CapabilityError(
            f"{self.describe()} keeps no job definitions; use a store that does "
            f"({DEFINITION_BACKENDS})"
        )

    async def definitions_since(self, version: int) -> list[StoredDefinition]:
        """Every definition (tombstones included) changed after ``version``, by version:
        each job once, in its current state (a job changed twice since is listed at its
        newest version only).

        ``0`` reads them all. One store request; the changes of one write are never split.
        """
        raise CapabilityError(
            f"{self.describe()} keeps no job definitions; use a store that does "
            f"({DEFINITION_BACKENDS})"
        )

    async def read_definition(self, job: str) -> StoredDefinition | None:
        """The current definition of ``job`` (``None``: never stored, or removed).

        One read of that job's definition where the store can: what a single edit
        (update, remove, ``anarchon jobs next``) reads instead of every definition. This
        default reads them all (:meth:`definitions_since` of 0), for a store that has no
        cheaper way.
        """
        found = next((d for d in await self.definitions_since(0) if d.job == job), None)
        return found if found is not None and found.body is not None else None

    async def watch_definitions(self, changed: Callable[[], None]) -> None:
        """Call ``changed()`` soon after any definition changes, until cancelled.

        A hint, not the change: the caller reads :meth:`definitions_since` its version.
        Notifications get lost (a reconnect, a pooler that drops ``LISTEN``), so callers
        poll :meth:`definitions_version` too; this shortens the wait. Called again after
        it raised (an outage), it also calls ``changed()`` once it listens again.

        :raises CapabilityError: the store has no notifications (callers poll only).
        """
        raise CapabilityError(f"{self.describe()} sends no notifications of definition changes")

    async def definitions_version(self) -> int:
        """The newest version the store has issued (0: none yet): what replicas poll."""
        raise CapabilityError(
            f"{self.describe()} keeps no job definitions; use a store that does "
            f"({DEFINITION_BACKENDS})"
        )

    # -- operations (lease backends) ------------------------------------------------
    async def set_paused(self, job: str, paused: bool) -> None:
        """Pause or resume ``job`` for every instance, at once.

        The flag lives in the store and :meth:`claim` reads it in the same decision, so
        there is no cache to refresh: the next slot on every instance is ``paused``.
        """
        raise self._no_lease("pause")

    async def paused_jobs(self) -> set[str]:
        """The names of the jobs paused in this store."""
        raise self._no_lease("pause")

    async def trigger(self, job: str, requested_by: str) -> int:
        """Record a manual run of ``job`` at the store's now and return its slot.

        At most one manual request per job is pending (recorded but not started): while
        one is, this returns its slot and records nothing, so pressing twice or on
        several instances asks once. The request is a run in state *pending* with
        origin ``manual`` and attempt 0; :meth:`due_runs` lists it (reason ``manual``)
        to instances that have the job, and :meth:`take_over` with ``attempt=0`` starts
        it as attempt 1 under every lease rule. Allowed while the job is paused.
        """
        raise self._no_lease("manual runs")

    async def cancel(self, job: str, slot: int) -> bool:
        """Cancel a pending, running or waiting run: revoke its token, end it ``cancelled``.

        The runner's next heartbeat is rejected (so its ``ctx`` is cancelled), its
        finish changes nothing and no backup takes the run over. ``False`` if the run
        does not exist or already ended.
        """
        raise self._no_lease("cancel")

    async def register(self, info: InstanceInfo, ttl_ms: int) -> None:
        """Insert or refresh an instance in the registry; it expires ``ttl_ms`` after now.

        The store sets ``last_seen`` to its own clock (``info.last_seen`` is ignored).
        """
        raise self._no_lease("the instance registry")

    async def unregister(self, instance_id: str) -> None:
        """Remove an instance from the registry (at stop)."""
        raise self._no_lease("the instance registry")

    async def instances(self) -> list[InstanceInfo]:
        """The live instances (not expired by the store's clock), ordered by id."""
        raise self._no_lease("the instance registry")

    # -- helpers -----------------------------------------------------------------
    def _no_lease(self, feature: str) -> CapabilityError:
        return CapabilityError(
            f"{self.name} is a claim-only backend and has no {feature}; "
            f"use a lease backend ({LEASE_BACKENDS}) for it"
        )


async def _all_or_raise(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Every call's answer in order, or the first error once all have ended.

    Waiting for all before raising leaves no call running unobserved: a batch that is
    retried must not race with a copy of itself still in flight.
    """
    answers = await asyncio.gather(*calls, return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return answers  # type: ignore[return-value]


def bound_error(text: str | None) -> str | None:
    """History keeps at most :data:`MAX_ERROR_CHARS` characters of an error.

    A longer traceback keeps its head and its last line (the exception, which
    :func:`~anarchon_core.records.error_summary` shows), the middle cut at an ``…``
    line; a longer last line is cut at its end.
    """
    if text is None or len(text) <= MAX_ERROR_CHARS:
        return text
    head, _, last = text.rstrip().rpartition("\n")
    if head and len(last) <= MAX_ERROR_CHARS // 2:
        return text[: MAX_ERROR_CHARS - len(last) - 3] + "\n…\n" + last
    return text[: MAX_ERROR_CHARS - 1] + "…"


def meta_json(meta: dict[str, Any] | None) -> str:
    """A run's ``meta`` as the JSON text stores keep; a value that is not JSON is refused."""
    if not meta:
        return "{}"  # most runs: no encoder built (json.dumps with options makes one per call)
    try:
        return json.dumps(meta, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"meta {meta!r} is not valid: give a dict of JSON values ({exc})"
        ) from exc


def instance_json(info: InstanceInfo) -> str:
    """``info`` as the JSON text a registry keeps; a value that is not JSON is refused."""
    try:
        return json.dumps(info.to_json(), separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"instance {info.instance_id!r}: its registry entry is not JSON values ({exc})"
        ) from exc


def local_note(backend: Backend) -> str:
    """What a start-up line adds for a store that serves one host or one process only:
    on several hosts, each would run every job once."""
    if backend.local_to is None:
        return ""
    if backend.local_to == "process":
        return " (in memory: it coordinates this process only)"
    return " (a local store: it coordinates the processes of this host only)"
