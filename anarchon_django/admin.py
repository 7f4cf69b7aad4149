"""The admin: the run history, read-only, and the dashboard for staff users.

``/admin/anarchon_django/historyrecord/`` lists one row per attempt, newest first (the
history index's order): job, scheduled time (in the current time zone, as the admin
shows every time), status, attempt, instance, duration, lateness and the error's first
line. Nothing can be added, changed or deleted there: the scheduler alone writes the
store.

Paging never counts the whole table: :class:`BoundedCountPaginator` counts at most
:data:`COUNT_LIMIT` + 1 matching rows (``SELECT COUNT(*) FROM (… LIMIT n)``), so a
page costs the same on a table of a thousand rows or of ten million; past the limit
the list says "more than 10,000" and the filters narrow it down. The full-table count
the admin shows beside a filtered count (``show_full_result_count``) and the facet
counts are off, and the list sorts only in the index's order.

``…/historyrecord/dashboard/`` is the dashboard of ``docs/api.md`` inside the admin
(see :mod:`anarchon_django._admin_dashboard`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils import formats, timezone
from django.utils.functional import cached_property

from . import _admin_dashboard as dashboard
from .models import HistoryRecord, Instance, Job

__all__ = ["COUNT_LIMIT", "BoundedCountPaginator", "HistoryRecordAdmin"]

#: The most rows the changelist counts; past it the count reads "more than …".
COUNT_LIMIT = 10_000
#: How many of the newest records the job and instance filters read their choices from.
CHOICES_SCAN = 1_000
_ERROR_EXCERPT = 80


class BoundedCountPaginator(Paginator):  # type: ignore[type-arg]
    """A paginator whose ``count`` reads at most ``COUNT_LIMIT + 1`` rows.

    ``count`` is exact up to the limit and ``COUNT_LIMIT + 1`` beyond it (``capped``
    then says so), so the last reachable page is the limit's; pages are still fetched
    with ``LIMIT/OFFSET`` in the index's order.
    """

    limit = COUNT_LIMIT

    @cached_property
    def count(self) -> int:
        object_list: Any = self.object_list
        if isinstance(object_list, QuerySet):
            return int(object_list[: self.limit + 1].count())
        return len(object_list)

    @property
    def capped(self) -> bool:
        """Whether there are more matching rows than were counted."""
        return self.count > self.limit


def _ms(value: dt.datetime) -> int:
    return int(value.timestamp() * 1000)


def _aware(ms: int | None) -> dt.datetime | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _shown(ms: int | None) -> str | None:
    """A time in the current time zone to the second (``2026-12-04 15:38:12 JST``): the
    admin's default format drops the seconds, and runs a second apart read the same."""
    value = _aware(ms)
    if value is None:
        return None
    return formats.date_format(timezone.localtime(value), "Y-m-d H:i:s T")


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


def _recent_values(field: str) -> set[str]:
    """Distinct ``field`` values of the newest records: one bounded index range."""
    newest = HistoryRecord.objects.order_by("-slot", "-job", "-attempt")
    return {v for v in newest.values_list(field, flat=True)[:CHOICES_SCAN] if v}


class JobFilter(admin.SimpleListFilter):
    """Jobs of the newest records and jobs with flags (paused), never a full scan."""

    title = "job"
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = _recent_values("job") | set(Job.objects.values_list("job", flat=True)[:500])
        if self.value():
            names.add(str(self.value()))
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(job=self.value()) if self.value() else queryset


class InstanceFilter(admin.SimpleListFilter):
    """Instances of the registry and of the newest records, never a full scan."""

    title = "instance"
    parameter_name = "instance"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = _recent_values("instance_id") | set(
            Instance.objects.values_list("instance_id", flat=True)[:500]
        )
        if self.value():
            names.add(str(self.value()))
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(instance_id=self.value()) if self.value() else queryset


class ScheduledFilter(admin.SimpleListFilter):
    """Scheduled time ranges, as slot (epoch ms) ranges in the current time zone."""

    title = "scheduled"
    parameter_name = "scheduled"
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
        bounds = self.bounds(self.value())
        if bounds is None:
            return queryset
        since, until = bounds
        if since is not None:
            queryset = queryset.filter(slot__gte=since)
        if until is not None:
            queryset = queryset.filter(slot__lt=until)
        return queryset

    @staticmethod
    def bounds(value: str | None) -> tuple[int | None, int | None] | None:
        """``(since, until)`` in epoch ms for a choice (``None``: no filter)."""
        now = timezone.localtime()  # the current (activated or TIME_ZONE) zone
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        if value == "1h":
            return _ms(now - dt.timedelta(hours=1)), None
        if value == "24h":
            return _ms(now - dt.timedelta(hours=24)), None
        if value == "today":
            return _ms(midnight), None
        if value == "7d":
            return _ms(now - dt.timedelta(days=7)), None
        if value == "month":
            return _ms(midnight.replace(day=1)), None
        if value == "older":
            return None, _ms(now - dt.timedelta(days=7))
        return None


@admin.register(HistoryRecord)
class HistoryRecordAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The run history, read-only; its changelist links to the dashboard."""

    list_display = (
        "job",
        "scheduled",
        "status",
        "attempt",
        "instance_id",
        "duration",
        "lateness",
        "error_excerpt",
    )
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
    fields = (
        "job",
        "scheduled",
        "slot",
        "attempt",
        "origin",
        "status",
        "instance_id",
        "claimed",
        "started",
        "finished",
        "duration",
        "lateness",
        "error",
        "meta",
    )
    readonly_fields = fields

    # -- read-only --------------------------------------------------------------------
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    # -- columns ----------------------------------------------------------------------
    @admin.display(description="scheduled", ordering="slot")
    def scheduled(self, obj: HistoryRecord) -> str | None:
        return _shown(obj.slot)

    @admin.display(description="claimed")
    def claimed(self, obj: HistoryRecord) -> str | None:
        return _shown(obj.claimed_at)

    @admin.display(description="started")
    def started(self, obj: HistoryRecord) -> str | None:
        return _shown(obj.started_at)

    @admin.display(description="finished")
    def finished(self, obj: HistoryRecord) -> str | None:
        return _shown(obj.finished_at)

    @admin.display(description="duration")
    def duration(self, obj: HistoryRecord) -> str:
        if obj.started_at is None or obj.finished_at is None:
            return "–"
        return _millis(obj.finished_at - obj.started_at)

    @admin.display(description="lateness")
    def lateness(self, obj: HistoryRecord) -> str:
        """From the scheduled time to the start (jitter included)."""
        if obj.started_at is None:
            return "–"
        return _millis(obj.started_at - obj.slot)

    @admin.display(description="error")
    def error_excerpt(self, obj: HistoryRecord) -> str:
        if not obj.error:
            return ""
        line = obj.error.strip().splitlines()[0] if obj.error.strip() else ""
        return line if len(line) <= _ERROR_EXCERPT else line[: _ERROR_EXCERPT - 1] + "…"

    # -- the dashboard ----------------------------------------------------------------
    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        site = self.admin_site
        urls = [
            path(
                "dashboard/",
                site.admin_view(self._viewing(dashboard.page_view)),
                name=f"{info}_dashboard",
            ),
            path(
                "dashboard/api/<path:path>",
                site.admin_view(self._viewing(dashboard.api_view)),
                name=f"{info}_dashboard_api",
            ),
            path(
                "dashboard/<str:name>",
                site.admin_view(self._viewing(dashboard.asset_view), cacheable=True),
                name=f"{info}_dashboard_file",
            ),
        ]
        return urls + super().get_urls()

    def _viewing(self, view: Any) -> Any:
        """``view``, for users who may view the history (others: 403)."""

        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not self.has_view_permission(request):
                raise PermissionDenied
            response: HttpResponse = view(request, *args, **kwargs)
            return response

        checked.__name__ = getattr(view, "__name__", "dashboard_view")
        return checked
