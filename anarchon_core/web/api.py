"""The read API: the cluster's state as the one JSON encoding of ``docs/api.md``.

Pure functions of an open :class:`~anarchon_core.backend.Backend`, with no framework,
so that the CLI's ``--json``, the dashboard and every adapter answer the same thing.
Everything is read from the shared store (never from one process's memory), so under
``uvicorn --workers N`` whichever worker serves a request shows the whole cluster.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from .. import stored_jobs
from ..backend import Backend, InstanceInfo
from ..definitions import Definition
from ..errors import CapabilityError, ConfigurationError
from ..names import validate_job_name
from ..operations import fingerprint_mismatches
from ..records import HistoryQuery, Origin, RunRecord, Status, iso_utc

__all__ = [
    "DEFAULT_RUNS_LIMIT",
    "DEFAULT_WINDOW_MS",
    "MAX_RUNS_LIMIT",
    "MAX_WINDOW_MS",
    "SCHEMAS",
    "decode_cursor",
    "encode_cursor",
    "instance_json",
    "instances",
    "jobs",
    "parse_status",
    "runs",
    "window_stats",
]

DEFAULT_WINDOW_MS = 24 * 3_600_000
MAX_WINDOW_MS = 7 * 24 * 3_600_000
DEFAULT_RUNS_LIMIT = 50
MAX_RUNS_LIMIT = 1000
#: The newest records read per job for its window statistics (``truncated`` beyond).
STATS_RECORDS = 2000
#: How many recent records are read to find jobs that only history knows.
DISCOVERY_RECORDS = 500
NEXT_SLOTS = 5

Key = tuple[int, str, int]


# -- runs ------------------------------------------------------------------------------
def encode_cursor(record: RunRecord) -> str:
    """The opaque cursor that continues a page after ``record``."""
    raw = json.dumps([record.slot, record.job, record.attempt], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> Key:
    """Read :func:`encode_cursor`'s text back.

    :raises ConfigurationError: not a cursor this API handed out.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        slot, job, attempt = json.loads(raw)
        if not (_is_int(slot) and isinstance(job, str) and _is_int(attempt)):
            raise ValueError
    except (ValueError, TypeError, binascii.Error):
        raise ConfigurationError(
            f"cursor {cursor!r} is not valid: pass back the next_cursor of the previous page"
        ) from None
    return slot, job, attempt


def parse_status(value: str | Status | None) -> Status | None:
    """A status word, or ``None``; a bad word names the whole set."""
    if value is None or isinstance(value, Status):
        return value
    try:
        return Status(value)
    except ValueError:
        words = ", ".join(s.value for s in Status)
        raise ConfigurationError(f"status {value!r} is not valid: use one of {words}") from None


async def runs(
    backend: Backend,
    *,
    job: str | None = None,
    status: str | Status | None = None,
    since: int | None = None,
    until: int | None = None,
    limit: int = DEFAULT_RUNS_LIMIT,
    cursor: str | None = None,
) -> dict[str, Any]:
    """One page of history, newest first, and the cursor of the next page (or ``None``)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RUNS_LIMIT:
        raise ConfigurationError(
            f"limit {limit!r} is not valid: give an integer from 1 to {MAX_RUNS_LIMIT}"
        )
    for name, value in (("since", since), ("until", until)):
        if value is not None and not _is_int(value):
            raise ConfigurationError(f"{name} {value!r} is not valid: give epoch milliseconds")
    query = HistoryQuery(
        job=None if job is None else validate_job_name(job),
        status=parse_status(status),
        since=since,
        until=until,
        limit=limit + 1,  # one more tells whether another page exists
        before=None if cursor is None else decode_cursor(cursor),
    )
    records = await backend.history(query)
    page = records[:limit]
    more = len(records) > limit
    return {
        "runs": [r.to_json() for r in page],
        "next_cursor": encode_cursor(page[-1]) if more else None,
    }


# -- jobs ------------------------------------------------------------------------------
async def jobs(
    backend: Backend,
    *,
    window_ms: int = DEFAULT_WINDOW_MS,
    actions: bool = False,
    now_ms: int | None = None,
) -> dict[str, Any]:
    """Every job the cluster knows, with its schedule, next slots, last run and stats.

    The jobs are those the live instances list (the registry holds each job's name and
    fingerprint only), the paused ones and those with history in the window; a job's
    schedule, zone and options come from its stored definition (code jobs are stored
    by ``sync_code_jobs``, which a starting scheduler runs), read once per request.
    """
    if not _is_int(window_ms) or not 0 < window_ms <= MAX_WINDOW_MS:
        raise ConfigurationError(
            f"window {window_ms!r} ms is not valid: give a duration from 1ms to 7d"
        )
    now = await backend.now_ms() if now_ms is None else now_ms
    since = now - window_ms
    live, paused, recent, stored = await asyncio.gather(
        _live(backend),
        _paused(backend),
        backend.history(HistoryQuery(since=since, limit=DISCOVERY_RECORDS)),
        _stored(backend),
    )
    holders = _holders_by_job(live)
    names = sorted({*holders, *paused, *(r.job for r in recent)})
    rows = await asyncio.gather(
        *(
            _job_row(
                backend, name, holders.get(name, []), stored.get(name), name in paused, now, since
            )
            for name in names
        )
    )
    return {
        **_now(now),
        "actions": actions,
        "window": {"since": since, "since_at": iso_utc(since)},
        "jobs": list(rows),
    }


async def _job_row(
    backend: Backend,
    name: str,
    fingerprints: list[str],
    definition: Definition | None,
    paused: bool,
    now: int,
    since: int,
) -> dict[str, Any]:
    records = await backend.history(HistoryQuery(job=name, since=since, limit=STATS_RECORDS + 1))
    truncated = len(records) > STATS_RECORDS
    records = records[:STATS_RECORDS]
    last = records[0] if records else await _latest(backend, name)
    schedule = None if definition is None else definition.effective_schedule
    return {
        "job": name,
        "schedule": None if schedule is None else schedule.describe(),
        "tz": None if schedule is None else schedule.tz,
        "paused": paused,
        "instances": len(fingerprints),
        "fingerprints": sorted(set(fingerprints)),
        "options": None if definition is None else dict(definition.options),
        "next_slots": [] if definition is None else _next_slots(definition, now),
        "last_run": None if last is None else last.to_json(),
        "stats": window_stats(records, truncated=truncated),
    }


async def _latest(backend: Backend, job: str) -> RunRecord | None:
    older = await backend.history(HistoryQuery(job=job, limit=1))
    return older[0] if older else None


def _holders_by_job(live: Sequence[InstanceInfo]) -> dict[str, list[str]]:
    """Each job's fingerprints from the live instances that list it, one per instance."""
    holders: dict[str, list[str]] = {}
    for info in live:
        for job, fingerprint in info.jobs.items():
            holders.setdefault(job, []).append(fingerprint)
    return holders


async def _stored(backend: Backend) -> dict[str, Definition]:
    """The stored definitions by store name (removed ones left out; none where the store
    keeps no definitions)."""
    try:
        stored = await stored_jobs.current(backend)
    except CapabilityError:
        return {}
    out = {}
    for job, change in stored.items():
        if change.body is None:
            continue
        try:
            out[job] = Definition.from_body(change.body, change.version)
        except (ConfigurationError, ValueError):  # not valid (a newer writer): no schedule
            continue
    return out


def _next_slots(definition: Definition, now: int) -> list[dict[str, Any]]:
    """The next slots of a definition after ``now`` (none while it is disabled)."""
    if not definition.enabled:
        return []
    slots = definition.effective_schedule.next_slots(now, NEXT_SLOTS)
    return [{"slot": slot, "at": iso_utc(slot)} for slot in slots]


def window_stats(records: Iterable[RunRecord], *, truncated: bool = False) -> dict[str, Any]:
    """The counts and timings ``docs/api.md`` defines, over the given records of one job."""
    records = list(records)
    by_key = {(r.slot, r.attempt): r for r in records}
    counts = {s: 0 for s in Status}
    takeovers = retries = 0
    for r in records:
        counts[r.status] += 1
        if r.attempt >= 2:
            before = by_key.get((r.slot, r.attempt - 1))
            if before is not None and before.status == Status.FAILED:
                retries += 1
            else:
                takeovers += 1
    durations = [
        r.duration_ms
        for r in records
        if r.duration_ms is not None and r.status in (Status.SUCCESS, Status.FAILED)
    ]
    lateness = [
        r.lateness_ms
        for r in records
        if r.attempt == 1 and r.origin == Origin.SCHEDULE and r.lateness_ms is not None
    ]
    return {
        "runs": len({r.slot for r in records if r.attempt >= 1}),
        "success": counts[Status.SUCCESS],
        "failures": counts[Status.FAILED],
        "interrupted": counts[Status.INTERRUPTED],
        "cancelled": counts[Status.CANCELLED],
        "takeovers": takeovers,
        "retries": retries,
        "skips": counts[Status.SKIPPED],
        "paused": counts[Status.PAUSED],
        "duration_ms": _summary(durations),
        "lateness_ms": _summary(lateness),
        "records": len(records),
        "truncated": truncated,
    }


def _summary(values: list[int]) -> dict[str, float | int] | None:
    if not values:
        return None
    ordered = sorted(values)
    p95 = ordered[max(math.ceil(0.95 * len(ordered)) - 1, 0)]  # nearest rank
    return {"mean": round(sum(ordered) / len(ordered), 1), "p95": p95}


# -- instances -------------------------------------------------------------------------
async def instances(backend: Backend, *, now_ms: int | None = None) -> dict[str, Any]:
    """The live instances and the jobs whose live instances disagree on a fingerprint.

    :raises CapabilityError: the backend keeps no registry (claim-only stores).
    """
    live = await backend.instances()
    now = await backend.now_ms() if now_ms is None else now_ms
    return {
        **_now(now),
        "instances": [instance_json(info) for info in live],
        "mismatches": fingerprint_mismatches(live),
    }


def instance_json(info: InstanceInfo) -> dict[str, Any]:
    """An instance as the API shows it: ISO times where the store keeps integers."""
    return {
        "instance_id": info.instance_id,
        "host": info.host,
        "pid": info.pid,
        "version": info.version,
        "started_at": iso_utc(info.started_at),
        "last_seen_at": iso_utc(info.last_seen),
        "skew_ms": info.skew_ms,
        "jobs": info.jobs,
        "targets": list(info.targets),
    }


# -- shared ----------------------------------------------------------------------------
async def _live(backend: Backend) -> list[InstanceInfo]:
    try:
        return await backend.instances()
    except CapabilityError:
        return []  # claim-only stores keep no registry: jobs come from history alone


async def _paused(backend: Backend) -> set[str]:
    try:
        return set(await backend.paused_jobs())
    except CapabilityError:
        return set()


def _now(now: int) -> dict[str, Any]:
    return {"now": now, "now_at": iso_utc(now)}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- stored definitions -------------------------------------------------------------------
def split_store_name(job: str) -> tuple[str | None, str]:
    """``(namespace, name)`` of a stored definition's store name (names hold no ``:``)."""
    namespace, _, name = job.rpartition(":")
    return namespace or None, name


async def definitions(backend: Backend, *, now_ms: int | None = None) -> dict[str, Any]:
    """Every stored definition of every namespace, each with its store name, whether a
    live instance holds its target (``None``: the store has no registry) and its next
    five slots."""
    now = await backend.now_ms() if now_ms is None else now_ms
    stored = await stored_jobs.current(backend)
    held = await targets_held(backend)
    items = [
        definition_json(job, Definition.from_body(change.body, change.version), held, now)
        for job, change in sorted(stored.items())
        if change.body is not None
    ]
    return {**_now(now), "definitions": items}


async def targets_held(backend: Backend) -> set[str] | None:
    """The targets the live instances hold (``None``: the store has no registry)."""
    try:
        live = await backend.instances()
    except CapabilityError:
        return None
    return {target for info in live for target in info.targets}


def definition_json(
    job: str, definition: Definition, held: set[str] | None, now: int
) -> dict[str, Any]:
    """One definition as the API shows it."""
    namespace, _ = split_store_name(job)
    target_held = None
    if definition.owner == "store" and held is not None:
        target_held = definition.target in held
    return {
        "job": job,
        "namespace": namespace,
        **definition.to_json(),
        "target_held": target_held,
        "next_slots": _next_slots(definition, now),
    }


# -- JSON Schemas ----------------------------------------------------------------------
def _object(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    """An object schema: ``required`` properties must be present, and any property not
    named is allowed (a newer core may add fields)."""
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
        "additionalProperties": True,
    }


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


_INT: dict[str, Any] = {"type": "integer"}
_TEXT: dict[str, Any] = {"type": "string"}
_FLAG: dict[str, Any] = {"type": "boolean"}
_MAP: dict[str, Any] = {"type": "object", "additionalProperties": True}
_NOW = {"now": _INT, "now_at": _TEXT}
_RUN = _object(
    {
        "job": _TEXT,
        "slot": _INT,
        "scheduled_at": _TEXT,
        "attempt": _INT,
        "origin": {"type": "string", "enum": [o.value for o in Origin]},
        "status": {"type": "string", "enum": [s.value for s in Status]},
    },
    {
        **{
            key: _nullable(_TEXT)
            for key in (
                "instance_id",
                "claimed_at",
                "started_at",
                "finished_at",
                "error",
                "error_summary",
            )
        },
        "duration_ms": _nullable(_INT),
        "lateness_ms": _nullable(_INT),
        "meta": _MAP,
    },
)
_SUMMARY = _nullable(
    _object({}, {"mean": _nullable({"type": "number"}), "p95": _nullable({"type": "number"})})
)
_COUNTS = ("runs", "success", "failures", "interrupted", "cancelled", "takeovers", "retries")
_STATS = _object(
    {**{key: _INT for key in (*_COUNTS, "skips", "paused", "records")}, "truncated": _FLAG},
    {"duration_ms": _SUMMARY, "lateness_ms": _SUMMARY},
)
_JOB = _object(
    {"job": _TEXT, "paused": _FLAG, "instances": _INT},
    {
        "schedule": _nullable(_TEXT),
        "tz": _nullable(_TEXT),
        "fingerprints": {"type": "array", "items": _TEXT},
        "options": _nullable(_MAP),
        "next_slots": {"type": "array", "items": _object({"slot": _INT, "at": _TEXT})},
        "last_run": _nullable(_RUN),
        "stats": _nullable(_STATS),
    },
)
_INSTANCE = _object(
    {
        "instance_id": _TEXT,
        "host": _TEXT,
        "pid": _INT,
        "version": _TEXT,
        "started_at": _TEXT,
        "last_seen_at": _TEXT,
        "skew_ms": _INT,
        "jobs": {"type": "object", "additionalProperties": _TEXT},
    },
    {"targets": {"type": "array", "items": _TEXT}},
)
_DEFINITION = _object(
    {
        "job": _TEXT,
        "name": _TEXT,
        "schedule": _MAP,
        "target": _TEXT,
        "version": _INT,
        "enabled": _FLAG,
        "owner": {"type": "string", "enum": ["store", "code"]},
    },
    {
        "namespace": _nullable(_TEXT),
        "args": {"type": "array"},
        "kwargs": _MAP,
        "options": _MAP,
        "reason": _nullable(_TEXT),
        "start_at": _nullable(_TEXT),
        "end_at": _nullable(_TEXT),
        "description": _TEXT,
        "target_options": _MAP,
        "target_held": _nullable(_FLAG),
        "next_slots": {"type": "array", "items": _object({"slot": _INT, "at": _TEXT})},
    },
)
_FINGERPRINTS = {"type": "object", "additionalProperties": {"type": "array", "items": _TEXT}}

#: JSON Schemas of the answers and bodies of ``docs/api.md``, by name: ``jobs``,
#: ``runs``, ``instances``, ``health``, ``paused`` (pause, resume), ``trigger``,
#: ``cancel``, ``cancel_body`` and ``action_body`` (the others' request bodies),
#: ``error`` (the answer of every 4xx and 5xx, but health's 503). Objects
#: allow properties they do not name, so a client keeps working with a newer core.
SCHEMAS: dict[str, dict[str, Any]] = {
    "jobs": _object(
        {
            **_NOW,
            "actions": _FLAG,
            "window": _object({"since": _INT, "since_at": _TEXT}),
            "jobs": {"type": "array", "items": _JOB},
        }
    ),
    "runs": _object({"runs": {"type": "array", "items": _RUN}}, {"next_cursor": _nullable(_TEXT)}),
    "instances": _object(
        {
            **_NOW,
            "instances": {"type": "array", "items": _INSTANCE},
            "mismatches": {"type": "object", "additionalProperties": _FINGERPRINTS},
        }
    ),
    "health": _object(
        {"status": {"type": "string", "enum": ["ok", "unavailable"]}, "backend": _TEXT},
        {
            key: _nullable(schema)
            for key, schema in {**_NOW, "instances": _INT, "error": _TEXT}.items()
        },
    ),
    "paused": _object({"job": _TEXT, "paused": _FLAG}),
    "trigger": _object({"job": _TEXT, "slot": _INT, "scheduled_at": _TEXT}),
    "cancel": _object({"job": _TEXT, "slot": _INT, "cancelled": _FLAG}),
    "cancel_body": _object({"job": _TEXT, "slot": _INT}),
    "action_body": {"type": "object", "description": "any JSON object, e.g. {}; ignored"},
    "error": _object({"error": _TEXT}, {"current": _INT}),
    "definitions": _object({**_NOW, "definitions": {"type": "array", "items": _DEFINITION}}),
    "definition": _DEFINITION,
    "definition_body": _object(
        {"name": _TEXT, "schedule": _MAP, "target": _TEXT},
        {
            "namespace": _nullable(_TEXT),
            "version": _INT,
            "args": {"type": "array"},
            "kwargs": _MAP,
            "options": _MAP,
            "enabled": _FLAG,
            "reason": _nullable(_TEXT),
            "start_at": _nullable(_TEXT),
            "end_at": _nullable(_TEXT),
            "description": _TEXT,
            "target_options": _MAP,
        },
    ),
    "removed": _object({"job": _TEXT, "removed": _FLAG}),
    "remove_body": _object({"version": _INT}),
}
