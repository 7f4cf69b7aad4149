"""The Django ORM backend on PostgreSQL: the core PostgreSQL backend's statements via Django.

The tables are the core's (see :mod:`anarchon_django.models`), so the statements of
:class:`~anarchon_core.backends._postgres_sql.Statements` run on them unchanged, one
statement and one round trip per decision through Django's cursor, in autocommit:

- the claim calls the core's PL/pgSQL function: ``INSERT … ON CONFLICT DO NOTHING``
  on the run's key decides between concurrent claims, and the function reports
  won/taken/skipped/paused/expired/early in the same round trip, so a loser writes
  nothing, logs nothing and never poisons a transaction;
- heartbeat, finish, release and cancel are single conditional ``UPDATE``s (CTEs)
  whose matched rows are the verdict; the takeover is a compare-and-set in its
  function;
- every time is ``clock_timestamp()`` in epoch ms, read inside the statement: leases
  are judged by the database's clock, and not by ``now()``, which is frozen at the
  start of a transaction.

The tables come from the migrations; the three functions are created at open when
missing (named after a digest of their text, as the core does, so a rolling upgrade
that changes them adds new ones beside the old). The rendering needs psycopg 3.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from anarchon_core.backend import (
    Backend,
    Capabilities,
    Claim,
    ClaimRequest,
    DueRun,
    InstanceInfo,
    Lease,
    TakeoverRequest,
    bound_error,
)
from anarchon_core.backends import _postgres_ops as ops
from anarchon_core.backends._postgres_sql import TERMINAL, WAITING, Statements
from anarchon_core.backends._sql import history_filter
from anarchon_core.errors import BackendError, ConfigurationError
from anarchon_core.records import HistoryQuery, Origin, Outcome, RunRecord, Status

from ._orm_thread import Worker

__all__ = ["OrmPostgresStore"]

Rows = list[tuple[Any, ...]]

#: The table prefix of the models' ``db_table`` (the core's default).
PREFIX = "anarchon_"


def _query(conn: BaseDatabaseWrapper, text: str, params: Any = None) -> tuple[Rows, int]:
    """One statement: its rows (none for a statement without a result) and row count."""
    with conn.cursor() as cur:
        cur.execute(text, params)
        rows = list(cur.fetchall()) if cur.description is not None else []
        return rows, cur.rowcount


class OrmPostgresStore(Backend):
    """The contract on PostgreSQL, each method one statement on the worker's connection."""

    capabilities = Capabilities(lease=True, store_clock=True, finish=True)
    name = "django"

    def __init__(self, worker: Worker, *, prune_batch: int = 1000) -> None:
        self._worker = worker
        self.prune_batch = prune_batch
        self._sql: Statements | None = None

    def describe(self) -> str:
        return self._worker.describe

    # -- life cycle --------------------------------------------------------------
    async def open(self) -> None:
        """Render the statements for the tables' schema; create missing functions."""
        self._sql = await self._worker.call(self._prepare)

    async def close(self) -> None:
        self._sql = None

    def _prepare(self, conn: BaseDatabaseWrapper) -> Statements:
        rows, _ = _query(conn, "SELECT current_schema()")
        schema = rows[0][0] if rows else None
        if not schema:
            raise ConfigurationError(
                f"{self.describe()}: no schema on the search_path: run manage.py migrate"
            )
        statements = Statements(schema, PREFIX)
        count = """SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                   WHERE n.nspname = %s AND p.proname = ANY(%s)"""
        found = _query(conn, count, (schema, statements.function_names))[0][0][0]
        if found != len(statements.function_names):
            # Serialised across instances (concurrent CREATE OR REPLACE FUNCTION fails).
            with transaction.atomic(using=conn.alias):
                _query(conn, statements.lock_layout)
                for create in statements.create_functions:
                    _query(conn, create)
        return statements

    async def _rows(self, text: str, params: Any = None) -> Rows:
        return (await self._worker.call(lambda conn: _query(conn, text, params)))[0]

    async def _row(self, text: str, params: Any = None) -> tuple[Any, ...]:
        rows = await self._rows(text, params)
        if len(rows) != 1:
            raise BackendError(f"{self.describe()}: expected one row")
        return rows[0]

    @property
    def sql(self) -> Statements:
        if self._sql is None:
            raise BackendError(f"{self.describe()} is not open: await open() first")
        return self._sql

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
            ),
        )
        return Claim(Outcome(outcome), attempt, now)

    async def heartbeat(self, leases: Sequence[Lease], lease_ms: int) -> list[bool]:
        if not leases:
            return []
        rows = await self._rows(
            self.sql.heartbeat,
            (
                lease_ms,
                [lease.job for lease in leases],
                [lease.slot for lease in leases],
                [lease.attempt for lease in leases],
                [lease.token for lease in leases],
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
        try:
            meta_json = json.dumps(_without_nul(meta or {}), separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"meta {meta!r} is not valid: give a dict of JSON values ({exc})"
            ) from exc
        retrying = retry_in_ms is not None and status == Status.FAILED
        finished, held, recorded = await self._row(
            self.sql.finish,
            {
                "state": WAITING if retrying else str(status),
                "retry_in": retry_in_ms if retrying else None,
                "status": str(status),
                "error": _text(bound_error(error)),
                "meta": meta_json,
                "job": lease.job,
                "slot": lease.slot,
                "attempt": lease.attempt,
                "token": lease.token,
            },
        )
        # Not finished now: a repeat of the same outcome by the same token is still True.
        return bool(finished) or (bool(held) and recorded == str(status))

    async def release(self, lease: Lease) -> bool:
        params = {"job": lease.job, "slot": lease.slot, "attempt": lease.attempt}
        (released,) = await self._row(self.sql.release, {**params, "token": lease.token})
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
        return [_record(row) for row in await self._rows(text, params)]

    async def prune(self, older_than_ms: int) -> int:
        """Delete in batches of ``prune_batch`` records, each its own short transaction."""
        keep_jobs: list[str] = []
        keep_slots: list[int] = []
        for job, latest, anchor in await self._rows(self.sql.prune_keep):
            for slot in {latest, anchor} - {None}:
                keep_jobs.append(job)
                keep_slots.append(slot)
        params = {
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
        await self._rows(self.sql.prune_instances)  # registry rows of vanished instances
        return deleted

    # -- operations ----------------------------------------------------------------
    async def set_paused(self, job: str, paused: bool) -> None:
        await self._rows(self.sql.set_paused, (job, bool(paused)))

    async def paused_jobs(self) -> set[str]:
        return {job for (job,) in await self._rows(self.sql.paused_jobs)}

    async def trigger(self, job: str, requested_by: str) -> int:
        return int((await self._row(self.sql.trigger, (job, _text(requested_by))))[0])

    async def cancel(self, job: str, slot: int) -> bool:
        (cancelled,) = await self._row(self.sql.cancel, {"job": job, "slot": slot})
        return bool(cancelled)

    async def register(self, info: InstanceInfo, ttl_ms: int) -> None:
        try:
            text = json.dumps(_without_nul(info.to_json()), separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"instance {info.instance_id!r}: its job specs are not JSON values ({exc})"
            ) from exc
        params = {"id": _text(info.instance_id), "info": text, "ttl": ttl_ms}
        await self._rows(self.sql.register, params)

    async def unregister(self, instance_id: str) -> None:
        await self._rows(self.sql.unregister, (_text(instance_id),))

    async def instances(self) -> list[InstanceInfo]:
        rows = await self._rows(self.sql.instances)
        return [InstanceInfo.from_json({**_json(info), "last_seen": seen}) for info, seen in rows]


# -- helpers (as the core PostgreSQL backend's) ----------------------------------------
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
    """Django loads ``jsonb`` as text (its JSONField parses it): parse it here too."""
    return json.loads(value) if isinstance(value, str) else value


def _record(row: tuple[Any, ...]) -> RunRecord:
    job, slot, attempt, origin, status, instance, claimed, started, finished, error, meta = row
    return RunRecord(
        job,
        slot,
        attempt,
        Origin(origin),
        Status(status),
        instance,
        claimed,
        started,
        finished,
        error,
        _json(meta),
    )
