"""Scheduler settings read from a host's configuration: every problem, with its key.

Django reads ``settings.ANARCHON = {"JITTER_MS": 500}``, Celery ``app.conf``'s
``anarchon_jitter_ms``: each spells the same scheduler settings its own way.
:func:`read_settings` checks such a mapping against :data:`SCHEDULER_SETTINGS` (plus
the host's own settings) and never raises: it returns the value of every setting (the
valid one given, else the default) and one :class:`SettingProblem` per bad value or
unknown key, named as the user spelled it, with the accepted form, the default and,
for a typo, the closest known key. A host then lists them all at once (Django's system
checks) or refuses to start with all of them (a Celery beat).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .durations import MAX_DURATION_MS, parse_duration_ms
from .engine.candidates import MAX_CANDIDATES, check_candidates
from .errors import ConfigurationError
from .job import CATCH_UP_POLICIES, JobOptions
from .names import NAMESPACE_FORM, validate_namespace
from .redact import brief
from .scheduler import MAX_HEARTBEAT_MS, MAX_INSTANCE_ID_LENGTH, Scheduler

__all__ = ["SCHEDULER_SETTINGS", "Check", "Setting", "SettingProblem", "one_of", "read_settings"]

Spell = Callable[[str], str]
#: ``check(value, values)`` returns the value to use or raises :class:`ValueError` or
#: :class:`ConfigurationError`; ``values`` holds the settings read before (by name).
Check = Callable[[Any, Mapping[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class SettingProblem:
    """One bad setting, named as the user spelled it."""

    key: str
    """The key as spelled in the host's configuration (``JITTER_MS``, ``anarchon_jitter_ms``)."""
    message: str
    hint: str
    unknown: bool = False
    """An unknown key (a typo, or a setting of another version), not a bad value."""

    def __str__(self) -> str:
        return f"{self.message}: {self.hint}"


@dataclass(frozen=True, slots=True)
class Setting:
    """How one setting is checked, and its default.

    ``form`` is the accepted form as told to the user; ``{heartbeat_ms}`` in it is
    replaced by the host's spelling of that key. ``default`` is used when the setting is
    not given or not valid, and quoted in the hint unless ``None`` (the form says what
    ``None`` means).
    """

    form: str
    check: Check
    default: Any = None


def one_of(*choices: object) -> Check:
    """A check that accepts exactly one of ``choices`` (``1`` is not ``True``)."""

    def check(value: Any, _values: Mapping[str, Any]) -> Any:
        if any(type(value) is type(choice) and value == choice for choice in choices):
            return value
        raise ValueError

    return check


def _int_between(low: int, high: int) -> Callable[[Any, Mapping[str, Any]], int]:
    def check(value: Any, _values: Mapping[str, Any]) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError
        return value

    return check


def _lease(value: Any, values: Mapping[str, Any]) -> int | None:
    if value is None:
        return None
    return _int_between(2 * values["heartbeat_ms"], MAX_DURATION_MS)(value, values)


def _store_url(value: Any, _values: Mapping[str, Any]) -> str:
    if isinstance(value, str) and value.strip():
        return value
    raise ValueError


def _instance_id(value: Any, _values: Mapping[str, Any]) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip() and len(value) <= MAX_INSTANCE_ID_LENGTH:
        return value
    raise ValueError


def _retention(value: Any, _values: Mapping[str, Any]) -> str | dt.timedelta:
    parse_duration_ms(value, what="history retention")
    return value  # type: ignore[no-any-return]


def _stated(settings: Mapping[str, Setting]) -> dict[str, Setting]:
    """``settings`` with the defaults that ``Scheduler(...)`` and :class:`JobOptions` state."""
    keywords = inspect.signature(Scheduler).parameters
    job = {option.name: option.default for option in dataclasses.fields(JobOptions)}
    return {
        name: dataclasses.replace(
            setting, default=keywords[name].default if name in keywords else job[name]
        )
        for name, setting in settings.items()
    }


#: The settings of ``Scheduler(...)`` that hosts read from their configuration, by the
#: keyword's name, in the order they are checked (``lease_ms`` after ``heartbeat_ms``).
SCHEDULER_SETTINGS: Mapping[str, Setting] = _stated(
    {
        "backend": Setting(
            "a store URL such as 'sqlite:///anarchon.sqlite3' or 'redis://host:6379/0'",
            _store_url,
        ),
        "namespace": Setting(
            f"None or a name of {NAMESPACE_FORM}", lambda value, _: validate_namespace(value)
        ),
        "instance_id": Setting(
            "None (hostname:pid:random) or a non-empty string of at most "
            f"{MAX_INSTANCE_ID_LENGTH} characters",
            _instance_id,
        ),
        "jitter_ms": Setting(
            f"an int of milliseconds >= 0 and <= {MAX_DURATION_MS}",
            _int_between(0, MAX_DURATION_MS),
        ),
        "heartbeat_ms": Setting(
            f"an int of milliseconds >= 1 and <= {MAX_HEARTBEAT_MS}",
            _int_between(1, MAX_HEARTBEAT_MS),
        ),
        "lease_ms": Setting(
            "None (3 × {heartbeat_ms}) or an int of ms >= 2 × {heartbeat_ms} and <= "
            f"{MAX_DURATION_MS}",
            _lease,
        ),
        "grace_ms": Setting(
            f"an int of milliseconds >= 0 and <= {MAX_DURATION_MS}",
            _int_between(0, MAX_DURATION_MS),
        ),
        "catch_up": Setting(
            "one of " + ", ".join(map(repr, CATCH_UP_POLICIES)), one_of(*CATCH_UP_POLICIES)
        ),
        "history_retention": Setting(
            'a duration such as "7d", "12h", "1d12h" or a timedelta', _retention
        ),
        "candidates": Setting(
            f"an int from 1 to {MAX_CANDIDATES} (instances that claim each run), or None "
            "(every instance)",
            lambda value, _: check_candidates(value),
        ),
        "enabled": Setting(
            "True, False or None (None: $ANARCHON_ENABLED, default on)", one_of(True, False, None)
        ),
        "sync_code_jobs": Setting(
            "True (store the code jobs' definitions at start, for the dashboards) or False",
            one_of(True, False),
        ),
    }
)


def read_settings(
    raw: Mapping[str, Any],
    *,
    spell: Spell,
    label: Spell | None = None,
    extra: Mapping[str, Setting] | None = None,
) -> tuple[dict[str, Any], list[SettingProblem]]:
    """Check the settings in ``raw``; never raises.

    ``spell(name)`` is the host's key for a setting (``"JITTER_MS"``); ``label(key)``
    how a message shows a key (``"ANARCHON['JITTER_MS']"``; the key itself by default).
    ``extra`` holds the host's own settings by name, checked after the scheduler
    settings; one named like a scheduler setting replaces it (another default).
    Returns the value of every setting by name (the valid one given, else the default)
    and the problems, unknown keys first.
    """
    settings = {**SCHEDULER_SETTINGS, **(extra or {})}
    show = label or (lambda key: key)
    keys = {spell(name): name for name in settings}
    folded = {key.lower(): key for key in keys}  # JITER_MS and anarchon_jiter_ms alike
    problems: list[SettingProblem] = []
    for key in raw:
        if key in keys:
            continue
        close = difflib.get_close_matches(str(key).lower(), list(folded), n=1)
        hint = f"did you mean {folded[close[0]]!r}? " if close else ""
        problems.append(
            SettingProblem(
                str(key),
                f"{show(str(key))} is not a setting anarchon knows",
                f"{hint}accepted keys: {', '.join(keys)}",
                unknown=True,
            )
        )
    values: dict[str, Any] = {}
    for key, name in keys.items():
        setting = settings[name]
        values[name] = setting.default
        if key not in raw:
            continue
        try:
            values[name] = setting.check(raw[key], values)
        except (ValueError, ConfigurationError):
            form = setting.form.replace("{heartbeat_ms}", spell("heartbeat_ms"))
            default = "" if setting.default is None else f" (default: {setting.default!r})"
            problems.append(
                SettingProblem(
                    key, f"{show(key)} = {brief(raw[key])} is not valid", f"give {form}{default}"
                )
            )
    return values, problems
