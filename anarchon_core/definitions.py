"""Job definitions kept in the store: schedules added, changed and removed at runtime.

A :class:`Definition` is data only: a name, a schedule, the name of a *target* (a
handler registered in code with ``@scheduler.target("reports.send")``), its JSON
arguments and the job's options. A store never supplies code or a dotted path: a
definition whose target no instance holds runs nowhere (and says so).

Its JSON form (:meth:`Definition.to_json`) is what the stores keep, what the JSON API
and the CLI exchange and what ``anarchon jobs apply`` reads from a YAML or JSON file.
Every value is checked here, once, with an error that names it and the accepted form;
every value has a bound (:data:`MAX_ARGUMENTS_BYTES` and the limits below), because a
definition is read by every replica.

The ``version`` is issued by the store (a counter, never a clock): every change of a
definition gets a new one, an edit names the version it read (optimistic concurrency),
and a claim names the version its replica planned with, so a replica that has not yet
seen a change can never win a slot of the old schedule.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .durations import format_duration_ms
from .errors import ConfigurationError, refusing
from .job import JobOptions, resolve_options
from .names import validate_job_name
from .redact import brief
from .schedules import (
    At,
    Cron,
    Every,
    Schedule,
    Window,
    format_instant_ms,
    parse_instant_ms,
)

__all__ = [
    "DEFINITION_KEYS",
    "MAX_ARGUMENTS_BYTES",
    "MAX_DEFINITION_BYTES",
    "Definition",
    "Owner",
    "schedule_from_json",
    "schedule_to_json",
    "validate_target",
]

#: ``args`` and ``kwargs`` together, as compact JSON, at most this many bytes.
MAX_ARGUMENTS_BYTES = 16_384
#: ``target_options`` (what the target's adapter reads: Celery's send options), in bytes.
MAX_TARGET_OPTIONS_BYTES = 4096
#: The longest description and disable reason, in characters.
MAX_DESCRIPTION, MAX_REASON = 1000, 500
#: A whole definition's JSON text is at most this many bytes (what a store row holds).
MAX_DEFINITION_BYTES = 32_768

NAME_FORM = "1-200 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit"
TARGET_FORM = "1-200 characters from A-Z a-z 0-9 _ . : -, starting with a letter or digit"
SCHEDULE_FORM = (
    "give {'every': '10s'} (optionally with 'offset'), {'cron': '0 3 * * *'} (optionally "
    "with 'tz' and 'day_or') or {'at': '2026-12-24T18:00:00+02:00'}"
)

Owner = Literal["store", "code"]
OWNERS: tuple[Owner, ...] = ("store", "code")

#: The keys of a definition's JSON form.
DEFINITION_KEYS = frozenset(
    {
        "name",
        "schedule",
        "target",
        "args",
        "kwargs",
        "options",
        "enabled",
        "reason",
        "start_at",
        "end_at",
        "description",
        "keep",
        "owner",
        "target_options",
        "version",
    }
)


def validate_target(target: object) -> str:
    """A target name: the same alphabet as job names (Celery task names fit it)."""
    return validate_job_name(target, what="target")


def schedule_from_json(data: object) -> Schedule:
    """``{'every': '10s', 'offset': '2s'}``, ``{'cron': '0 3 * * *', 'tz': 'Europe/Athens',
    'day_or': True}`` or ``{'at': '2026-12-24T18:00:00Z'}`` as a schedule."""
    if not isinstance(data, Mapping):
        raise ConfigurationError(f"schedule {brief(data)} is not valid: {SCHEDULE_FORM}")
    kinds = [kind for kind in ("every", "cron", "at") if kind in data]
    allowed = {"every": {"every", "offset"}, "cron": {"cron", "tz", "day_or"}, "at": {"at"}}
    if len(kinds) != 1 or not set(data) <= allowed[kinds[0]]:
        raise ConfigurationError(f"schedule {brief(dict(data))} is not valid: {SCHEDULE_FORM}")
    kind = kinds[0]
    if kind == "every":
        return Every(data["every"], data.get("offset"))
    if kind == "cron":
        return Cron(data["cron"], data.get("tz", "UTC"), day_or=data.get("day_or", True))
    return At(data["at"])


def schedule_to_json(schedule: Schedule) -> dict[str, Any]:
    """The JSON form :func:`schedule_from_json` reads (a :class:`Window` is not one: its
    bounds are the definition's ``start_at`` and ``end_at``)."""
    if isinstance(schedule, Every):
        out: dict[str, Any] = {"every": format_duration_ms(schedule.interval_ms)}
        if schedule.offset_ms:
            out["offset"] = format_duration_ms(schedule.offset_ms)
        return out
    if isinstance(schedule, Cron):
        out = {"cron": schedule.expression, "tz": schedule.tz}
        if not schedule.day_or:
            out["day_or"] = False
        return out
    if isinstance(schedule, At):
        return {"at": format_instant_ms(schedule.at_ms)}
    raise ConfigurationError(
        f"schedule {brief(schedule)} cannot be stored: give an Every, a Cron or an At"
    )


@dataclass(frozen=True, slots=True)
class Definition:
    """A job kept in the store. Build one with :meth:`create` (or :meth:`from_json`),
    which check every value; ``version`` is the store's, 0 before it is stored."""

    name: str
    schedule: Schedule
    target: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    """Job options by their public names (those of :data:`~anarchon_core.job.JOB_OPTIONS`)."""
    enabled: bool = True
    reason: str | None = None
    """Why the definition is disabled (shown beside it)."""
    start_at: int | None = None
    """No slot before this instant (epoch ms): a bound, not "the first run"."""
    end_at: int | None = None
    """The last instant a slot may have (epoch ms)."""
    description: str = ""
    keep: bool = False
    """A one-off (``at``) stays stored after it fired; else it is removed once its slot
    is older than the history retention."""
    owner: Owner = "store"
    """``code``: synced from a scheduler's code jobs (read-only elsewhere); ``store``."""
    target_options: Mapping[str, Any] = field(default_factory=dict)
    """What the target's adapter reads (Celery: queue, routing_key, headers, priority…)."""
    version: int = 0

    @classmethod
    def create(
        cls,
        name: str,
        schedule: Schedule | Mapping[str, Any],
        target: str,
        *,
        args: Any = (),
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        enabled: bool = True,
        reason: str | None = None,
        start_at: Any = None,
        end_at: Any = None,
        description: str = "",
        keep: bool = False,
        owner: str = "store",
        target_options: Mapping[str, Any] | None = None,
        version: int = 0,
    ) -> Definition:
        """A checked definition; a bad value raises a :class:`ConfigurationError` naming it."""
        with refusing("job name"):
            validate_job_name(name, what="definition name")
            if ":" in name:
                raise ConfigurationError(
                    f"definition name {brief(name)} is not valid: it may not contain ':', "
                    f"which separates the namespace; use {NAME_FORM}"
                )
        where = f"definition {name!r}"
        with refusing("target"):
            validate_target(target)
        if not isinstance(schedule, Schedule):
            schedule = schedule_from_json(schedule)
        if isinstance(schedule, Window):
            raise ConfigurationError(
                f"{where}: give start_at and end_at as the definition's own, not a Window"
            )
        schedule_to_json(schedule)  # a custom schedule cannot be stored
        args_list = _json_list(args, where)
        kwargs_dict = _json_object(kwargs or {}, f"{where}: kwargs")
        _bounded({"args": args_list, "kwargs": kwargs_dict}, MAX_ARGUMENTS_BYTES, where, "args")
        with refusing("option"):  # each option and their combination; kept by name
            resolve_options(JobOptions(), options or {}, where)
        targets = _json_object(target_options or {}, f"{where}: target_options")
        _bounded(targets, MAX_TARGET_OPTIONS_BYTES, where, "target_options")
        for flag, value in (("enabled", enabled), ("keep", keep)):
            if not isinstance(value, bool):
                raise ConfigurationError(
                    f"{where}: {flag} {brief(value)} is not valid: give true or false"
                )
        start = None if start_at is None else parse_instant_ms(start_at, what="start_at")
        end = None if end_at is None else parse_instant_ms(end_at, what="end_at")
        if start is not None and end is not None and end < start:
            raise ConfigurationError(
                f"{where}: end_at {format_instant_ms(end)} is before start_at "
                f"{format_instant_ms(start)}: give an end at or after the start"
            )
        if owner not in OWNERS:
            raise ConfigurationError(
                f"{where}: owner {brief(owner)} is not valid: 'store' or 'code'"
            )
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ConfigurationError(f"{where}: version {brief(version)} is not valid")
        return cls(
            name=name,
            schedule=schedule,
            target=target,
            args=tuple(args_list),
            kwargs=kwargs_dict,
            options=dict(options or {}),
            enabled=enabled,
            reason=_text(reason, MAX_REASON, where, "reason", optional=True),
            start_at=start,
            end_at=end,
            description=_text(description, MAX_DESCRIPTION, where, "description") or "",
            keep=keep,
            owner=owner,
            target_options=targets,
            version=version,
        )

    @classmethod
    def from_json(cls, data: object, *, version: int | None = None) -> Definition:
        """Read :meth:`to_json`'s shape (unknown keys are refused, with the accepted ones)."""
        if not isinstance(data, Mapping):
            raise ConfigurationError(f"definition {brief(data)} is not valid: give a JSON object")
        unknown = set(data) - DEFINITION_KEYS
        if unknown:
            raise ConfigurationError(
                f"definition {brief(data.get('name'))}: unknown key(s) "
                f"{', '.join(sorted(map(str, unknown)))}; accepted: "
                f"{', '.join(sorted(DEFINITION_KEYS))}"
            )
        for key in ("name", "schedule", "target"):
            if key not in data:
                raise ConfigurationError(
                    f"definition {brief(data.get('name'))}: {key!r} is missing"
                )
        return cls.create(
            data["name"],
            data["schedule"],
            data["target"],
            args=data.get("args", ()),
            kwargs=data.get("kwargs"),
            options=data.get("options"),
            enabled=data.get("enabled", True),
            reason=data.get("reason"),
            start_at=data.get("start_at"),
            end_at=data.get("end_at"),
            description=data.get("description", ""),
            keep=data.get("keep", False),
            owner=data.get("owner", "store"),
            target_options=data.get("target_options"),
            version=data.get("version", 0) if version is None else version,
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON form (instants as ISO 8601 UTC text)."""
        return {
            "name": self.name,
            "schedule": schedule_to_json(self.schedule),
            "target": self.target,
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
            "options": dict(self.options),
            "enabled": self.enabled,
            "reason": self.reason,
            "start_at": None if self.start_at is None else format_instant_ms(self.start_at),
            "end_at": None if self.end_at is None else format_instant_ms(self.end_at),
            "description": self.description,
            "keep": self.keep,
            "owner": self.owner,
            "target_options": dict(self.target_options),
            "version": self.version,
        }

    def body(self) -> str:
        """The JSON text a store keeps (without the version, which the store issues)."""
        data = self.to_json()
        del data["version"]
        text = json.dumps(data, separators=(",", ":"), sort_keys=True)
        if len(text.encode()) > MAX_DEFINITION_BYTES:
            raise ConfigurationError(
                f"definition {self.name!r} is {len(text.encode())} bytes as JSON: at most "
                f"{MAX_DEFINITION_BYTES}"
            )
        return text

    @classmethod
    def from_body(cls, body: str, version: int) -> Definition:
        """Read a stored :meth:`body` back with the version the store gave it."""
        return cls.from_json(json.loads(body), version=version)

    @property
    def effective_schedule(self) -> Schedule:
        """The schedule bounded by ``start_at`` and ``end_at`` (the slots replicas plan)."""
        if self.start_at is None and self.end_at is None:
            return self.schedule
        return Window(self.schedule, start_at=self.start_at, end_at=self.end_at)

    def same_content(self, other: Definition) -> bool:
        """Whether ``other`` says the same (versions aside): ``apply`` leaves it unchanged."""
        return self.body() == other.body()

    def with_version(self, version: int) -> Definition:
        return replace(self, version=version)

    def fingerprint(self) -> str:
        """A short hash of the whole definition and its version: replicas that planned
        with the same one rank each other for its runs."""
        text = f"{self.body()}\n{self.version}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _json_list(value: Any, where: str) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ConfigurationError(f"{where}: args {brief(value)} is not valid: give a JSON array")
    return list(value)


def _json_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigurationError(
            f"{where} {brief(value)} is not valid: give a JSON object with string keys"
        )
    return dict(value)


def _bounded(value: Any, limit: int, where: str, what: str) -> None:
    try:
        size = len(json.dumps(value, separators=(",", ":"), allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{where}: {what} are not JSON values ({exc})") from None
    if size > limit:
        raise ConfigurationError(
            f"{where}: {what} take {size} bytes as JSON: at most {limit}; pass a key to the "
            f"data (a row id, a file name) instead of the data itself"
        )


def _text(value: Any, limit: int, where: str, what: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise ConfigurationError(
            f"{where}: {what} {brief(value)} is not valid: give text of at most {limit} characters"
        )
    return value
