"""The form of a stored definition in the admin, and what it reads and writes.

:class:`DefinitionForm` checks every value as the core checks it
(:meth:`Definition.create`), then writes the definition through the store at the
version the page was opened at (:func:`anarchon_core.stored_jobs.write_at`), on the
dashboard's loop thread and the store's own connection: a stale page is refused with a
form error, and nothing is overwritten. Rows are read through the ORM, one at a time
(:func:`parsed`), never the whole table.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Awaitable, Callable
from contextlib import suppress
from functools import cache
from typing import Any, TypeVar, cast

from django import forms
from django.core.exceptions import ValidationError

from anarchon_core import stored_jobs
from anarchon_core.backend import Backend
from anarchon_core.definitions import NAME_FORM, Definition
from anarchon_core.durations import format_duration_ms
from anarchon_core.errors import AnarchonError, ConfigurationError, ConflictError
from anarchon_core.names import store_name
from anarchon_core.schedules import At, Cron, Every, format_instant_ms

from . import _admin_dashboard
from .conf import alias_from_url
from .models import Job

__all__ = [
    "NOT_HELD",
    "DefinitionForm",
    "instant",
    "parsed",
    "project_namespace",
    "registered_targets",
    "stale",
    "store_alias",
    "store_call",
]

T = TypeVar("T")

_KINDS = [
    ("every", "every: a fixed interval"),
    ("cron", "cron: an expression in a zone"),
    ("at", "at: once, at an instant"),
]
#: How a target that no live instance holds is marked.
NOT_HELD = "no live instance holds it"


def store_alias() -> str | None:
    """The database alias of the ORM store (``django://ALIAS``); ``None`` for another store,
    whose definitions the ORM cannot read (the dashboard's Definitions tab shows them)."""
    from ._scheduler import get_scheduler

    try:
        return alias_from_url(get_scheduler().backend_url)
    except ConfigurationError:
        return None


def registered_targets() -> frozenset[str]:
    """The targets this process's scheduler registers (its jobs modules')."""
    from ._scheduler import get_scheduler

    return frozenset(get_scheduler().targets)


def project_namespace() -> str | None:
    from ._scheduler import current_settings

    return current_settings().namespace


def store_call(call: Callable[[Backend], Awaitable[T]]) -> T:
    return _admin_dashboard.store_call(call)


def parsed(row: Job) -> Definition | None:
    """The row's definition (``None``: a removed one, or text the core cannot read), read
    once per row object."""
    if not hasattr(row, "_parsed"):
        found = None
        if row.definition is not None:
            with suppress(ConfigurationError, ValueError):
                found = Definition.from_body(row.definition, row.version or 0)
        row._parsed = found  # type: ignore[attr-defined]
    result: Definition | None = row._parsed  # type: ignore[attr-defined]
    return result


@cache
def _zones() -> list[tuple[str, str]]:
    return [(zone, zone) for zone in sorted(zoneinfo.available_timezones())]


def instant(value: int | None) -> str:
    return "" if value is None else format_instant_ms(value)


# -- the form -------------------------------------------------------------------------------
class DefinitionForm(forms.ModelForm):  # type: ignore[type-arg]
    """A definition's fields; :meth:`clean` checks them as the core does and then writes
    the definition through the store at the version the page read.

    ``held`` (set by :meth:`JobAdmin.get_form`) is the set of targets live instances
    hold (``None``: the store cannot say): the target's choices.
    """

    held: set[str] | None = None
    registered: frozenset[str] = frozenset()
    """The targets this process's scheduler registers (offered even when no instance
    that holds them is live; marked then)."""
    namespace: str | None = None

    name = forms.CharField(max_length=200, help_text=f"{NAME_FORM}; no ':'")
    kind = forms.ChoiceField(choices=_KINDS, initial="every", widget=forms.RadioSelect)
    every = forms.CharField(
        required=False,
        help_text="10s, 5m, 1h30m, 1d: slots on the epoch grid (10s: :00, :10, …)",
    )
    offset = forms.CharField(
        required=False, help_text="shifts the grid: every 1d with offset 3h runs at 03:00 UTC"
    )
    cron = forms.CharField(
        required=False, max_length=200, help_text="minute hour day month weekday: 0 3 * * *"
    )
    tz = forms.ChoiceField(
        choices=_zones,
        initial="UTC",
        label="Zone",
        help_text="the IANA zone of the cron expression",
    )
    day_or = forms.BooleanField(
        required=False,
        initial=True,
        label="Day or",
        help_text="with both day fields set, run on days matching either (cron's rule); "
        "off: days matching both (Celery's)",
    )
    at = forms.CharField(
        required=False, help_text="ISO 8601 with its offset: 2026-12-24T18:00:00+02:00"
    )
    target = forms.ChoiceField(
        choices=[],
        help_text="a handler registered in code with @scheduler.target(…) (a Celery task "
        "for celery beat -S anarchon), as the live instances list them",
    )
    args = forms.JSONField(required=False, initial=list, help_text="a JSON array")
    kwargs = forms.JSONField(required=False, initial=dict, help_text="a JSON object")
    options = forms.JSONField(
        required=False,
        initial=dict,
        help_text='job options by name, e.g. {"timeout_ms": 600000, "catch_up": "latest"}',
    )
    target_options = forms.JSONField(
        required=False,
        initial=dict,
        help_text='what the target\'s adapter reads: Celery\'s {"queue": …, "headers": …}',
    )
    enabled = forms.BooleanField(required=False, initial=True)
    reason = forms.CharField(required=False, max_length=500, help_text="why it is disabled")
    start_at = forms.CharField(required=False, help_text="ISO 8601: no slot before it")
    end_at = forms.CharField(required=False, help_text="ISO 8601: no slot after it")
    description = forms.CharField(required=False, max_length=1000, widget=forms.Textarea)
    keep = forms.BooleanField(
        required=False,
        help_text="a one-off stays stored after it ran (else it is removed "
        "once its slot is older than the history retention)",
    )
    version = forms.IntegerField(required=False, min_value=0, widget=forms.HiddenInput)

    class Meta:
        model = Job
        fields: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        read = parsed(self.instance) if self.instance.pk else None
        if read is not None:
            self.initial.update(_initial(read))
        if self.instance.pk:
            self.fields.pop("name", None)  # a definition is renamed by adding another
        current = self.initial.get("target")
        targets = set(self.held or ()) | set(self.registered) | ({current} if current else set())
        cast(forms.ChoiceField, self.fields["target"]).choices = [("", "---------")] + [
            (t, t if self.held is None or t in self.held else f"{t} ({NOT_HELD})")
            for t in sorted(targets)
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            definition = self._definition(data)
        except ConfigurationError as exc:
            raise ValidationError(str(exc)) from None
        self._write(definition)
        return data

    def _definition(self, data: dict[str, Any]) -> Definition:
        kind = data["kind"]
        schedule: dict[str, Any] = {kind: (data.get(kind) or "").strip()}
        if not schedule[kind]:
            raise ConfigurationError(f"give the {kind!r} of a schedule of kind {kind!r}")
        if kind == "every" and (data.get("offset") or "").strip():
            schedule["offset"] = data["offset"].strip()
        if kind == "cron":
            schedule.update(tz=data["tz"], day_or=data["day_or"])
        read = parsed(self.instance) if self.instance.pk else None
        return Definition.create(
            data["name"] if read is None else read.name,
            schedule,
            data["target"],
            args=[] if data.get("args") is None else data["args"],
            kwargs={} if data.get("kwargs") is None else data["kwargs"],
            options=data.get("options") or {},
            enabled=data["enabled"],
            reason=(data.get("reason") or "").strip() or None,
            start_at=(data.get("start_at") or "").strip() or None,
            end_at=(data.get("end_at") or "").strip() or None,
            description=data.get("description") or "",
            keep=data["keep"],
            target_options=data.get("target_options") or {},
        )

    def _write(self, definition: Definition) -> None:
        """Write through the store; a refusal becomes the form's error (nothing written)."""
        read = self.instance.version if self.instance.pk else 0
        if self.instance.pk and (self.cleaned_data.get("version") or 0) != read:
            raise ValidationError(stale(self.cleaned_data.get("version") or 0, read))
        key = self.instance.job if self.instance.pk else store_name(self.namespace, definition.name)
        if read and definition.body() == self.instance.definition:
            return  # unchanged: a new version would make every replica plan the job again

        async def write(backend: Backend) -> int:
            if read:
                return await stored_jobs.write_at(backend, key, definition.body(), read)
            stored_jobs.refuse_listed(key, await stored_jobs.live_instances(backend))
            return (await stored_jobs.write_new(backend, key, definition)).version

        try:
            version = store_call(write)
        except ConflictError as exc:
            if read:
                raise ValidationError(stale(read, exc.current)) from None
            raise ValidationError(
                f"a definition named {key!r} exists already: open it to change it"
            ) from None
        except TimeoutError:
            raise ValidationError(
                "the store did not answer in time: the change may have been saved or not; "
                "reload the page to see what the store holds"
            ) from None
        except AnarchonError as exc:
            raise ValidationError(f"the store did not take the change: {exc}") from None
        self.instance.job, self.instance.version = key, version
        self.instance.definition = definition.body()
        if not self.instance.pk:
            rows = Job.objects.using(store_alias() or "default")
            self.instance.pk = rows.values_list("pk", flat=True).get(job=key)


def stale(read: int, held: int | None) -> str:
    now = f"version {held}" if held else "no definition (it was removed)"
    return (
        f"Someone changed this definition since you opened it: you edited version {read}, "
        f"the store now holds {now}. Nothing was saved. Reload the page to see their change, "
        "then make yours again."
    )


def _initial(definition: Definition) -> dict[str, Any]:
    """The form's values of a stored definition."""
    schedule = definition.schedule
    out: dict[str, Any] = {
        "name": definition.name,
        "target": definition.target,
        "args": list(definition.args),
        "kwargs": dict(definition.kwargs),
        "options": dict(definition.options),
        "target_options": dict(definition.target_options),
        "enabled": definition.enabled,
        "reason": definition.reason or "",
        "start_at": instant(definition.start_at),
        "end_at": instant(definition.end_at),
        "description": definition.description,
        "keep": definition.keep,
        "version": definition.version,
    }
    if isinstance(schedule, Every):
        out.update(kind="every", every=format_duration_ms(schedule.interval_ms))
        out["offset"] = format_duration_ms(schedule.offset_ms) if schedule.offset_ms else ""
    elif isinstance(schedule, Cron):
        out.update(kind="cron", cron=schedule.expression, tz=schedule.tz, day_or=schedule.day_or)
    elif isinstance(schedule, At):
        out.update(kind="at", at=format_instant_ms(schedule.at_ms))
    return out
