"""The in-memory lease backend: the reference implementation of the contract.

It lives in one process, so it serves unit tests and the test helpers; every
decision is a plain Python critical section (the event loop is single-threaded and
no method awaits in the middle of a decision). The open runs of each job (running,
waiting for a retry, or a pending manual request) are indexed, so that the overlap
check, the backup sweep and the one-pending-request rule do not scan every stored run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..backend import (
    EARLY_TOLERANCE_MS,
    NOT_STARTED,
    PENDING,
    Backend,
    Capabilities,
    Claim,
    ClaimRequest,
    DueRun,
    FinishRequest,
    InstanceInfo,
    Lease,
    PruneScope,
    StoredDefinition,
    TakeoverRequest,
    bound_error,
    instance_json,
    overlap_reason,
    wall_clock_ms,
)
from ..errors import ConfigurationError, ConflictError
from ..records import (
    TERMINAL_STATUSES,
    HistoryQuery,
    Origin,
    Outcome,
    RunRecord,
    Status,
    select_records,
)
from ..redact import brief_url

__all__ = ["MemoryBackend"]


@dataclass(slots=True)
class _Run:
    origin: Origin
    state: str  # pending | running | waiting | a terminal Status
    attempt: int
    token: str | None
    lease_expires: int
    retry_at: int
    fingerprint: str
    requested_by: str | None = None  # manual: who asked; the instance of an attempt-0 record


class MemoryBackend(Backend):
    """A lease backend in process memory. ``clock`` returns epoch ms (settable in tests)."""

    capabilities = Capabilities(lease=True, store_clock=True, finish=True)
    name = "memory"

    def __init__(self, *, clock: Callable[[], int] = wall_clock_ms) -> None:
        self._clock = clock
        self._runs: dict[tuple[str, int], _Run] = {}
        self._records: dict[tuple[str, int, int], RunRecord] = {}
        # job -> slots of its runs in state pending, running or waiting: kept in step
        # with every state change below, so that it lists exactly the runs still open.
        self._open: dict[str, set[int]] = {}
        self.paused: set[str] = set()
        # instance id -> (its info as JSON, last_seen set by this store; expiry in ms)
        self._instances: dict[str, tuple[str, int]] = {}
        # job -> its stored definition (a removed one: body None); the newest version
        self._definitions: dict[str, StoredDefinition] = {}
        self._definitions_version = 0
        self._watchers: list[Callable[[], None]] = []

    @classmethod
    def from_url(cls, url: str) -> MemoryBackend:
        """``memory://``: a fresh store private to this process."""
        if url.rstrip("/") != "memory:":
            raise ConfigurationError(
                f"memory backend URL {brief_url(url)} is not valid: use 'memory://'"
            )
        return cls()

    @property
    def local_to(self) -> str | None:
        return "process"

    def describe(self) -> str:
        return "memory://"

    async def now_ms(self) -> int:
        return self._clock()

    # -- claim -------------------------------------------------------------------
    async def claim(self, request: ClaimRequest) -> Claim:
        now = self._clock()
        key = (request.job, request.slot)
        run = self._runs.get(key)
        if run is not None:
            if run.token == request.token and run.attempt == 1:  # an ambiguous repeat
                return self._repeat(run, now)
            return Claim(Outcome.TAKEN, store_now=now)
        if request.slot < now - request.horizon_ms:
            return Claim(Outcome.EXPIRED, store_now=now)
        if request.slot > now + EARLY_TOLERANCE_MS:
            return Claim(Outcome.EARLY, store_now=now)
        if request.version is not None and not self._holds(request.job, request.version):
            return Claim(Outcome.STALE, store_now=now)
        if request.job in self.paused:
            self._mark_nothing_ran(request, Status.PAUSED, now)
            return Claim(Outcome.PAUSED, store_now=now)
        overlapped = (
            self._live_run(request.job, now, exclude=request.slot) if request.skip_overlap else None
        )
        if overlapped is not None:
            self._mark_nothing_ran(request, Status.SKIPPED, now, overlap_reason(overlapped))
            return Claim(Outcome.SKIPPED, store_now=now)
        self._runs[key] = _Run(
            request.origin,
            Status.RUNNING,
            1,
            request.token,
            now + request.lease_ms,
            0,
            request.fingerprint,
        )
        self._open.setdefault(request.job, set()).add(request.slot)
        self._records[(request.job, request.slot, 1)] = RunRecord(
            request.job,
            request.slot,
            1,
            request.origin,
            Status.RUNNING,
            request.instance_id,
            now,
            now,
            None,
        )
        return Claim(Outcome.WON, 1, now)

    def _mark_nothing_ran(
        self, request: ClaimRequest, status: Status, now: int, why: str | None = None
    ) -> None:
        self._runs[(request.job, request.slot)] = _Run(
            request.origin, status, 0, None, 0, 0, request.fingerprint
        )
        self._records[(request.job, request.slot, 0)] = RunRecord(
            request.job,
            request.slot,
            0,
            request.origin,
            status,
            request.instance_id,
            now,
            None,
            now,
            why,
        )

    def _holds(self, job: str, version: int) -> bool:
        stored = self._definitions.get(job)
        return stored is not None and stored.body is not None and stored.version == version

    # -- job definitions -----------------------------------------------------------
    async def write_definition(self, job: str, body: str | None, *, expected: int | None) -> int:
        stored = self._definitions.get(job)
        current = stored.version if stored is not None and stored.body is not None else 0
        if expected is not None and expected != current:
            raise ConflictError(
                f"definition {job!r} is at version {current}, not {expected}", current=current
            )
        if body is None and current == 0:  # nothing to remove
            return 0
        self._definitions_version += 1
        self._definitions[job] = StoredDefinition(job, self._definitions_version, body)
        for changed in self._watchers:
            asyncio.get_running_loop().call_soon(changed)
        return self._definitions_version

    async def watch_definitions(self, changed: Callable[[], None]) -> None:
        self._watchers.append(changed)
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            self._watchers.remove(changed)

    async def definitions_since(self, version: int) -> list[StoredDefinition]:
        changed = [d for d in self._definitions.values() if d.version > version]
        return sorted(changed, key=lambda d: d.version)

    async def read_definition(self, job: str) -> StoredDefinition | None:
        stored = self._definitions.get(job)
        return stored if stored is not None and stored.body is not None else None

    async def definitions_version(self) -> int:
        return self._definitions_version

    @staticmethod
    def _repeat(run: _Run, now: int) -> Claim:
        """A repeat by the token that won: ``WON`` only while its lease is live."""
        if run.state == Status.RUNNING and run.lease_expires > now:
            return Claim(Outcome.WON, run.attempt, now)
        return Claim(Outcome.LAPSED, store_now=now)

    def _live_run(self, job: str, now: int, *, exclude: int) -> int | None:
        """The earliest other slot of ``job`` whose lease is live, if any."""
        live = [
            slot
            for slot in self._open.get(job, ())
            if slot != exclude
            and self._runs[(job, slot)].state == Status.RUNNING
            and self._runs[(job, slot)].lease_expires > now
        ]
        return min(live, default=None)

    def _closed(self, job: str, slot: int) -> None:
        """The run of ``(job, slot)`` reached a terminal state: drop it from the index."""
        slots = self._open.get(job)
        if slots is not None:
            slots.discard(slot)
            if not slots:
                del self._open[job]

    # -- lease operations ----------------------------------------------------------
    def _held(self, lease: Lease) -> _Run | None:
        run = self._runs.get((lease.job, lease.slot))
        if run is None or run.token != lease.token or run.attempt != lease.attempt:
            return None
        return run

    async def heartbeat(self, leases: Sequence[Lease], lease_ms: int) -> list[bool]:
        now = self._clock()
        verdicts = []
        for lease in leases:
            run = self._held(lease)
            ok = run is not None and run.state == Status.RUNNING
            if ok and run is not None:
                run.lease_expires = now + lease_ms
            verdicts.append(ok)
        return verdicts

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        """Each claim in order: decisions in memory need no concurrency (nor its tasks)."""
        return [await self.claim(request) for request in requests]

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[bool]:
        return [
            await self.finish(
                r.lease, r.status, error=r.error, meta=r.meta, retry_in_ms=r.retry_in_ms
            )
            for r in requests
        ]

    async def finish(
        self,
        lease: Lease,
        status: Status,
        *,
        error: str | None = None,
        meta: dict[str, Any] | None = None,
        retry_in_ms: int | None = None,
    ) -> bool:
        now = self._clock()
        run = self._held(lease)
        if run is None:
            return False
        record = self._records.get((lease.job, lease.slot, lease.attempt))
        if run.state != Status.RUNNING or record is None:
            return record is not None and record.status == status  # idempotent repeat
        if retry_in_ms is not None and status == Status.FAILED:
            run.state, run.retry_at = "waiting", now + retry_in_ms
        else:
            run.state = status
            self._closed(lease.job, lease.slot)
        run.lease_expires = 0
        self._records[(lease.job, lease.slot, lease.attempt)] = replace(
            record, status=status, finished_at=now, error=bound_error(error), meta=dict(meta or {})
        )
        return True

    async def release(self, lease: Lease) -> bool:
        now = self._clock()
        run = self._held(lease)
        if run is None or run.state != Status.RUNNING:
            return False
        run.lease_expires, run.token = now, None  # the released runner is fenced from now on
        key = (lease.job, lease.slot, lease.attempt)
        self._records[key] = replace(
            self._records[key], status=Status.INTERRUPTED, finished_at=now, error="handed over"
        )
        return True

    async def due_runs(self, jobs: Collection[str]) -> list[DueRun]:
        now = self._clock()
        due = []
        for job, slots in self._open.items():
            if job not in jobs:
                continue
            for slot in slots:
                run = self._runs[(job, slot)]
                if run.state == Status.RUNNING and run.lease_expires <= now:
                    due.append(DueRun(job, slot, run.attempt, run.origin, "expired"))
                elif run.state == "waiting" and run.retry_at <= now:
                    due.append(DueRun(job, slot, run.attempt, run.origin, "retry"))
                elif run.state == PENDING:
                    due.append(DueRun(job, slot, 0, Origin.MANUAL, "manual"))
        due.sort(key=lambda run: (run.slot, run.job))  # oldest first, as the SQLite store
        return due

    async def take_over(self, request: TakeoverRequest) -> Claim:
        now = self._clock()
        run = self._runs.get((request.job, request.slot))
        if run is not None and run.token == request.token and run.attempt == request.attempt + 1:
            return self._repeat(run, now)  # an ambiguous repeat: this token won
        if run is None or run.attempt != request.attempt:
            return Claim(Outcome.TAKEN, store_now=now)
        expired = run.state == Status.RUNNING and run.lease_expires <= now
        retry_due = run.state == "waiting" and run.retry_at <= now
        if not (expired or retry_due or run.state == PENDING):
            return Claim(Outcome.TAKEN, store_now=now)
        if request.attempt >= request.max_attempts or request.slot < now - request.horizon_ms:
            self._end_interrupted(request, run, now)
            exhausted = request.attempt >= request.max_attempts
            return Claim(Outcome.EXHAUSTED if exhausted else Outcome.EXPIRED, store_now=now)
        if (
            request.skip_overlap
            and self._live_run(request.job, now, exclude=request.slot) is not None
        ):
            return Claim(Outcome.BLOCKED, store_now=now)
        self._interrupt_record(request.job, request.slot, request.attempt, now)
        attempt = request.attempt + 1
        run.state, run.attempt, run.token = Status.RUNNING, attempt, request.token
        run.lease_expires = now + request.lease_ms
        self._records[(request.job, request.slot, attempt)] = RunRecord(
            request.job,
            request.slot,
            attempt,
            run.origin,
            Status.RUNNING,
            request.instance_id,
            now,
            now,
            None,
        )
        return Claim(Outcome.WON, attempt, now)

    def _end_interrupted(self, request: TakeoverRequest, run: _Run, now: int) -> None:
        if run.state == Status.RUNNING:
            self._interrupt_record(request.job, request.slot, request.attempt, now)
            run.state = Status.INTERRUPTED
        elif run.state == PENDING:  # a manual request nobody started in time: ran nothing
            self._records[(request.job, request.slot, 0)] = RunRecord(
                request.job,
                request.slot,
                0,
                run.origin,
                Status.INTERRUPTED,
                run.requested_by,
                now,
                None,
                now,
                NOT_STARTED,
            )
            run.state = Status.INTERRUPTED
        else:  # a due retry that may not run: the failure stands
            run.state = Status.FAILED
        run.token = None
        self._closed(request.job, request.slot)

    def _interrupt_record(self, job: str, slot: int, attempt: int, now: int) -> None:
        record = self._records.get((job, slot, attempt))
        if record is not None and record.status == Status.RUNNING:
            self._records[(job, slot, attempt)] = replace(
                record, status=Status.INTERRUPTED, finished_at=now, error="lease expired"
            )

    async def last_scheduled_slot(self, job: str) -> int | None:
        slots = [s for (j, s), r in self._runs.items() if j == job and r.origin != Origin.MANUAL]
        return max(slots, default=None)

    # -- operations ----------------------------------------------------------------
    async def set_paused(self, job: str, paused: bool) -> None:
        """Pause or resume ``job``: claims of a paused job record ``paused`` and run nothing."""
        if paused:
            self.paused.add(job)
        else:
            self.paused.discard(job)

    async def paused_jobs(self) -> set[str]:
        return set(self.paused)

    async def trigger(self, job: str, requested_by: str) -> int:
        now = self._clock()
        pending = self._pending_slot(job)
        if pending is not None:
            return pending  # pressed twice, or on several instances: one request
        slot = now
        while (job, slot) in self._runs:  # a run of this very millisecond: the next free one
            slot += 1
        self._runs[(job, slot)] = _Run(Origin.MANUAL, PENDING, 0, None, 0, 0, "", requested_by)
        self._open.setdefault(job, set()).add(slot)
        return slot

    def _pending_slot(self, job: str) -> int | None:
        for slot in self._open.get(job, ()):
            if self._runs[(job, slot)].state == PENDING:
                return slot
        return None

    async def cancel(self, job: str, slot: int) -> bool:
        now = self._clock()
        run = self._runs.get((job, slot))
        if run is None or run.state not in (PENDING, Status.RUNNING, "waiting"):
            return False
        if run.state == PENDING:  # nothing ran: one attempt-0 record, as for a paused slot
            self._records[(job, slot, 0)] = RunRecord(
                job, slot, 0, run.origin, Status.CANCELLED, run.requested_by, now, None, now
            )
        else:  # the attempt in flight ends cancelled; one that already ended keeps its status
            key = (job, slot, run.attempt)
            record = self._records.get(key)
            if record is not None and record.status == Status.RUNNING:
                self._records[key] = replace(record, status=Status.CANCELLED, finished_at=now)
        # Forgetting the token fences the runner; state and lease keep backups away.
        run.state, run.token, run.lease_expires = Status.CANCELLED, None, 0
        self._closed(job, slot)
        return True

    async def register(self, info: InstanceInfo, ttl_ms: int) -> None:
        now = self._clock()
        # Kept as JSON, as every other store keeps it: the same values come back, and
        # callers never share a mutable ``jobs`` dict with the store.
        text = instance_json(replace(info, last_seen=now))
        self._instances[info.instance_id] = (text, now + ttl_ms)

    async def unregister(self, instance_id: str) -> None:
        self._instances.pop(instance_id, None)

    async def instances(self) -> list[InstanceInfo]:
        now = self._clock()
        for dead in [key for key, (_, expires) in self._instances.items() if expires <= now]:
            del self._instances[dead]
        return [
            InstanceInfo.from_json(json.loads(text))
            for _, (text, _) in sorted(self._instances.items())
        ]

    # -- history -----------------------------------------------------------------
    async def history(self, query: HistoryQuery) -> list[RunRecord]:
        return select_records(self._records.values(), query)

    async def prune(
        self,
        older_than_ms: int,
        *,
        jobs: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> int:
        scope = PruneScope.of(jobs, namespace)
        # Per job keep the slot of its latest record and its latest scheduled run: the
        # second anchors catch-up (last_scheduled_slot), which a manual run must not move.
        latest: dict[str, int] = {}
        for job, slot, _ in self._records:
            latest[job] = max(latest.get(job, slot), slot)
        anchor: dict[str, int] = {}
        for (job, slot), run in self._runs.items():
            if run.origin != Origin.MANUAL:
                anchor[job] = max(anchor.get(job, slot), slot)
        keep = {*latest.items(), *anchor.items()}
        doomed = [
            key
            for key, r in self._records.items()
            if r.slot < older_than_ms
            and r.status in TERMINAL_STATUSES
            and key[:2] not in keep
            and scope.matches(key[0])
        ]
        for key in doomed:
            del self._records[key]
        for run_key in [k for k, r in self._runs.items() if k[1] < older_than_ms]:
            if (
                self._runs[run_key].state in TERMINAL_STATUSES
                and run_key not in keep
                and scope.matches(run_key[0])
            ):
                del self._runs[run_key]  # terminal: never in the index of open runs
        return len(doomed)
