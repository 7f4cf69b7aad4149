"""The admin: the run history, read-only, and the dashboard for staff users.

One row per attempt, newest first (the history index's order, the only sort). Paging
never counts the whole table (:class:`BoundedCountPaginator`) and the filters take
their choices from the newest records, so a page costs the same on any table size.
``…/historyrecord/dashboard/`` is the dashboard (:mod:`anarchon_django._admin_dashboard`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, cast

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils import timezone

from anarchon_core.records import error_summary

from . import _admin_dashboard as dashboard
from ._admin_definitions import JobAdmin
from ._definition_columns import local_ms
from ._paging import COUNT_LIMIT, BoundedCountPaginator
from .models import HistoryRecord, Instance, Job

__all__ = ["COUNT_LIMIT", "BoundedCountPaginator", "HistoryRecordAdmin", "JobAdmin"]

#: How many of the newest records the job and instance filters read their choices from.
CHOICES_SCAN = 1_000
_ERROR_EXCERPT = 80


def _ms(value: dt.datetime) -> int:
    return int(value.timestamp() * 1000)


def _shown(ms: int | None) -> str | None:
    return None if ms is None else local_ms(ms)


def _millis(ms: int | None) -> str:
    """``850 ms``, ``12.3 s``, ``4 min 5 s``, ``2 h 3 min``."""
    if ms is None:
        return "–"
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms < 1000:
        return f"{sign}{ms} ms"
    if ms < 60_000:
        return f"{sign}{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{sign}{seconds // 60} min {seconds % 60} s"
    return f"{sign}{seconds // 3600} h {seconds % 3600 // 60} min"


class _NamesFilter(admin.SimpleListFilter):
    """The values of ``field`` in the newest records and in a registry: never a full scan."""

    field, registry = "job", cast(Any, Job)

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        newest = HistoryRecord.objects.order_by("-slot", "-job", "-attempt")
        names = set(newest.values_list(self.field, flat=True)[:CHOICES_SCAN])
        names |= set(self.registry.objects.values_list(self.field, flat=True)[:500])
        names |= {str(self.value())} if self.value() else set()
        return [(name, name) for name in sorted(filter(None, names))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


class JobFilter(_NamesFilter):
    title = parameter_name = "job"


class InstanceFilter(_NamesFilter):
    title = parameter_name = "instance"
    field, registry = "instance_id", Instance


class ScheduledFilter(admin.SimpleListFilter):
    """Scheduled time ranges, as slot (epoch ms) ranges in the current time zone."""

    title = parameter_name = "scheduled"
    ranges = (
        ("1h", "Past hour"),
        ("24h", "Past 24 hours"),
        ("today", "Today"),
        ("7d", "Past 7 days"),
        ("month", "This month"),
        ("older", "Older than 7 days"),
    )

    def lookups(self, request: HttpRequest, model_admin: Any) -> tuple[tuple[str, str], ...]:
        return self.ranges

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        now = timezone.localtime()  # the current (activated or TIME_ZONE) zone
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        week_ago, value = now - dt.timedelta(days=7), self.value() or ""
        if value == "older":
            return queryset.filter(slot__lt=_ms(week_ago))
        since = {
            "1h": now - dt.timedelta(hours=1),
            "24h": now - dt.timedelta(hours=24),
            "today": midnight,
            "7d": week_ago,
            "month": midnight.replace(day=1),
        }.get(value)
        return queryset if since is None else queryset.filter(slot__gte=_ms(since))


def _column(name: str, show: Callable[[HistoryRecord], str | None]) -> Any:
    return admin.display(description=name)(lambda _, obj: show(obj))


def _span(start: int | None, end: int | None) -> int | None:
    return None if start is None or end is None else end - start


def _excerpt(error: str | None) -> str:
    line = error_summary(error)
    return line if len(line) <= _ERROR_EXCERPT else line[: _ERROR_EXCERPT - 1] + "…"


@admin.register(HistoryRecord)
class HistoryRecordAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The run history, read-only; its changelist links to the dashboard."""

    list_display = ("job", "scheduled", "status", "attempt", "instance_id", "duration",
                    "lateness", "error_excerpt")  # fmt: skip
    list_display_links = ("job",)
    list_filter = ("status", JobFilter, InstanceFilter, ScheduledFilter)
    list_per_page = 50
    list_max_show_all = 200
    ordering = ("-slot", "-job", "-attempt")  # the history index; no other sort
    sortable_by = ()
    paginator = BoundedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = None
    fields = ("job", "scheduled", "slot", "attempt", "origin", "status", "instance_id", "claimed",
              "started", "finished", "duration", "lateness", "error", "meta")  # fmt: skip
    readonly_fields = fields

    # -- read-only --------------------------------------------------------------------
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    has_change_permission = has_delete_permission = has_add_permission

    # -- columns: times in the current zone; lateness is from the slot to the start
    scheduled = _column("scheduled", lambda row: _shown(row.slot))
    claimed = _column("claimed", lambda row: _shown(row.claimed_at))
    started = _column("started", lambda row: _shown(row.started_at))
    finished = _column("finished", lambda row: _shown(row.finished_at))
    duration = _column("duration", lambda row: _millis(_span(row.started_at, row.finished_at)))
    lateness = _column("lateness", lambda row: _millis(_span(row.slot, row.started_at)))
    error_excerpt = _column("error", lambda row: _excerpt(row.error))

    # -- the dashboard ----------------------------------------------------------------
    def get_urls(self) -> list[URLPattern]:
        info, site = f"{self.opts.app_label}_{self.opts.model_name}", self.admin_site
        routes = [
            ("dashboard/", dashboard.page_view, "dashboard", False),
            ("dashboard/api/<path:path>", dashboard.api_view, "dashboard_api", False),
            ("dashboard/<str:name>", dashboard.asset_view, "dashboard_file", True),
        ]
        return [
            path(
                route, site.admin_view(self._viewing(view), cacheable=cache), name=f"{info}_{name}"
            )
            for route, view, name, cache in routes
        ] + super().get_urls()

    def _viewing(self, view: Any) -> Any:
        """``view``, for users who may view the history (others: 403)."""

        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not self.has_view_permission(request):
                raise PermissionDenied
            response: HttpResponse = view(request, *args, **kwargs)
            return response

        checked.__name__ = getattr(view, "__name__", "dashboard_view")
        return checked


admin.site.register(Job, JobAdmin)
