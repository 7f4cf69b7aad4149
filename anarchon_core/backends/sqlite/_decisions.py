"""The decisions of :mod:`anarchon_core.backends.sqlite`, each one atomic under the write lock.

Every ``decide(conn, now)`` here runs in a savepoint of a batch
(:mod:`~anarchon_core.backends.sqlite._batch`) with ``now`` read once the lock is held,
and mirrors the same step of :mod:`anarchon_core.backends.memory`. They are apart
from the backend class so that it reads as the contract and these as the store's
logic; nothing here touches the event loop.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

from ...backend import (
    EARLY_TOLERANCE_MS,
    NOT_STARTED,
    Claim,
    ClaimRequest,
    InstanceInfo,
    Lease,
    PruneScope,
    StoredDefinition,
    TakeoverRequest,
    bound_error,
    meta_json,
    overlap_reason,
    wall_clock_ms,
)
from ...errors import ConflictError
from ...records import Outcome, Status
from . import _sql as sql

__all__ = [
    "cancel",
    "claim",
    "claim_precheck",
    "definitions_since",
    "definitions_version",
    "finish",
    "held_state",
    "instance_from_row",
    "live_run",
    "prune",
    "read_definition",
    "register",
    "take_over",
    "trigger",
    "write_definition",
]


# -- the claim and the takeover ----------------------------------------------------------
def claim_precheck(conn: sqlite3.Connection, *, request: ClaimRequest) -> Claim | None:
    """``TAKEN`` without the write lock when another token already holds the run.

    A committed run row is never deleted within the claim horizon and its token never
    becomes this claim's (tokens are unique), so :func:`claim` would answer ``TAKEN``
    too. A missing row or this claim's own token (an ambiguous repeat) is decided
    under the lock.
    """
    rows = conn.execute(sql.RUN_TOKEN, (request.job, request.slot)).fetchall()
    if not rows or rows[0][0] == request.token:
        return None
    return Claim(Outcome.TAKEN, store_now=wall_clock_ms())


def claim(conn: sqlite3.Connection, now: int, *, request: ClaimRequest) -> Claim:
    job, slot = request.job, request.slot
    run = conn.execute(sql.GET_RUN, (job, slot)).fetchone()
    if run is not None:
        if run[3] == request.token and run[2] == 1:  # an ambiguous repeat
            return _repeat(run, now)
        return Claim(Outcome.TAKEN, store_now=now)
    if slot < now - request.horizon_ms:
        return Claim(Outcome.EXPIRED, store_now=now)
    if slot > now + EARLY_TOLERANCE_MS:
        return Claim(Outcome.EARLY, store_now=now)
    if request.version is None:  # a code job: the pause alone, as before definitions
        paused = conn.execute(sql.IS_PAUSED, (job,)).fetchone() is not None
    else:  # the same read of the job's row also says whether that version is held
        row = conn.execute(sql.CLAIM_JOB, (request.version, job)).fetchone()
        if row is None or not row[1]:
            return Claim(Outcome.STALE, store_now=now)
        paused = bool(row[0])
    origin, fingerprint = str(request.origin), request.fingerprint
    nothing_ran: tuple[Status, Outcome, str | None] | None = None
    if paused:
        nothing_ran = Status.PAUSED, Outcome.PAUSED, None
    elif (
        request.skip_overlap and (overlapped := live_run(conn, job, now, exclude=slot)) is not None
    ):
        nothing_ran = Status.SKIPPED, Outcome.SKIPPED, overlap_reason(overlapped)
    if nothing_ran is not None:  # recorded once (attempt 0): later claims are TAKEN
        status, outcome, why = nothing_ran
        conn.execute(sql.INSERT_RUN, (job, slot, origin, status.value, 0, None, 0, fingerprint))
        conn.execute(
            sql.INSERT_NOTHING_RAN,
            (job, slot, origin, status.value, request.instance_id, now, now, why),
        )
        return Claim(outcome, store_now=now)
    lease_expires = now + request.lease_ms
    conn.execute(
        sql.INSERT_RUN,
        (job, slot, origin, Status.RUNNING.value, 1, request.token, lease_expires, fingerprint),
    )
    conn.execute(
        sql.INSERT_ATTEMPT,
        (job, slot, 1, origin, Status.RUNNING.value, request.instance_id, now, now, None),
    )
    return Claim(Outcome.WON, 1, now)


def take_over(conn: sqlite3.Connection, now: int, *, request: TakeoverRequest) -> Claim:
    """Continue a run whose lease expired or whose retry is due, or start a manual request."""
    key = (request.job, request.slot)
    run = conn.execute(sql.GET_RUN, key).fetchone()
    if run is None:
        return Claim(Outcome.TAKEN, store_now=now)
    origin, state, attempt, token, lease_expires, retry_at, requested_by = run
    if token == request.token and attempt == request.attempt + 1:
        return _repeat(run, now)  # an ambiguous repeat: this token won
    expired = state == Status.RUNNING and lease_expires <= now
    retry_due = state == sql.WAITING and retry_at <= now
    pending = state == sql.PENDING
    if attempt != request.attempt or not (expired or retry_due or pending):
        return Claim(Outcome.TAKEN, store_now=now)
    exhausted = request.attempt >= request.max_attempts
    if exhausted or request.slot < now - request.horizon_ms:
        if expired:
            _interrupt(conn, request, now)
        elif pending:  # a manual request nobody started in time: it ran nothing
            status = Status.INTERRUPTED.value
            conn.execute(
                sql.INSERT_NOTHING_RAN, (*key, origin, status, requested_by, now, now, NOT_STARTED)
            )
        # A due retry that may not run keeps its failure; a dead runner's run is interrupted.
        ended = Status.FAILED if retry_due else Status.INTERRUPTED
        conn.execute(sql.END_RUN, (ended.value, *key))
        return Claim(Outcome.EXHAUSTED if exhausted else Outcome.EXPIRED, store_now=now)
    if request.skip_overlap and live_run(conn, request.job, now, exclude=request.slot) is not None:
        return Claim(Outcome.BLOCKED, store_now=now)
    _interrupt(conn, request, now)
    attempt += 1
    conn.execute(sql.TAKE_OVER_RUN, (attempt, request.token, now + request.lease_ms, *key))
    conn.execute(
        sql.INSERT_ATTEMPT,
        (*key, attempt, origin, Status.RUNNING.value, request.instance_id, now, now, None),
    )
    return Claim(Outcome.WON, attempt, now)


# -- job definitions ---------------------------------------------------------------------
def write_definition(
    conn: sqlite3.Connection, _now: int, *, job: str, body: str | None, expected: int | None
) -> int:
    """Store (or, ``body`` None, remove) ``job``'s definition at the counter's next version.

    Under the write lock the counter is read and advanced in the same transaction as
    the row it versions, so versions are issued in commit order. A conflict raises
    before anything is written (its savepoint rolls back nothing).
    """
    row = conn.execute(sql.DEFINITION_VERSION, (job,)).fetchone()
    current = 0 if row is None else int(row[0])
    if expected is not None and expected != current:
        raise ConflictError(
            f"definition {job!r} is at version {current}, not {expected}", current=current
        )
    if body is None and current == 0:  # nothing to remove: no change, no version
        return 0
    version = definitions_version(conn) + 1
    conn.execute(sql.SET_DEFINITIONS_VERSION, (str(version),))
    conn.execute(sql.WRITE_DEFINITION, (job, version, body))
    return version


def definitions_version(conn: sqlite3.Connection) -> int:
    """The newest version issued: the counter row, or (none) the highest a row holds."""
    row = conn.execute(sql.DEFINITIONS_VERSION).fetchone()
    if row is not None:
        return int(row[0])
    (highest,) = conn.execute(sql.HIGHEST_DEFINITION).fetchone()
    return 0 if highest is None else int(highest)


def read_definition(conn: sqlite3.Connection, job: str) -> StoredDefinition | None:
    """``job``'s current definition (``None``: none, or removed): one row by the key."""
    row = conn.execute(sql.READ_DEFINITION, (job,)).fetchone()
    return None if row is None else StoredDefinition(job, int(row[0]), row[1])


def definitions_since(conn: sqlite3.Connection, version: int) -> list[StoredDefinition]:
    """Every definition changed after ``version``, by version: one statement, so one
    snapshot (a change is never seen without those committed before it)."""
    rows = conn.execute(sql.DEFINITIONS_SINCE, (version,))
    return [StoredDefinition(str(job), int(v), body) for job, v, body in rows]


# -- operations ----------------------------------------------------------------------
def trigger(conn: sqlite3.Connection, now: int, *, job: str, requested_by: str) -> int:
    """The job's pending manual request, or a new one at the first free ms from ``now``."""
    row = conn.execute(sql.PENDING_SLOT, (job,)).fetchone()
    if row is not None:
        return int(row[0])  # pressed twice, or on several instances: one request
    slot = now
    while conn.execute(sql.RUN_EXISTS, (job, slot)).fetchone() is not None:
        slot += 1  # a run of this very millisecond (say a scheduled one) keeps its slot
    conn.execute(sql.INSERT_PENDING, (job, slot, requested_by))
    return slot


def cancel(conn: sqlite3.Connection, now: int, *, job: str, slot: int) -> bool:
    """End a pending, running or waiting run ``cancelled``; ``False`` if none is open."""
    run = conn.execute(sql.GET_RUN, (job, slot)).fetchone()
    if run is None:
        return False
    origin, state, attempt, _token, _lease, _retry, requested_by = run
    if state == sql.PENDING:  # nothing ran: one attempt-0 record, as for a paused slot
        conn.execute(
            sql.INSERT_NOTHING_RAN,
            (job, slot, origin, Status.CANCELLED.value, requested_by, now, now, None),
        )
    elif state == Status.RUNNING:  # an attempt that already ended keeps its status
        conn.execute(sql.CANCEL_ATTEMPT, (now, job, slot, attempt))
    elif state != sql.WAITING:  # a waiting run's failed attempt stands as it is
        return False  # ended already
    conn.execute(sql.CANCEL_RUN, (job, slot))
    return True


def register(
    conn: sqlite3.Connection, now: int, *, instance_id: str, info_json: str, ttl_ms: int
) -> None:
    """Upsert an instance seen at the store's ``now``; dead ones are dropped on the way."""
    conn.execute(sql.FORGET_DEAD, (now,))
    conn.execute(sql.REGISTER, (instance_id, info_json, now, now + ttl_ms))


def instance_from_row(row: tuple[Any, ...]) -> InstanceInfo:
    text, last_seen = row
    data = json.loads(text)
    data["last_seen"] = last_seen  # the store's clock, whatever the instance sent
    return InstanceInfo.from_json(data)


# -- retention ---------------------------------------------------------------------------
def prune(conn: sqlite3.Connection, _now: int, *, older_than_ms: int, scope: PruneScope) -> int:
    # Per job keep the slot of its latest record and its latest scheduled run: the
    # second anchors catch-up (last_scheduled_slot), which a manual run must not move.
    # Only the jobs in scope: services that share the store keep their own retention.
    deleted = 0
    for job in scope.select([job for (job,) in conn.execute(sql.PRUNE_JOBS)]):
        latest = conn.execute(sql.LATEST_SLOT, (job,)).fetchone()[0]
        anchor = conn.execute(sql.LAST_SCHEDULED_SLOT, (job,)).fetchone()
        keep = (latest, None if anchor is None else anchor[0])
        deleted += conn.execute(sql.PRUNE_ATTEMPTS, (job, older_than_ms, *keep)).rowcount
        conn.execute(sql.PRUNE_RUNS, (job, older_than_ms, *keep))
    return deleted


# -- helpers -----------------------------------------------------------------------------
def finish(
    lease: Lease,
    status: Status,
    *,
    error: str | None = None,
    meta: dict[str, Any] | None = None,
    retry_in_ms: int | None = None,
) -> Callable[[sqlite3.Connection, int], bool]:
    """The decision that records ``lease``'s outcome: True if recorded (or a repeat of it).

    Built apart from the backend so that a caller holding its own transaction on the
    same file (the Django adapter's ``transactional=True``) can run it there.
    """
    meta_text = meta_json(meta)
    error = bound_error(error)

    def decide(conn: sqlite3.Connection, now: int) -> bool:
        key = (lease.job, lease.slot)
        state = held_state(conn, lease)
        if state is None:
            return False
        if state != Status.RUNNING:  # an idempotent repeat, or a different outcome
            row = conn.execute(sql.ATTEMPT_STATUS, (*key, lease.attempt)).fetchone()
            return row is not None and row[0] == str(status)
        new_state, retry_at = str(status), None
        if retry_in_ms is not None and status == Status.FAILED:
            new_state, retry_at = sql.WAITING, now + retry_in_ms
        conn.execute(sql.FINISH_RUN, (new_state, retry_at, *key))
        conn.execute(sql.FINISH_ATTEMPT, (str(status), now, error, meta_text, *key, lease.attempt))
        return True

    return decide


def held_state(conn: sqlite3.Connection, lease: Lease) -> str | None:
    """The run's state if ``lease`` still holds it (attempt and token match), else None."""
    row = conn.execute(
        sql.HELD_STATE, (lease.job, lease.slot, lease.attempt, lease.token)
    ).fetchone()
    return None if row is None else str(row[0])


def live_run(conn: sqlite3.Connection, job: str, now: int, *, exclude: int) -> int | None:
    """The earliest other slot of ``job`` whose lease is live, if any."""
    (slot,) = conn.execute(sql.LIVE_RUN, (job, now, exclude)).fetchone()
    return None if slot is None else int(slot)


def _repeat(run: tuple[Any, ...], now: int) -> Claim:
    """A repeat by the token that won: ``WON`` only while its lease is live, else ``LAPSED``.

    ``run`` is a :data:`sql.GET_RUN` row held by the repeated token; nothing is written.
    """
    _origin, state, attempt, _token, lease_expires = run[:5]
    if state == Status.RUNNING and lease_expires > now:
        return Claim(Outcome.WON, attempt, now)
    return Claim(Outcome.LAPSED, store_now=now)


def _interrupt(conn: sqlite3.Connection, request: TakeoverRequest, now: int) -> None:
    """End the dead attempt's record as interrupted, unless it already has an outcome."""
    params = (now, "lease expired", request.job, request.slot, request.attempt, 1)
    conn.execute(sql.INTERRUPT_ATTEMPT, params)
