"""The admin's pages of stored job definitions: list, add, change, delete, run now.

Mounted on :class:`~anarchon_django.models.Job` (``/admin/anarchon_django/job/``) by
:mod:`anarchon_django.admin`. Pages read the ORM store's rows through the ORM, one page
at a time: the list counts the matching rows (every page is reachable) but reads and
parses only its own 50, in the key's order. Every write goes through the store, with the version
the page read, as ``manage.py anarchon jobs`` and the JSON API write: a stale edit is
refused with :class:`~anarchon_core.errors.ConflictError` and nothing is overwritten;
every replica follows the change within a heartbeat. A code job's stored copy
(owner ``code``) is shown read-only, with its source.

The store's writes happen on the dashboard's loop thread, on the store's own
connection (:mod:`anarchon_django._definition_form`), so the views that write run
outside Django's per-view transaction: on SQLite, a transaction of the request's own
would hold the lock that write waits for.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import socket
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import JSONField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Cast
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils import formats, timezone

from anarchon_core import operations, stored_jobs
from anarchon_core.backend import Backend, wall_clock_ms
from anarchon_core.definitions import Definition
from anarchon_core.errors import AnarchonError, ConflictError
from anarchon_core.records import error_summary, ms_to_datetime
from anarchon_core.schedules import format_instant_ms, zoned_slots
from anarchon_core.web.api import targets_held

from ._definition_form import (
    NOT_HELD,
    DefinitionForm,
    instant,
    parsed,
    project_namespace,
    registered_targets,
    stale,
    store_alias,
    store_call,
)
from .models import HistoryRecord, Job

__all__ = ["EnabledFilter", "JobAdmin", "OwnerFilter"]

#: How many next slots a definition's page shows, and how many of its newest attempts.
NEXT_SLOTS, HISTORY_ROWS = 5, 20
#: The permission of "run now" (as the dashboard's).
TRIGGER_PERMISSION = "anarchon_django.trigger_job"


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


# -- the admin ------------------------------------------------------------------------------------
_READ_ONLY = (
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
_HELD = "_anarchon_held"
#: The held targets of the list being rendered (its columns see only their row).
_listed_held: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar(
    "anarchon_listed_held", default=None
)


class JobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Stored definitions, edited through the store (see the module)."""

    form = DefinitionForm
    change_form_template = "admin/anarchon_django/job/change_form.html"
    list_display = (
        "job",
        "schedule",
        "target_shown",
        "enabled_shown",
        "owner",
        "next_run",
        "last_run",
        "version",
    )
    list_display_links = ("job",)
    list_filter = (OwnerFilter, EnabledFilter)
    search_fields = ("job", "definition")
    search_help_text = "a name, a target or any text of a definition"
    ordering = ("job",)  # the table's key: pages by its index
    sortable_by = ()
    list_per_page = 50
    list_max_show_all = 200
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ["disable_selected", "enable_selected", "delete_selected"]
    fieldsets_editable = (
        (
            None,
            {"fields": ("name", "kind", "every", "offset", "cron", "tz", "day_or", "at", "target")},
        ),
        ("Arguments", {"fields": ("args", "kwargs", "target_options")}),
        (
            "Running",
            {
                "fields": (
                    "enabled",
                    "reason",
                    "start_at",
                    "end_at",
                    "options",
                    "keep",
                    "description",
                    "version",
                )
            },
        ),
    )

    # -- rows: the ORM store's, definitions only ------------------------------------------------
    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        alias = store_alias()
        rows = Job.objects.using(alias or "default").filter(definition__isnull=False)
        return rows if alias is not None else rows.none()

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The list, its page's rows each with its newest attempt (:func:`_newest_runs`)."""
        changelist = super().get_changelist_instance(request)
        _newest_runs(list(changelist.result_list))
        return changelist

    def is_code(self, row: Job | None) -> bool:
        found = None if row is None else parsed(row)
        return found is not None and found.owner == "code"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return store_alias() is not None and super().has_add_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never a code job's copy (change it in the code), nor a definition whose text
        this version cannot read (a newer core's: shown read-only, may be deleted)."""
        editable = obj is None or (parsed(obj) is not None and not self.is_code(obj))
        return editable and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_delete_permission(request, obj) and not self.is_code(obj)

    # -- the form: editable fields, or every value read-only ------------------------------------
    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None and not self.has_change_permission(request, obj):
            return ((None, {"fields": _READ_ONLY}),)
        if obj is None:
            return self.fieldsets_editable
        first = self.fieldsets_editable[0]
        fields = ("job", *(f for f in first[1]["fields"] if f != "name"))
        return ((None, {"fields": fields}), *self.fieldsets_editable[1:])

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None and not self.has_change_permission(request, obj):
            return _READ_ONLY
        return ("job",) if obj is not None else ()

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        base = super().get_form(request, obj, change=change, **kwargs)
        extra = {
            "held": self._held(request),
            "registered": registered_targets(),
            "namespace": project_namespace(),
        }
        return type(base.__name__, (base,), extra)

    def _held(self, request: HttpRequest) -> set[str] | None:
        """The targets live instances hold, read once per request (``None``: unknown)."""
        if not hasattr(request, _HELD):
            try:
                held = store_call(targets_held)
            except (AnarchonError, TimeoutError):
                held = None
            setattr(request, _HELD, held)
        found: set[str] | None = getattr(request, _HELD)
        return found

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
        held = _listed_held.get()
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
        return _local(slots[0].local) if slots else "none"

    @admin.display(description="last run")
    def last_run(self, row: Job) -> str:
        status, slot = getattr(row, "last_status", None), getattr(row, "last_slot", None)
        return "–" if status is None or slot is None else f"{status}, {_local_ms(slot)}"

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

    # -- the list --------------------------------------------------------------------------------
    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        _listed_held.set(self._held(request))
        if store_alias() is None:
            messages.warning(
                request,
                "The store is not the ORM store (ANARCHON['BACKEND'] is not django://ALIAS), "
                "so these pages cannot read its definitions: use the dashboard's "
                "Definitions tab.",
            )
        return super().changelist_view(request, extra_context)

    # -- writes: through the store, outside the view's transaction (see the module) -----
    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        _listed_held.set(self._held(request))  # the read-only page shows the target's flag
        if object_id is not None:
            extra_context = {**(extra_context or {}), **self._about(request, object_id)}
        # Django's own view without its transaction (see the module): a private method,
        # public in all but name since Django 1.11.
        return self._changeform_view(  # type: ignore[attr-defined]
            request, object_id, form_url, extra_context
        )

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> Any:
        try:
            return self._delete_view(  # type: ignore[attr-defined]
                request, object_id, extra_context
            )
        except _Refused as refused:
            messages.error(request, str(refused))
            return HttpResponseRedirect(
                reverse("admin:anarchon_django_job_change", args=[object_id])
            )

    def save_model(self, request: HttpRequest, obj: Job, form: Any, change: bool) -> None:
        """Nothing: the form wrote the definition through the store when it was checked."""

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """Nothing: a definition has no related rows."""

    def log_deletions(self, request: HttpRequest, queryset: Any) -> list[Any]:
        """Nothing: Django calls this before the removal (single and bulk delete), and a
        removal the store refuses must leave no "deleted" entry; :meth:`delete_model` logs
        each removal once the store took it. No other caller logs deletions here."""
        return []

    def delete_model(self, request: HttpRequest, obj: Job) -> None:
        self._remove(obj)
        super().log_deletions(request, Job.objects.using(obj._state.db).filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        refused = []
        for row in queryset:
            try:
                self.delete_model(request, row)
            except _Refused as exc:
                refused.append(str(exc))
        for text in refused:
            messages.error(request, text)

    def _remove(self, row: Job) -> None:
        version = row.version or 0

        async def remove(backend: Backend) -> int:
            return await stored_jobs.write_at(backend, row.job, None, version)

        try:
            store_call(remove)
        except ConflictError as exc:
            raise _Refused(f"{row.job}: {stale(version, exc.current)}") from None
        except (AnarchonError, TimeoutError) as exc:
            raise _Refused(f"{row.job}: the store did not take the removal: {exc}") from None

    # -- enable / disable, for the selected rows --------------------------------------------------
    @admin.action(description="Disable the selected definitions", permissions=["change"])
    def disable_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        reason = f"disabled in the admin by {request.user.get_username()}"
        self._set_enabled(request, queryset, False, reason)

    @admin.action(description="Enable the selected definitions", permissions=["change"])
    def enable_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._set_enabled(request, queryset, True, None)

    def _set_enabled(
        self, request: HttpRequest, queryset: QuerySet[Job], enabled: bool, reason: str | None
    ) -> None:
        done, limit = 0, self.list_max_show_all
        if queryset.count() > limit:
            messages.warning(request, f"only the first {limit} selected definitions are changed")
        for row in queryset[:limit]:
            found = parsed(row)
            if found is None or found.owner == "code":
                what = "a code job's copy" if found else "a definition this version cannot read"
                messages.warning(request, f"{row.job}: {what}, left as it is")
                continue
            if found.enabled == enabled:
                continue
            changed = Definition.from_json(
                {**found.to_json(), "enabled": enabled, "reason": reason}, version=found.version
            )

            async def write(
                backend: Backend,
                key: str = row.job,
                body: str = changed.body(),
                at: int = found.version,
            ) -> int:
                return await stored_jobs.write_at(backend, key, body, at)

            try:
                store_call(write)
            except (AnarchonError, TimeoutError) as exc:
                messages.error(request, f"{row.job}: {exc}")
                continue
            self.log_change(request, row, f"{'enabled' if enabled else 'disabled'} ({reason})")
            done += 1
        word = "enabled" if enabled else "disabled"
        messages.success(request, f"{done} definition(s) {word}.")

    # -- the change page's extras: next slots, history, run now ----------------------------
    def get_urls(self) -> list[URLPattern]:
        run = self.admin_site.admin_view(self.run_now_view)
        return [
            path("<path:object_id>/run/", run, name="anarchon_django_job_run"),
            *super().get_urls(),
        ]

    def _about(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        row = self.get_object(request, object_id)
        found = None if row is None else parsed(row)
        if row is None or found is None:
            return {}
        held = self._held(request)
        history = HistoryRecord.objects.using(self.get_queryset(request).db).filter(job=row.job)
        return {
            "anarchon_next_slots": [
                {
                    "utc": format_instant_ms(z.slot),
                    "local": _local(z.local),
                    "dst": z.dst,
                    "change": z.offset_changed,
                }
                for z in zoned_slots(found.effective_schedule, wall_clock_ms(), NEXT_SLOTS)
            ],
            "anarchon_zone": found.schedule.tz,
            "anarchon_disabled": not found.enabled,
            "anarchon_history": [
                {
                    "slot": _local_ms(r.slot),
                    "attempt": r.attempt,
                    "status": r.status,
                    "instance": r.instance_id or "",
                    "error": error_summary(r.error),
                }
                for r in history.order_by("-slot", "-attempt")[:HISTORY_ROWS]
            ],
            "anarchon_history_url": reverse("admin:anarchon_django_historyrecord_changelist")
            + f"?job={row.job}",
            "anarchon_unheld": found.owner == "store"
            and held is not None
            and found.target not in held,
            "anarchon_may_run": request.user.has_perm(TRIGGER_PERMISSION),  # type: ignore[union-attr]
            "anarchon_run_url": reverse("admin:anarchon_django_job_run", args=[row.pk]),
        }

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: a manual run of the job (it does not move the next slot)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        row = self.get_object(request, object_id)
        if row is None:
            raise Http404(f"no stored definition with id {object_id!r}")
        may_run = request.user.has_perm(TRIGGER_PERMISSION)  # type: ignore[union-attr]
        if not (may_run and self.has_view_permission(request, row)):
            raise PermissionDenied
        by = f"django-admin:{request.user.get_username()}@{socket.gethostname()}"

        async def trigger(backend: Backend) -> int:
            return await operations.trigger(backend, row.job, requested_by=by)

        try:
            slot = store_call(trigger)
        except (AnarchonError, TimeoutError) as exc:
            messages.error(request, f"{row.job} was not run: {exc}")
        else:
            messages.success(request, f"{row.job}: a manual run is requested ({_local_ms(slot)}).")
            self.log_change(request, row, "run now")
        return HttpResponseRedirect(reverse("admin:anarchon_django_job_change", args=[row.pk]))


def _newest_runs(rows: list[Job]) -> None:
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


class _Refused(Exception):
    """A removal the store refused (stale, or the store down): shown, nothing logged."""


def _local(value: dt.datetime) -> str:
    """A wall time with its zone's abbreviation and offset: ``2026-03-29 03:00:00 CEST (+0200)``."""
    return formats.date_format(value, "Y-m-d H:i:s T (O)")


def _local_ms(ms: int) -> str:
    """An instant in the current time zone, to the second (as the history's pages)."""
    return formats.date_format(timezone.localtime(ms_to_datetime(ms)), "Y-m-d H:i:s T")
