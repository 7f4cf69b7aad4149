"""The admin's pages of stored job definitions: list, add, change, delete, run now.

Mounted on :class:`~anarchon_django.models.Job` (``/admin/anarchon_django/job/``) by
:mod:`anarchon_django.admin`. Pages read the ORM store's rows through the ORM, one page
at a time: the list counts the matching rows (every page is reachable) but reads and
parses only its own 50, in the key's order. Every write goes through the store, with the version
the page read, as ``manage.py anarchon jobs`` and the JSON API write: a stale edit is
refused with :class:`~anarchon_core.errors.ConflictError` and nothing is overwritten;
every replica follows the change within a heartbeat. A code job's stored copy
(owner ``code``) is shown read-only, with its source. The list's filters and columns
are :mod:`anarchon_django._definition_columns`, the form :mod:`~anarchon_django._definition_form`.

The store's writes happen on the dashboard's loop thread, on the store's own
connection (:mod:`anarchon_django._definition_form`), so the views that write run
outside Django's per-view transaction: on SQLite, a transaction of the request's own
would hold the lock that write waits for.
"""

from __future__ import annotations

import socket
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse

from anarchon_core import operations, stored_jobs
from anarchon_core.backend import Backend, wall_clock_ms
from anarchon_core.definitions import Definition
from anarchon_core.errors import AnarchonError, ConflictError
from anarchon_core.records import error_summary
from anarchon_core.schedules import format_instant_ms, zoned_slots
from anarchon_core.web.api import targets_held

from ._definition_columns import (
    READ_ONLY,
    DefinitionColumns,
    EnabledFilter,
    OwnerFilter,
    listed_held,
    local,
    local_ms,
    newest_runs,
)
from ._definition_form import (
    DefinitionForm,
    parsed,
    project_namespace,
    registered_targets,
    stale,
    store_alias,
    store_call,
)
from .models import HistoryRecord, Job

__all__ = ["JobAdmin"]

#: How many next slots a definition's page shows, and how many of its newest attempts.
NEXT_SLOTS, HISTORY_ROWS = 5, 20
#: The permission of "run now" (as the dashboard's).
TRIGGER_PERMISSION = "anarchon_django.trigger_job"
#: The request attribute that keeps the targets held, read once per request.
_HELD = "_anarchon_held"
#: The request attribute that counts the removals the store refused in a bulk delete.
_REFUSED = "_anarchon_refused"


class JobAdmin(DefinitionColumns, admin.ModelAdmin):  # type: ignore[type-arg]
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
        newest_runs(list(changelist.result_list))
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
            return ((None, {"fields": READ_ONLY}),)
        if obj is None:
            return self.fieldsets_editable
        first = self.fieldsets_editable[0]
        fields = ("job", *(f for f in first[1]["fields"] if f != "name"))
        return ((None, {"fields": fields}), *self.fieldsets_editable[1:])

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None and not self.has_change_permission(request, obj):
            return READ_ONLY
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

    # -- the list --------------------------------------------------------------------------------
    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        listed_held.set(self._held(request))
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
        listed_held.set(self._held(request))  # the read-only page shows the target's flag
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
        """Each row through the store; the refused ones are said, and Django's count of
        deleted rows that follows is corrected (:meth:`message_user`)."""
        refused = []
        for row in queryset:
            try:
                self.delete_model(request, row)
            except _Refused as exc:
                refused.append(str(exc))
        for text in refused:
            messages.error(request, text)
        setattr(request, _REFUSED, len(refused))

    def message_user(
        self,
        request: HttpRequest,
        message: Any,
        level: int | str = messages.INFO,
        extra_tags: str = "",
        fail_silently: bool = False,
    ) -> None:
        refused = getattr(request, _REFUSED, 0)
        if refused and level == messages.SUCCESS:  # delete_selected's "Successfully deleted N"
            level = messages.WARNING
            message = f"{refused} of the selected definitions were not deleted (see above)."
        super().message_user(request, message, level, extra_tags, fail_silently)

    def _remove(self, row: Job) -> None:
        version = row.version or 0

        async def remove(backend: Backend) -> int:
            return await stored_jobs.write_at(backend, row.job, None, version)

        try:
            store_call(remove)
        except ConflictError as exc:
            raise _Refused(f"Definition {row.job!r}: {stale(version, exc.current)}") from None
        except (AnarchonError, TimeoutError) as exc:
            what = f"Definition {row.job!r}: the store did not take the removal"
            raise _Refused(f"{what}: {exc}") from None

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
                messages.warning(request, f"Definition {row.job!r}: {what}, left as it is")
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
                messages.error(request, f"Definition {row.job!r}: {exc}")
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

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> Any:
        """The page, with :meth:`_about` the row the view loaded (only when a page is
        shown: a save that succeeds redirects without it)."""
        if obj is not None:
            context = {**context, **self._about(request, obj)}
        return super().render_change_form(request, context, add, change, form_url, obj)

    def _about(self, request: HttpRequest, row: Job) -> dict[str, Any]:
        """The change page's extras: next slots, newest runs, run now, the target's flag."""
        found = parsed(row)
        if found is None:
            return {}
        held = self._held(request)
        history = HistoryRecord.objects.using(self.get_queryset(request).db).filter(job=row.job)
        return {
            "anarchon_next_slots": [
                {
                    "utc": format_instant_ms(z.slot),
                    "local": local(z.local),
                    "dst": z.dst,
                    "change": z.offset_changed,
                }
                for z in zoned_slots(found.effective_schedule, wall_clock_ms(), NEXT_SLOTS)
            ],
            "anarchon_zone": found.schedule.tz,
            "anarchon_disabled": not found.enabled,
            "anarchon_history": [
                {
                    "slot": local_ms(r.slot),
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
            messages.error(request, f"Definition {row.job!r} was not run: {exc}")
        else:
            requested = f"a manual run is requested ({local_ms(slot)})"
            messages.success(request, f"Definition {row.job!r}: {requested}.")
            self.log_change(request, row, "run now")
        return HttpResponseRedirect(reverse("admin:anarchon_django_job_change", args=[row.pk]))


class _Refused(Exception):
    """A removal the store refused (stale, or the store down): shown, nothing logged."""
