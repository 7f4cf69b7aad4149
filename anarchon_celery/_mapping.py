"""Turn ``beat_schedule`` entries and the ``anarchon_*`` settings into anarchon jobs.

Pure functions: no I/O, so the scheduler can validate everything when beat starts.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from celery.schedules import crontab, schedule, solar  # type: ignore[import-untyped]

from anarchon_core.errors import ConfigurationError
from anarchon_core.job import validate_option_keys
from anarchon_core.names import validate_job_name
from anarchon_core.redact import brief_url
from anarchon_core.scheduler import DEFAULT_CANDIDATES
from anarchon_core.schedules import Cron, Every, Schedule
from anarchon_core.settings import read_settings as read_scheduler_settings

__all__ = ["EntryPlan", "Settings", "cron_expression", "job_name", "plan_entry", "read_settings"]

logger = logging.getLogger("anarchon.celery")

MAX_NAME = 200
_VALID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]+")

#: Per-entry keys of ``anarchon_entries`` and what they map to.
ENTRY_KEYS = ("jitter_ms", "tz", "offset", "catch_up", "max_attempts", "retries", "timeout_ms")
_JOB_OPTION_KEYS = ("jitter_ms", "catch_up", "max_attempts", "retries", "timeout_ms")
TASK_ID_MODES = ("deterministic", "random")


@dataclass(frozen=True)
class Settings:
    """The ``anarchon_*`` keys of a Celery app's configuration, validated."""

    backend: str
    namespace: str
    jitter_ms: int | None
    catch_up: str | None
    entries: Mapping[str, Mapping[str, Any]]
    grace_ms: int
    candidates: int | None
    task_id: str
    instance_id: str | None
    allow_local_tz: bool
    scheduler: Mapping[str, Any] = field(default_factory=dict)
    """Further ``Scheduler(...)`` settings given (heartbeat, lease, retention, enabled)."""
    zone: str | None = None
    """The IANA zone of crontab entries; ``None`` until resolved."""


@dataclass(frozen=True)
class EntryPlan:
    """One beat entry as an anarchon job: its job name, schedule and job options."""

    entry: str
    name: str
    schedule: Schedule
    options: dict[str, Any] = field(default_factory=dict)


#: The ``anarchon_*`` keys this adapter checks itself; the others are the core's
#: scheduler settings (``anarchon_jitter_ms``, ``anarchon_heartbeat_ms``, …).
_OWN_KEYS = ("anarchon_backend", "anarchon_entries", "anarchon_task_id", "anarchon_allow_local_tz")


def _conf(app: Any, key: str, default: Any = None) -> Any:
    value = app.conf.get(key)
    return default if value is None else value


def default_store(app: Any) -> str:
    """The store of a beat given no ``anarchon_backend``: ``$ANARCHON_BACKEND``, else the
    broker's Redis when the broker is Redis (every beat of the app shares it, as redbeat
    does; the keys start with ``anarchon:``).

    :raises ConfigurationError: neither, saying what to set: a per-host file as a silent
        default would let every host send each entry once.
    """
    env = os.environ.get("ANARCHON_BACKEND")
    if env:
        return env
    broker = app.conf.broker_url
    first = broker.split(";", 1)[0].strip() if isinstance(broker, str) else ""
    parts = urlsplit(first)
    if parts.scheme in ("redis", "rediss"):
        # Only the server, credentials and database: kombu's own query options are not
        # redis-py's, and the lease strategy is the one that takes runs over.
        return urlunsplit((parts.scheme, parts.netloc, parts.path, "strategy=lease", ""))
    raise ConfigurationError(
        f"anarchon_backend is not set and the broker ({brief_url(broker or 'amqp://')}) is "
        "not Redis: set anarchon_backend (or $ANARCHON_BACKEND) to a store every beat "
        "shares, e.g. 'redis://host:6379/0' or 'postgresql://host/db', or to "
        "'sqlite:///anarchon.sqlite3' when every beat runs on this one host"
    )


def read_settings(app: Any) -> Settings:
    """Validate the ``anarchon_*`` settings; every problem is reported at once, each
    naming its key and the accepted form (an unknown key with the closest known one).

    :raises ConfigurationError: listing every problem.
    """
    given = {
        str(key): value
        for key, value in app.conf.items()
        if str(key).lower().startswith("anarchon_") and value is not None
    }
    values, found = read_scheduler_settings(
        given,
        spell=lambda name: f"anarchon_{name}",
        own=_OWN_KEYS,
        defaults={"jitter_ms": 500, "grace_ms": 10_000, "candidates": DEFAULT_CANDIDATES},
    )
    problems = [str(problem) for problem in found]
    backend = given.get("anarchon_backend")
    if backend is None:
        try:
            backend = default_store(app)
        except ConfigurationError as exc:
            problems.append(str(exc))
            backend = ""
    elif not isinstance(backend, str) or not backend.strip():
        problems.append(
            f"anarchon_backend = {backend!r} is not valid: give a store URL such as "
            "'sqlite:///anarchon.sqlite3' or 'redis://host:6379/0'"
        )
    namespace = values.get("namespace") or app.main
    if not namespace:
        problems.append(
            "anarchon_namespace is not set and the Celery app has no main name: set "
            "anarchon_namespace (job names in the store are '{namespace}:{entry name}')"
        )
    else:
        try:
            validate_job_name(namespace, what="anarchon_namespace (default: the app's main name)")
            if len(namespace) > MAX_NAME // 2:
                raise ConfigurationError(
                    f"anarchon_namespace {namespace!r} is not valid: at most "
                    f"{MAX_NAME // 2} characters"
                )
        except ConfigurationError as exc:
            problems.append(str(exc))
    entries = given.get("anarchon_entries", {})
    if not isinstance(entries, Mapping) or not all(
        isinstance(v, Mapping) for v in entries.values()
    ):
        problems.append(
            f"anarchon_entries = {entries!r} is not valid: give a dict of entry name -> "
            f"dict with keys from {', '.join(ENTRY_KEYS)}"
        )
        entries = {}
    task_id = given.get("anarchon_task_id", "deterministic")
    if task_id not in TASK_ID_MODES:
        problems.append(
            f"anarchon_task_id = {task_id!r} is not valid: use 'deterministic' (uuid5 of job "
            "and slot, the default) or 'random'"
        )
    allow_local = given.get("anarchon_allow_local_tz", False)
    if not isinstance(allow_local, bool):
        problems.append(
            f"anarchon_allow_local_tz = {allow_local!r} is not valid: give True or False"
        )
    if problems:
        raise ConfigurationError("; ".join(problems))
    return Settings(
        backend=backend,
        namespace=namespace,
        jitter_ms=values.pop("jitter_ms", None),
        catch_up=values.pop("catch_up", None),
        entries=entries,
        grace_ms=values.pop("grace_ms", 10_000),
        candidates=values.pop("candidates", DEFAULT_CANDIDATES),
        task_id=task_id,
        instance_id=values.pop("instance_id", None),
        allow_local_tz=allow_local,
        scheduler={k: v for k, v in values.items() if k != "namespace"},
    )


def app_zone(app: Any, allow_local_tz: bool) -> str:
    """The IANA zone crontab entries are evaluated in, as Celery does (``app.timezone``)."""
    tz = app.conf.timezone
    if tz:
        key = getattr(tz, "key", None) or getattr(tz, "zone", None) or tz
        if not isinstance(key, str):
            raise ConfigurationError(
                f"timezone {tz!r} is not valid for anarchon: give an IANA zone name"
            )
        return key
    if app.conf.enable_utc:
        return "UTC"
    if not allow_local_tz:
        raise ConfigurationError(
            "enable_utc=False with no timezone means the machine's local zone, which may "
            "differ between beat hosts: set timezone = '<IANA zone>' (or "
            "anarchon_allow_local_tz = True to use this host's zone)"
        )
    local = _local_zone_name()
    if local is None:
        raise ConfigurationError(
            "anarchon_allow_local_tz = True but this host's IANA zone cannot be determined "
            "(neither TZ nor /etc/localtime names one): set timezone = '<IANA zone>'"
        )
    return local


def _local_zone_name() -> str | None:
    tz = os.environ.get("TZ", "").lstrip(":")
    if (tz and "/" in tz) or tz == "UTC":
        return tz
    try:
        target = str(Path("/etc/localtime").resolve())
    except OSError:
        return None
    marker = "zoneinfo/"
    return target.split(marker, 1)[1] if marker in target else None


def job_name(entry: str, namespace: str) -> str:
    """The job name of a beat entry: the name itself, or a stable slug plus a hash.

    The store name is ``"{namespace}:{job name}"`` and must fit :data:`JOB_NAME_FORM`.
    """
    room = MAX_NAME - len(namespace) - 1
    if _VALID.fullmatch(entry) and len(entry) <= room:
        return entry
    digest = hashlib.sha256(entry.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    slug = _UNSAFE.sub("-", entry).strip("-_.:")
    slug = slug[: room - len(digest) - 1].rstrip("-_.:") or "entry"
    return f"{slug}-{digest}"


def _compress(values: set[int], low: int, high: int) -> str:
    """A cron field for an expanded Celery set: ``*`` when full, else ranges and numbers."""
    ordered = sorted(values)
    if ordered == list(range(low, high + 1)):
        return "*"
    parts: list[str] = []
    start = prev = ordered[0]
    for value in [*ordered[1:], None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ",".join(parts)


def cron_expression(spec: Any) -> str:
    """The 5-field cron expression for a Celery ``crontab`` (from its expanded sets)."""
    return " ".join(
        (
            _compress(spec.minute, 0, 59),
            _compress(spec.hour, 0, 23),
            _compress(spec.day_of_month, 1, 31),
            _compress(spec.month_of_year, 1, 12),
            _compress(spec.day_of_week, 0, 6),
        )
    )


_relative_logged: set[str] = set()


def plan_entry(entry: Any, settings: Settings, zone: str) -> EntryPlan:
    """Map one ``ScheduleEntry`` to an :class:`EntryPlan`; refuse what cannot map."""
    name = entry.name
    where = f"beat entry {name!r}"
    extra = dict(settings.entries.get(name, {}))
    unknown = sorted(set(extra) - set(ENTRY_KEYS))
    if unknown:
        raise ConfigurationError(
            f"anarchon_entries[{name!r}]: unknown key {unknown[0]!r}; accepted keys: "
            + ", ".join(ENTRY_KEYS)
        )
    spec = entry.schedule
    result: Schedule
    try:
        if type(spec) is schedule:
            if spec.nowfun is not None:
                raise ConfigurationError(
                    f"{where}: schedule(nowfun=...) is not supported: anarchon computes slots "
                    "from the wall clock; remove nowfun"
                )
            if "tz" in extra:
                raise ConfigurationError(
                    f"anarchon_entries[{name!r}]: key 'tz' applies to crontab entries only"
                )
            if spec.relative and name not in _relative_logged:
                _relative_logged.add(name)
                logger.debug("%s: relative=True is ignored: slots lie on the epoch grid", where)
            result = Every(spec.run_every, extra.get("offset"))  # the core checks both
        elif type(spec) is crontab:
            if spec.nowfun is not None:
                raise ConfigurationError(
                    f"{where}: crontab(nowfun=...) is not supported: anarchon evaluates crontab "
                    "entries in an explicit zone; remove nowfun (set timezone or "
                    f"anarchon_entries[{name!r}]['tz'])"
                )
            if "offset" in extra:
                raise ConfigurationError(
                    f"anarchon_entries[{name!r}]: key 'offset' applies to interval entries only"
                )
            entry_zone = extra.get("tz", zone)
            result = Cron(cron_expression(spec), entry_zone, day_or=False)
        elif isinstance(spec, solar):
            raise ConfigurationError(
                f"{where}: solar schedules are not supported by anarchon; use crontab or an "
                "interval"
            )
        else:
            raise ConfigurationError(
                f"{where}: schedule {spec!r} ({type(spec).__name__}) is not supported: use a "
                "number of seconds, a timedelta, celery.schedules.schedule or crontab"
            )
    except ConfigurationError as exc:
        if str(exc).startswith((where, "anarchon_entries")):
            raise
        raise ConfigurationError(f"{where}: {exc}") from None
    options: dict[str, Any] = {}
    for key in _JOB_OPTION_KEYS:
        if key in extra:
            options.update(validate_option_keys({key: extra[key]}, f"anarchon_entries[{name!r}]"))
    jname = job_name(name, settings.namespace)  # the core checks it when the job is added
    return EntryPlan(entry=name, name=jname, schedule=result, options=options)
