"""The lease contract on PostgreSQL, over the statements of :mod:`._sql`.

Two stores send these same statements: :class:`~.postgres.PostgresBackend` through its
psycopg pool, and the Django adapter's ORM store through Django's connection on its
own thread. Each supplies ``sql`` (the rendered :class:`Statements`), ``prune_batch``
and ``_rows`` (one statement, its rows); every decision here is one statement.
"""

from __future__ import annotations

import json
import secrets
from abc import abstractmethod
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ...backend import (
    Backend,
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
    meta_json,
)
from ...errors import BackendError, ConfigurationError, ConflictError
from ...records import HistoryQuery, Origin, Outcome, RunRecord, Status
from .._sql import history_filter, record_from_row
from . import _ops as ops
from ._sql import TERMINAL, WAITING, Statements

__all__ = ["Params", "PostgresContract", "finish_params", "finish_verdict"]

Params = Sequence[Any] | Mapping[str, Any]


class PostgresContract(Backend):
    """Every contract method as one statement; subclasses say how a statement is sent."""

    sql: Statements
    prune_batch: int

    @abstractmethod
    async def _rows(self, query: str, params: Params | None = None) -> list[tuple[Any, ...]]:
        """Send one statement; its rows (none for a statement without a result)."""

    async def _row(self, query: str, params: Params | None = None) -> tuple[Any, ...]:
        rows = await self._rows(query, params)
        if len(rows) != 1:
            raise BackendError(f"PostgreSQL store {self.describe()}: expected one row")
        return rows[0]

    # -- the contract --------------------------------------------------------------
    async def now_ms(self) -> int:
        return int((await self._row(self.sql.now_ms))[0])

    async def claim(self, request: ClaimRequest) -> Claim:
        outcome, attempt, now = await self._row(
            self.sql.claim,
            (
                request.job,
                request.slot,
                str(request.origin),
                request.token,
                _text(request.instance_id),
                request.lease_ms,
                request.horizon_ms,
                request.skip_overlap,
                _text(request.fingerprint),
                request.version,
            ),
        )
        return Claim(Outcome(outcome), attempt, now)

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        """Every claim in one call of the batch function: one round trip, one commit."""
        if not requests:
            return []
        rows = await self._rows(
            self.sql.claim_many,
            (
                [r.job for r in requests],
                [r.slot for r in requests],
                [str(r.origin) for r in requests],
                [r.token for r in requests],
                [_text(r.instance_id) for r in requests],
                [r.lease_ms for r in requests],
                [r.horizon_ms for r in requests],
                [r.skip_overlap for r in requests],
                [_text(r.fingerprint) for r in requests],
                [r.version for r in requests],
            ),
        )
        answers: list[Claim | None] = [None] * len(requests)
        for ord_, outcome, attempt, now in rows:
            answers[ord_ - 1] = Claim(Outcome(outcome), attempt, now)
        if len(rows) != len(requests) or None in answers:
            raise BackendError(f"PostgreSQL store {self.describe()}: expected one row per claim")
        return answers  # type: ignore[return-value]

    async def heartbeat(self, leases: Sequence[Lease], lease_ms: int) -> list[bool]:
        if not leases:
            return []
        # In key order, the order finish_many locks runs in: a heartbeat and a batch of
        # finishes of the same leases then never wait for each other.
        ordered = sorted(leases, key=_run_key)
        rows = await self._rows(
            self.sql.heartbeat,
            (
                lease_ms,
                [lease.job for lease in ordered],
                [lease.slot for lease in ordered],
                [lease.attempt for lease in ordered],
                [lease.token for lease in ordered],
            ),
        )
        alive = {tuple(row) for row in rows}
        return [(lease.job, lease.slot, lease.attempt, lease.token) in alive for lease in leases]

    async def finish(
        self,
        lease: Lease,
        status: Status,
        *,
        error: str | None = None,
        meta: dict[str, Any] | None = None,
        retry_in_ms: int | None = None,
    ) -> bool:
        params = finish_params(lease, status, error=error, meta=meta, retry_in_ms=retry_in_ms)
        return finish_verdict(await self._row(self.sql.finish, params), status)

    def finish_in_transaction(
        self, conn: Any, lease: Lease, status: Status, *, meta: dict[str, Any] | None = None
    ) -> bool:
        """The statement of :meth:`finish`, sent on ``conn`` (a psycopg connection to the
        same database) in the transaction it holds open."""
        import psycopg

        with psycopg.Cursor(conn) as cursor:
            cursor.execute(self.sql.finish, finish_params(lease, status, meta=meta))
            row = cursor.fetchone()
        return row is not None and finish_verdict(row, status)

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[bool]:
        """Every finish in one statement: one round trip, one commit."""
        if not requests:
            return []
        each = [
            finish_params(r.lease, r.status, error=r.error, meta=r.meta, retry_in_ms=r.retry_in_ms)
            for r in requests
        ]
        names = ("job", "slot", "attempt", "token", "state", "retry_in", "status", "error", "meta")
        params = {name: [p[name] for p in each] for name in names}
        rows = await self._rows(self.sql.finish_many, params)
        if len(rows) != len(requests):
            raise BackendError(f"PostgreSQL store {self.describe()}: expected one row per finish")
        return [finish_verdict(row[1:], r.status) for row, r in zip(rows, requests, strict=True)]

    async def release(self, lease: Lease) -> bool:
        params = {"job": lease.job, "slot": lease.slot, "attempt": lease.attempt}
        params |= {"token": lease.token, "revoked": _revoked_token("released")}
        (released,) = await self._row(self.sql.release, params)
        return bool(released)

    async def due_runs(self, jobs: Collection[str]) -> list[DueRun]:
        names = sorted(set(jobs))
        if not names:
            return []
        rows = await self._rows(self.sql.due_runs, {"jobs": names})
        return [
            DueRun(job, slot, attempt, Origin(origin), ops.DUE_REASONS[state])
            for job, slot, attempt, origin, state in rows
        ]

    async def take_over(self, request: TakeoverRequest) -> Claim:
        outcome, attempt, now = await self._row(
            self.sql.take_over,
            (
                request.job,
                request.slot,
                request.attempt,
                request.token,
                _text(request.instance_id),
                request.lease_ms,
                request.horizon_ms,
                request.max_attempts,
                request.skip_overlap,
            ),
        )
        return Claim(Outcome(outcome), attempt, now)

    async def last_scheduled_slot(self, job: str) -> int | None:
        rows = await self._rows(self.sql.last_scheduled_slot, (job,))
        return None if not rows else int(rows[0][0])

    async def history(self, query: HistoryQuery) -> list[RunRecord]:
        where, params = history_filter(query, "%s")
        params.append(max(query.limit, 0))
        text = self.sql.history + where + self.sql.history_order
        return [record_from_row(row) for row in await self._rows(text, params)]

    async def prune(
        self,
        older_than_ms: int,
        *,
        jobs: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> int:
        """Delete in batches of ``prune_batch`` records, each its own short transaction."""
        scope = PruneScope.of(jobs, namespace)
        deleted = 0 if scope.jobs == frozenset() else await self._prune(older_than_ms, scope)
        await self._rows(self.sql.prune_instances)  # registry rows of vanished instances
        return deleted

    async def _prune(self, older_than_ms: int, scope: PruneScope) -> int:
        where = {
            "jobs": None if scope.jobs is None else sorted(scope.jobs),
            "prefix": scope.prefix,
        }
        keep_jobs: list[str] = []
        keep_slots: list[int] = []
        for job, latest, anchor in await self._rows(self.sql.prune_keep, where):
            for slot in {latest, anchor} - {None}:
                keep_jobs.append(job)
                keep_slots.append(slot)
        params = {
            **where,
            "terminal": TERMINAL,
            "keep_jobs": keep_jobs,
            "keep_slots": keep_slots,
            "batch": self.prune_batch,
        }
        deleted, below = 0, older_than_ms
        while True:
            count, lowest = await self._row(self.sql.prune, {**params, "below": below})
            deleted += int(count)
            if count < self.prune_batch:
                break
            below = lowest + 1  # the rest of the lowest slot, then older ones
        return deleted

    # -- job definitions -------------------------------------------------------------
    async def write_definition(self, job: str, body: str | None, *, expected: int | None) -> int:
        """One call of the write function: the counter's row lock orders the writers."""
        version, current = await self._row(self.sql.write_definition, (job, body, expected))
        if version is None:
            raise ConflictError(
                f"definition {job!r} is at version {current}, not {expected}", current=current
            )
        return int(version)

    async def definitions_since(self, version: int) -> list[StoredDefinition]:
        rows = await self._rows(self.sql.definitions_since, (version,))
        return [StoredDefinition(job, int(v), body) for job, v, body in rows]

    async def read_definition(self, job: str) -> StoredDefinition | None:
        rows = await self._rows(self.sql.read_definition, (job,))
        return None if not rows else StoredDefinition(job, int(rows[0][0]), rows[0][1])

    async def definitions_version(self) -> int:
        return int((await self._row(self.sql.definitions_version))[0])

    # -- operations ----------------------------------------------------------------
    async def set_paused(self, job: str, paused: bool) -> None:
        """Pause or resume ``job``: claims of a paused job record ``paused`` and run nothing."""
        await self._rows(self.sql.set_paused, (job, bool(paused)))

    async def paused_jobs(self) -> set[str]:
        return {job for (job,) in await self._rows(self.sql.paused_jobs)}

    async def trigger(self, job: str, requested_by: str) -> int:
        return int((await self._row(self.sql.trigger, (job, _text(requested_by))))[0])

    async def cancel(self, job: str, slot: int) -> bool:
        params = {"job": job, "slot": slot, "revoked": _revoked_token("cancelled")}
        (cancelled,) = await self._row(self.sql.cancel, params)
        return bool(cancelled)

    async def register(self, info: InstanceInfo, ttl_ms: int) -> None:
        try:
            text = json.dumps(_without_nul(info.to_json()), separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"instance {info.instance_id!r}: its registry entry is not JSON values ({exc})"
            ) from exc
        params = {"id": _text(info.instance_id), "info": text, "ttl": ttl_ms}
        await self._rows(self.sql.register, params)

    async def unregister(self, instance_id: str) -> None:
        await self._rows(self.sql.unregister, (_text(instance_id),))

    async def instances(self) -> list[InstanceInfo]:
        rows = await self._rows(self.sql.instances)
        return [InstanceInfo.from_json({**_json(info), "last_seen": seen}) for info, seen in rows]


# -- helpers -------------------------------------------------------------------------
def finish_params(
    lease: Lease,
    status: Status,
    *,
    error: str | None = None,
    meta: dict[str, Any] | None = None,
    retry_in_ms: int | None = None,
) -> dict[str, Any]:
    """The parameters of ``Statements.finish``; apart so that a caller can send the
    statement in its own transaction (the Django adapter's ``transactional=True``)."""
    retrying = retry_in_ms is not None and status == Status.FAILED
    return {
        "state": WAITING if retrying else str(status),
        "retry_in": retry_in_ms if retrying else None,
        "status": str(status),
        "error": _text(bound_error(error)),
        "meta": meta_json(_without_nul(meta or {})),
        "job": lease.job,
        "slot": lease.slot,
        "attempt": lease.attempt,
        "token": lease.token,
    }


def finish_verdict(row: Sequence[Any], status: Status) -> bool:
    """True if ``Statements.finish`` recorded the outcome, or it repeated a recorded one."""
    finished, held, recorded = row
    return bool(finished) or (bool(held) and recorded == str(status))


def _run_key(lease: Lease) -> tuple[str, int]:
    return lease.job, lease.slot


def _revoked_token(how: str) -> str:
    """The token a release or cancel puts in place of the runner's: this call's own.

    Nobody holds it (a runner's token never has this form), so it fences the runner as
    well as no token would; and a statement re-sent after its connection died once it
    had committed (the store re-sends once on a fresh connection) recognises its own
    write by it, where another call finds a token that is not its own.
    """
    return f"{how}:{secrets.token_hex(12)}"


def _text(value: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL: free text (errors, instance ids) is cleaned."""
    return value.replace("\x00", "\ufffd") if value is not None and "\x00" in value else value


def _without_nul(value: Any) -> Any:
    """``jsonb`` refuses ``\\u0000`` in strings: replace it in keys and values."""
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(v) for v in value]
    return value


def _json(value: Any) -> Any:
    """psycopg loads ``jsonb`` as Python values; Django's cursor leaves it text: parse it."""
    return json.loads(value) if isinstance(value, str) else value
