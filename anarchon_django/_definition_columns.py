"""The stored definitions' list in the admin: its filters, its columns, each row's newest run.

:class:`DefinitionColumns` is the part of :class:`~anarchon_django._admin_definitions.JobAdmin`
that shows a row: each column parses the row's definition once (:func:`parsed`), and
the list's page reads its rows' newest runs in one query (:func:`newest_runs`), so a
page costs the same on any size of table.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
from typing import Any

from django.contrib import admin
from django.db.models import JSONField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Cast
from django.http import HttpRequest
from django.utils import formats, timezone

from anarchon_core.backend import wall_clock_ms
from anarchon_core.records import ms_to_datetime
from anarchon_core.schedules import zoned_slots

from ._definition_form import NOT_HELD, instant, parsed
from .models import HistoryRecord, Job

__all__ = [
    "READ_ONLY",
    "DefinitionColumns",
    "EnabledFilter",
    "OwnerFilter",
    "listed_held",
    "local",
    "local_ms",
    "newest_runs",
]


# -- the list's filters -----------------------------------------------------------------------
def _top_level(queryset: QuerySet[Any], key: str, value: Any) -> QuerySet[Any]:
    """The rows whose definition has ``key`` = ``value`` at its top level: the JSON text
    read as JSON by the database (a substring would match a key of ``kwargs`` too)."""
    as_json = Cast("definition", output_field=JSONField())
    return queryset.alias(document=as_json).filter(**{f"document__{key}": value})


class OwnerFilter(admin.SimpleListFilter):
    """Stored definitions, or code jobs' copies."""

    title, parameter_name = "owner", "owner"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("store", "stored"), ("code", "code jobs")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() not in ("store", "code"):
            return queryset
        return _top_level(queryset, "owner", self.value())


class EnabledFilter(admin.SimpleListFilter):
    """Enabled or disabled definitions."""

    title, parameter_name = "enabled", "enabled"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "enabled"), ("no", "disabled")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() not in ("yes", "no"):
            return queryset
        return _top_level(queryset, "enabled", self.value() == "yes")


#: What a read-only definition page shows (a code job's copy, an unreadable one, a viewer).
READ_ONLY = (
    "job",
    "schedule",
    "target_shown",
    "enabled_shown",
    "source",
    "arguments",
    "options_shown",
    "window",
    "description_shown",
    "version",
)
#: The held targets of the list being rendered (its columns see only their row).
listed_held: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar(
    "anarchonlisted_held", default=None
)


class DefinitionColumns:
    """The list's columns and the read-only page's fields, each of one row."""

    # -- columns -------------------------------------------------------------------------------
    @admin.display(description="schedule")
    def schedule(self, row: Job) -> str:
        found = parsed(row)
        return "(unreadable)" if found is None else found.effective_schedule.describe()

    @admin.display(description="target")
    def target_shown(self, row: Job) -> str:
        found = parsed(row)
        if found is None:
            return ""
        held = listed_held.get()
        if found.owner == "store" and held is not None and found.target not in held:
            return f"{found.target} ({NOT_HELD})"
        return found.target

    @admin.display(description="enabled")
    def enabled_shown(self, row: Job) -> str:
        found = parsed(row)
        if found is None or found.enabled:
            return "yes"
        return f"no: {found.reason}" if found.reason else "no"

    @admin.display(description="owner")
    def owner(self, row: Job) -> str:
        found = parsed(row)
        return "" if found is None else found.owner

    @admin.display(description="next slot")
    def next_run(self, row: Job) -> str:
        found = parsed(row)
        if found is None or not found.enabled:
            return "–"
        slots = zoned_slots(found.effective_schedule, wall_clock_ms(), 1)
        return local(slots[0].local) if slots else "none"

    @admin.display(description="last run")
    def last_run(self, row: Job) -> str:
        status, slot = getattr(row, "last_status", None), getattr(row, "last_slot", None)
        return "–" if status is None or slot is None else f"{status}, {local_ms(slot)}"

    @admin.display(description="source")
    def source(self, row: Job) -> str:
        found = parsed(row)
        if found is None:
            return (
                "a definition this version cannot read (a newer anarchon's, or damaged): "
                f"read-only, it may be deleted; its text: {row.definition}"
            )
        if found.owner == "code":
            return f"{found.description} (read-only: change it in the code)"
        return "stored (edit it here, with manage.py anarchon jobs or the JSON API)"

    @admin.display(description="arguments")
    def arguments(self, row: Job) -> str:
        found = parsed(row)
        if found is None:
            return ""
        return json.dumps({"args": list(found.args), "kwargs": dict(found.kwargs)})

    @admin.display(description="options")
    def options_shown(self, row: Job) -> str:
        found = parsed(row)
        return "" if found is None else json.dumps(dict(found.options))

    @admin.display(description="window")
    def window(self, row: Job) -> str:
        found = parsed(row)
        if found is None or (found.start_at is None and found.end_at is None):
            return "–"
        return f"from {instant(found.start_at) or '…'} to {instant(found.end_at) or '…'}"

    @admin.display(description="description")
    def description_shown(self, row: Job) -> str:
        found = parsed(row)
        return "" if found is None else found.description


def newest_runs(rows: list[Job]) -> None:
    """Set each row's ``last_status`` and ``last_slot``: one query for the page, a
    subquery per row on the history's key (an annotation of the list's query would be
    computed for every row an offset skips, too)."""
    if not rows:
        return
    newest = HistoryRecord.objects.filter(job=OuterRef("job")).order_by("-slot", "-attempt")
    found = {
        pk: (status, slot)
        for pk, status, slot in Job.objects.using(rows[0]._state.db)
        .filter(pk__in=[row.pk for row in rows])
        .annotate(
            last_status=Subquery(newest.values("status")[:1]),
            last_slot=Subquery(newest.values("slot")[:1]),
        )
        .values_list("pk", "last_status", "last_slot")
    }
    for row in rows:
        row.last_status, row.last_slot = found.get(row.pk, (None, None))  # type: ignore[attr-defined]


def local(value: dt.datetime) -> str:
    """A wall time with its zone's abbreviation and offset: ``2026-03-29 03:00:00 CEST (+0200)``."""
    return formats.date_format(value, "Y-m-d H:i:s T (O)")


def local_ms(ms: int) -> str:
    """An instant in the current time zone to the second (``2026-12-04 15:38:12 JST``),
    as every admin page of anarchon shows it: the admin's default format drops the
    seconds, and runs a second apart would read the same."""
    return formats.date_format(timezone.localtime(ms_to_datetime(ms)), "Y-m-d H:i:s T")
