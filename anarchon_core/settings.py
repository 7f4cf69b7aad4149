"""Scheduler settings read from a host's configuration: every problem, with its key.

Django reads ``settings.ANARCHON = {"JITTER_MS": 500}``, Celery ``app.conf``'s
``anarchon_jitter_ms``: each spells the same scheduler settings its own way.
:func:`read_settings` checks such a mapping against :data:`SCHEDULER_SETTINGS` and
never raises: it returns the values that are valid and one :class:`SettingProblem` per
bad value or unknown key, named as the user spelled it, with the accepted form and,
for a typo, the closest known key. A host then lists them all at once (Django's system
checks) or refuses to start with all of them (a Celery beat).
"""

from __future__ import annotations

import datetime as dt
import difflib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ._candidates import MAX_CANDIDATES, check_candidates
from .durations import MAX_DURATION_MS, parse_duration_ms
from .errors import ConfigurationError
from .job import CATCH_UP_POLICIES
from .names import NAMESPACE_FORM, validate_namespace
from .redact import brief
from .scheduler import MAX_HEARTBEAT_MS, MAX_INSTANCE_ID_LENGTH

__all__ = ["SCHEDULER_SETTINGS", "Setting", "SettingProblem", "read_settings"]

Spell = Callable[[str], str]


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
    """How one scheduler setting is checked.

    ``form`` is the accepted form as told to the user; ``{heartbeat_ms}`` in it is
    replaced by the host's spelling of that key. ``check(value, valid)`` returns the
    value to use or raises :class:`ValueError` or :class:`ConfigurationError`; ``valid``
    holds the settings already read (by core name), for rules between settings.
    """

    form: str
    check: Callable[[Any, Mapping[str, Any]], Any]


def _int_between(low: int, high: int) -> Callable[[Any, Mapping[str, Any]], int]:
    def check(value: Any, _valid: Mapping[str, Any]) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError
        return value

    return check


def _lease(value: Any, valid: Mapping[str, Any]) -> int | None:
    if value is None:
        return None
    heartbeat = valid.get("heartbeat_ms", 2000)
    return _int_between(2 * heartbeat, MAX_DURATION_MS)(value, valid)


def _instance_id(value: Any, _valid: Mapping[str, Any]) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip() and len(value) <= MAX_INSTANCE_ID_LENGTH:
        return value
    raise ValueError


def _catch_up(value: Any, _valid: Mapping[str, Any]) -> str:
    if value not in CATCH_UP_POLICIES:
        raise ValueError
    return str(value)


def _retention(value: Any, _valid: Mapping[str, Any]) -> str | dt.timedelta:
    parse_duration_ms(value, what="history retention")
    return value  # type: ignore[no-any-return]


def _candidates(value: Any, _valid: Mapping[str, Any]) -> int | None:
    return check_candidates(value)


def _enabled(value: Any, _valid: Mapping[str, Any]) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ValueError


def _namespace(value: Any, _valid: Mapping[str, Any]) -> str | None:
    return validate_namespace(value)


#: The settings of ``Scheduler(...)`` that hosts read from their configuration, by the
#: keyword's name, in the order they are checked (``lease_ms`` after ``heartbeat_ms``).
SCHEDULER_SETTINGS: Mapping[str, Setting] = {
    "namespace": Setting(f"None or a name of {NAMESPACE_FORM}", _namespace),
    "instance_id": Setting(
        "None (hostname:pid:random) or a non-empty string of at most "
        f"{MAX_INSTANCE_ID_LENGTH} characters",
        _instance_id,
    ),
    "jitter_ms": Setting(
        f"an int of milliseconds >= 0 and <= {MAX_DURATION_MS}", _int_between(0, MAX_DURATION_MS)
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
        f"an int of milliseconds >= 0 and <= {MAX_DURATION_MS}", _int_between(0, MAX_DURATION_MS)
    ),
    "catch_up": Setting("one of " + ", ".join(map(repr, CATCH_UP_POLICIES)), _catch_up),
    "history_retention": Setting(
        'a duration such as "7d", "12h", "1d12h" or a timedelta', _retention
    ),
    "candidates": Setting(
        f"an int from 1 to {MAX_CANDIDATES} (instances that claim each run), or None "
        "(every instance)",
        _candidates,
    ),
    "enabled": Setting("True, False or None (None: $ANARCHON_ENABLED, default on)", _enabled),
}


def read_settings(
    raw: Mapping[str, Any],
    *,
    spell: Spell,
    label: Spell | None = None,
    own: Collection[str] = (),
    defaults: Mapping[str, Any] | None = None,
    only: Collection[str] | None = None,
) -> tuple[dict[str, Any], list[SettingProblem]]:
    """Check the scheduler settings in ``raw``; never raises.

    ``spell(name)`` is the host's key for a setting (``"JITTER_MS"``); ``label(key)``
    how a message shows a key (``"ANARCHON['JITTER_MS']"``; the key itself by default).
    ``own`` lists the host's keys that it checks itself (known, so not reported as
    unknown); ``defaults``, by setting name, are quoted in the hints; ``only`` limits
    the settings read (the others are unknown keys). Returns the valid values given,
    by setting name, and the problems, unknown keys first.
    """
    show = label or (lambda key: key)
    names = [name for name in SCHEDULER_SETTINGS if only is None or name in only]
    keys = {spell(name): name for name in names}
    known = [*keys, *own]
    problems: list[SettingProblem] = []
    for key in raw:
        if key in keys or key in own:
            continue
        folded = {k.lower(): k for k in known}  # JITER_MS and anarchon_jiter_ms alike
        close = difflib.get_close_matches(str(key).lower(), list(folded), n=1)
        hint = f"did you mean {folded[close[0]]!r}? " if close else ""
        problems.append(
            SettingProblem(
                str(key),
                f"{show(str(key))} is not a setting anarchon knows",
                f"{hint}accepted keys: {', '.join(known)}",
                unknown=True,
            )
        )
    valid: dict[str, Any] = {}
    for key, name in keys.items():
        if key not in raw:
            continue
        setting = SCHEDULER_SETTINGS[name]
        try:
            valid[name] = setting.check(raw[key], valid)
        except (ValueError, ConfigurationError):
            form = setting.form.format(heartbeat_ms=spell("heartbeat_ms"))
            default = (
                ""
                if defaults is None or name not in defaults
                else f" (default: {defaults[name]!r})"
            )
            problems.append(
                SettingProblem(
                    key, f"{show(key)} = {brief(raw[key])} is not valid", f"give {form}{default}"
                )
            )
    return valid, problems
