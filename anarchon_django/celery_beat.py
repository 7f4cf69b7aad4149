"""``manage.py anarchon import-celery-beat``: django-celery-beat's ``PeriodicTask`` rows as
stored definitions.

The rows are read with plain SQL from django-celery-beat's tables
(``django_celery_beat_periodictask`` and its four schedule tables), so the import works
whether the app is installed or its tables are only left in the database; columns that
an older django-celery-beat lacks are read as absent. Each row becomes one definition
(:func:`convert`), or a refusal with its reason; :func:`import_rows` writes them through
:mod:`anarchon_core.stored_jobs`, creating, updating or leaving each one, so the import
can be run again after a change: it updates, never duplicates.

The mapping (docs/django.md, "Migrating from django-celery-beat", has the whole table):

* the name: a definition name holds only ``A-Z a-z 0-9 _ . -``; a ``PeriodicTask`` name
  that is not one becomes its ASCII slug with 8 hex digits of its hash (stable across
  runs), and the description's first line keeps the original. That line also marks the
  definition as this import's: a definition of the same name that it does not mark
  (written by hand, a code job's) is never overwritten.
* interval → ``every`` (on anarchon's epoch grid, not counted from the last run);
  crontab → ``cron`` in the row's zone, with ``day_or`` false where both days are given
  (Celery requires both to match, cron either); clocked → ``at``; solar → refused.
* ``one_off`` on an interval or crontab → an ``at`` of the schedule's first slot after the
  first import (kept on later runs); a one-off that already ran (``last_run_at`` set) or
  whose time has passed is skipped: django-celery-beat disabled or would disable it.
* ``expires`` → ``end_at`` (a row already expired is skipped); ``expire_seconds`` →
  ``target_options["expires"]``, the message's expiry in seconds; ``queue``,
  ``exchange``, ``routing_key``, ``headers``, ``priority`` → ``target_options``;
  ``start_time`` → ``start_at``; ``enabled`` → ``enabled`` (with a reason).
* ``last_run_at`` → one history record (``success``, instance
  :data:`IMPORT_INSTANCE`) at that instant, written before the definition unless the
  store already records a later run: catch-up starts from a job's last recorded run,
  so an imported job runs what django-celery-beat would have run at its next start
  (the newest slot missed since ``last_run_at``, once: ``catch_up="latest"``, set on
  every imported definition) and nothing older. Without it (a row that never ran) the
  job starts at its next slot.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import secrets
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from anarchon_core import stored_jobs
from anarchon_core.backend import Backend, ClaimRequest, Lease
from anarchon_core.definitions import Definition
from anarchon_core.errors import CapabilityError, ConfigurationError, ConflictError
from anarchon_core.names import store_name
from anarchon_core.records import Origin, Outcome, Status
from anarchon_core.schedules import NO_SLOT, At, Cron, Every, Schedule, format_instant_ms

__all__ = [
    "IMPORT_INSTANCE",
    "MARK",
    "TABLES",
    "Conversion",
    "Result",
    "celery_task_names",
    "convert",
    "definition_name",
    "import_rows",
    "read_rows",
    "table",
]

#: django-celery-beat's tables, by the schedule kind (and ``task`` for the rows).
TABLES = {
    "task": "django_celery_beat_periodictask",
    "interval": "django_celery_beat_intervalschedule",
    "crontab": "django_celery_beat_crontabschedule",
    "clocked": "django_celery_beat_clockedschedule",
    "solar": "django_celery_beat_solarschedule",
}
#: The first line of an imported definition's description starts with this.
MARK = "django-celery-beat PeriodicTask "
#: The instance named in the history record that carries a row's ``last_run_at`` over.
IMPORT_INSTANCE = "django-celery-beat-import"

_TASK_COLUMNS = (
    "id",
    "name",
    "task",
    "args",
    "kwargs",
    "queue",
    "exchange",
    "routing_key",
    "headers",
    "priority",
    "expires",
    "expire_seconds",
    "one_off",
    "start_time",
    "enabled",
    "last_run_at",
    "description",
    "interval_id",
    "crontab_id",
    "clocked_id",
    "solar_id",
)
_SCHEDULE_COLUMNS = {
    "interval": ("id", "every", "period"),
    "crontab": ("id", "minute", "hour", "day_of_month", "month_of_year", "day_of_week", "timezone"),
    "clocked": ("id", "clocked_time"),
    "solar": ("id", "event", "latitude", "longitude"),
}
_PERIODS = {"days": "d", "hours": "h", "minutes": "m", "seconds": "s"}
_SEND_OPTIONS = ("queue", "exchange", "routing_key")
_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9_.-]+")
_VALID_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")


# -- reading the tables -------------------------------------------------------------------------
def read_rows(using: str = "default") -> list[dict[str, Any]]:
    """Every ``PeriodicTask`` row of the database ``using``, oldest first, each with its
    schedule's row under ``interval``, ``crontab``, ``clocked`` or ``solar``.

    :raises ConfigurationError: the database has no ``django_celery_beat_periodictask``.
    """
    from django.db import connections

    connection = connections[using]
    with connection.cursor() as cursor:
        present = set(connection.introspection.table_names(cursor))
        if TABLES["task"] not in present:
            raise ConfigurationError(
                f"the database {using!r} has no table {TABLES['task']}: nothing to import "
                "(is django-celery-beat migrated there? give --database ALIAS)"
            )
        rows = _select(connection, cursor, TABLES["task"], _TASK_COLUMNS)
        schedules = {
            kind: {row["id"]: row for row in _select(connection, cursor, TABLES[kind], columns)}
            for kind, columns in _SCHEDULE_COLUMNS.items()
            if TABLES[kind] in present
        }
    for row in rows:
        for kind, by_id in schedules.items():
            key = row.get(f"{kind}_id")
            if key is not None:
                row[kind] = by_id.get(key, {})
            elif f"{kind}_id" in row:
                row[kind] = None
    return sorted(rows, key=lambda row: row["id"])


def _select(
    connection: Any, cursor: Any, table: str, wanted: tuple[str, ...]
) -> list[dict[str, Any]]:
    """``wanted``'s columns that ``table`` has (an older django-celery-beat lacks some)."""
    have = {c.name for c in connection.introspection.get_table_description(cursor, table)}
    columns = [c for c in wanted if c in have]
    quote = connection.ops.quote_name
    cursor.execute(f"SELECT {', '.join(map(quote, columns))} FROM {quote(table)}")
    return [dict(zip(columns, values, strict=True)) for values in cursor.fetchall()]


# -- one row ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Conversion:
    """What one row becomes: a definition, or the reason it is skipped. ``one_off``: its
    ``at`` was computed from the schedule (an earlier import's is kept instead)."""

    source: str
    name: str
    definition: Definition | None = None
    skipped: str | None = None
    notes: tuple[str, ...] = ()
    last_run_ms: int | None = None
    one_off: bool = False


def definition_name(original: str) -> str:
    """A valid definition name for a ``PeriodicTask`` name: itself when it is one, else
    its ASCII slug and 8 hex digits of its SHA-256 (the same on every run)."""
    if _VALID_NAME.fullmatch(original):
        return original
    ascii_text = unicodedata.normalize("NFKD", original).encode("ascii", "ignore").decode()
    slug = _NAME_CHARACTERS.sub("-", ascii_text).strip("-_.")[:190].rstrip("-_.")
    digest = hashlib.sha256(original.encode()).hexdigest()[:8]
    return f"{slug}-{digest}" if slug else f"periodic-task-{digest}"


def convert(row: Mapping[str, Any], *, now_ms: int, naive_zone: dt.tzinfo = dt.UTC) -> Conversion:
    """One ``PeriodicTask`` row (as :func:`read_rows` gives it) as a definition.

    ``naive_zone`` is the zone of naive datetimes (Django's: UTC with ``USE_TZ``, else
    ``TIME_ZONE``)."""
    source = str(row["name"])
    name = definition_name(source)
    notes: list[str] = []
    if name != source:
        notes.append("renamed (the description keeps the name)")

    def skip(reason: str) -> Conversion:
        return Conversion(source, name, skipped=reason, notes=tuple(notes))

    def instant(key: str) -> int | None:
        return _instant_ms(row.get(key), naive_zone)

    last_run = instant("last_run_at")
    start_at, end_at = instant("start_time"), instant("expires")
    one_off = bool(row.get("one_off"))
    schedule: Schedule
    computed_at = False
    if row.get("solar") is not None:
        return skip("a solar schedule: anarchon has none (compute the time in a frequent job)")
    if row.get("clocked") is not None:
        at = _instant_ms(row["clocked"].get("clocked_time"), naive_zone)
        if at is None:
            return skip("its clocked schedule row is missing")
        if last_run is not None:
            return skip(f"a one-off that already ran, at {format_instant_ms(last_run)}")
        if at <= now_ms:
            return skip(
                f"a one-off whose time ({format_instant_ms(at)}) has passed and that never "
                "ran: anarchon runs no past one-off (trigger the job by hand if it must run)"
            )
        schedule = At(at)
        if not one_off:
            notes.append("clocked without one_off: runs once all the same")
    elif row.get("interval") is not None:
        try:
            schedule = _interval(row["interval"])
        except ConfigurationError as exc:
            return skip(str(exc))
    elif row.get("crontab") is not None:
        try:
            schedule, day_and = _crontab(row["crontab"])
        except ConfigurationError as exc:
            return skip(str(exc))
        if day_and:
            notes.append("day_or false: Celery runs only on days matching both day fields")
    else:
        return skip("no schedule (no interval, crontab, clocked or solar row)")
    if end_at is not None and end_at <= now_ms:
        return skip(f"expired at {format_instant_ms(end_at)}: it has no slot left")
    if one_off and not isinstance(schedule, At):
        if last_run is not None:
            return skip(f"a one-off that already ran, at {format_instant_ms(last_run)}")
        first = schedule.next_slot(max(now_ms, (start_at or 0) - 1))
        if first >= NO_SLOT or (end_at is not None and first > end_at):
            return skip("one_off: its schedule has no slot left")
        schedule, computed_at = At(first), True
        notes.append(f"one_off: at its first slot after the import, {format_instant_ms(first)}")
    try:
        args = json.loads(row.get("args") or "[]")
        kwargs = json.loads(row.get("kwargs") or "{}")
        headers = json.loads(row.get("headers") or "{}")
    except ValueError as exc:
        return skip(f"args, kwargs or headers are not JSON ({exc})")
    target_options: dict[str, Any] = {
        key: row[key] for key in _SEND_OPTIONS if row.get(key) not in (None, "")
    }
    if headers:
        target_options["headers"] = headers
    if row.get("priority") is not None:
        target_options["priority"] = int(row["priority"])
    if row.get("expire_seconds") is not None:
        target_options["expires"] = int(row["expire_seconds"])
    enabled = bool(row.get("enabled", True))
    try:
        definition = Definition.create(
            name,
            schedule,
            str(row.get("task") or ""),
            args=args,
            kwargs=kwargs,
            options={"catch_up": "latest"},
            enabled=enabled,
            reason=None if enabled else "disabled in django-celery-beat",
            start_at=None if isinstance(schedule, At) else start_at,
            end_at=None if isinstance(schedule, At) else end_at,
            description=_description(source, str(row.get("description") or "")),
            target_options=target_options,
        )
    except ConfigurationError as exc:
        return skip(f"refused by the store's rules: {exc}")
    return Conversion(source, name, definition, None, tuple(notes), last_run, computed_at)


def _interval(row: Mapping[str, Any]) -> Schedule:
    every, period = row.get("every"), row.get("period")
    if not isinstance(every, int) or every < 1:
        raise ConfigurationError(f"interval every={every!r}: give a whole number ≥ 1")
    if period == "microseconds":
        if every % 1000:
            raise ConfigurationError(
                f"an interval of {every} microseconds: anarchon's finest interval is a "
                "millisecond, and this is not a whole number of them (rounding would "
                "change how often it runs)"
            )
        return Every(f"{every // 1000}ms")
    if period not in _PERIODS:
        raise ConfigurationError(f"interval period {period!r}: not one django-celery-beat has")
    return Every(f"{every}{_PERIODS[period]}")


def _crontab(row: Mapping[str, Any]) -> tuple[Cron, bool]:
    """The row as a cron expression (Celery's field order is cron's; its day-of-week
    numbering too: 0 is Sunday) and whether both day fields are given."""
    parts = [
        re.sub(r"\s+", "", str(row.get(key) or "*"))
        for key in ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
    ]
    day_and = parts[2] != "*" and parts[4] != "*"
    zone = str(row.get("timezone") or "UTC")
    return Cron(" ".join(parts), zone, day_or=not day_and), day_and


def _instant_ms(value: Any, naive_zone: dt.tzinfo) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if not isinstance(value, dt.datetime):
        raise ConfigurationError(f"{value!r} is not a datetime")
    if value.tzinfo is None:
        value = value.replace(tzinfo=naive_zone)
    return int(value.timestamp() * 1000)


def _description(source: str, text: str) -> str:
    head = f"{MARK}{json.dumps(source, ensure_ascii=False)}"
    return (f"{head}\n{text}" if text else head)[:1000]


def _imported_from(definition: Definition) -> str | None:
    """The ``PeriodicTask`` name an imported definition came from (``None``: not one)."""
    first = definition.description.split("\n", 1)[0]
    if not first.startswith(MARK):
        return None
    try:
        name = json.loads(first[len(MARK) :])
    except ValueError:
        return None
    return name if isinstance(name, str) else None


# -- the targets --------------------------------------------------------------------------------
def celery_task_names() -> tuple[str | None, set[str] | None]:
    """The configured Celery app's name and its registered task names, after its
    autodiscovery; ``(None, None)`` where no Celery app is configured (the targets are
    then unverified). Best effort: an app that fails to load counts as none."""
    try:
        import celery  # type: ignore[import-untyped]
    except ImportError:
        return None, None
    try:
        app = celery.current_app._get_current_object()
        if app.main == "default":
            return None, None  # Celery's fallback app: none was configured
        app.loader.import_default_modules()  # sends import_modules: autodiscovery
        return str(app.main), set(app.tasks)
    except Exception:
        return None, None


# -- writing ------------------------------------------------------------------------------------
@dataclass(slots=True)
class Result:
    """One row's outcome: ``imported``, ``updated``, ``unchanged`` or ``skipped``."""

    source: str
    name: str
    result: str
    detail: list[str] = field(default_factory=list)
    definition: Definition | None = None


async def import_rows(
    backend: Backend,
    conversions: list[Conversion],
    namespace: str | None,
    *,
    dry_run: bool,
) -> list[Result]:
    """Create or update the definitions of ``conversions`` in ``namespace`` (with
    ``dry_run``, only say what would change). A row is skipped, with the reason, where
    its name is taken: by another row, by a definition this import did not write, or by
    a code job; a write the store refuses skips that row only."""
    current = {d.name: d for d in await stored_jobs.definitions(backend, namespace)}
    try:  # the jobs live instances run: a listed name the store keeps no definition of
        listed = {job for info in await backend.instances() for job in info.jobs}
    except CapabilityError:  # is a code job's (the store refuses to shadow it)
        listed = set()
    taken: dict[str, str] = {}
    results: list[Result] = []
    for conversion in conversions:
        result = Result(conversion.source, conversion.name, "skipped", list(conversion.notes))
        results.append(result)
        if conversion.definition is None:
            result.detail.insert(0, conversion.skipped or "")
            continue
        if conversion.name in taken:
            result.detail.insert(
                0, f"name collision: PeriodicTask {taken[conversion.name]!r} has this name too"
            )
            continue
        taken[conversion.name] = conversion.source
        wanted = conversion.definition
        old = current.get(conversion.name)
        if old is None and store_name(namespace, conversion.name) in listed:
            result.detail.insert(0, "the name is a code job's on a live instance")
            continue
        if old is not None:
            origin = _imported_from(old)
            if old.owner == "code":
                result.detail.insert(0, "the name is a code job's in the store")
                continue
            if origin is None or origin != conversion.source:
                whose = (
                    "that this import did not write"
                    if origin is None
                    else (f"imported from PeriodicTask {origin!r}")
                )
                result.detail.insert(0, f"a stored definition of that name exists, {whose}")
                continue
            if conversion.one_off and isinstance(old.schedule, At):
                wanted = replace(wanted, schedule=old.schedule)  # the first import's slot
                result.detail = [n for n in result.detail if not n.startswith("one_off")]
                result.detail.append(f"one_off: at {format_instant_ms(old.schedule.at_ms)}")
        result.definition = wanted
        verdict = (
            "imported" if old is None else ("unchanged" if old.same_content(wanted) else "updated")
        )
        if dry_run:
            result.result = verdict
            continue
        try:
            job = store_name(namespace, wanted.name)
            if conversion.last_run_ms is not None and await _record_last_run(
                backend, job, conversion
            ):
                result.detail.append(
                    f"last run {format_instant_ms(conversion.last_run_ms)} recorded"
                )
            if verdict == "imported":
                result.definition = await stored_jobs.add_definition(backend, wanted, namespace)
            elif verdict == "updated":
                result.definition = await stored_jobs.update_definition(
                    backend, wanted.with_version(old.version if old else 0), namespace
                )
        except (ConfigurationError, ConflictError) as exc:
            result.detail.insert(0, f"refused by the store: {exc}")
            continue
        result.result = verdict
    return results


async def _record_last_run(backend: Backend, job: str, conversion: Conversion) -> bool:
    """Record the row's ``last_run_at`` as the job's last scheduled run, unless the store
    records a later one (or keeps no catch-up: a claim-only store). ``True``: written."""
    last_run = conversion.last_run_ms
    if last_run is None or not backend.capabilities.lease:
        return False
    try:
        recorded = await backend.last_scheduled_slot(job)
    except CapabilityError:
        return False
    if recorded is not None and recorded >= last_run:
        return False
    now = await backend.now_ms()
    token = secrets.token_hex(16)
    claim = await backend.claim(
        ClaimRequest(
            job=job,
            slot=last_run,
            origin=Origin.SCHEDULE,
            token=token,
            instance_id=IMPORT_INSTANCE,
            lease_ms=60_000,
            horizon_ms=max(now - last_run, 0) + 60_000,
            skip_overlap=False,
        )
    )
    if claim.outcome != Outcome.WON:
        return False  # already recorded (a rerun), or paused: either anchors catch-up
    await backend.finish(
        Lease(job, last_run, claim.attempt, token),
        Status.SUCCESS,
        meta={"imported_from": "django-celery-beat", "periodic_task": conversion.source},
    )
    return True


def table(results: list[Result], *, dry_run: bool) -> list[str]:
    """The closing table: one line per row, then the counts."""
    words = {"imported": "to import", "updated": "to update"} if dry_run else {}
    rows = [
        [r.source, r.name, words.get(r.result, r.result), "; ".join(d for d in r.detail if d)]
        for r in results
    ]
    headers = ["PERIODIC TASK", "DEFINITION", "RESULT", "DETAIL"]
    widths = [min(max([len(h)] + [len(row[i]) for row in rows]), 40) for i, h in enumerate(headers)]
    lines = []
    for row in [headers, ["-" * w for w in widths], *rows]:
        cells = [
            cell if i == 3 or len(cell) <= widths[i] else cell[: widths[i] - 1] + "…"
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, [*widths[:3], 0], strict=True)))
    counts = {k: sum(r.result == k for r in results) for k in ("imported", "updated")}
    counts["unchanged"] = sum(r.result == "unchanged" for r in results)
    counts["skipped"] = sum(r.result == "skipped" for r in results)
    verb = "would be " if dry_run else ""
    lines.append(
        f"{len(results)} row(s): {counts['imported']} {verb}imported, {counts['updated']} "
        f"{verb}updated, {counts['unchanged']} unchanged, {counts['skipped']} skipped"
    )
    return [line.rstrip() for line in lines]
