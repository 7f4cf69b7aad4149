"""The ``ANARCHON = {...}`` setting: read, validated, and mapped onto ``Scheduler(...)``.

Reading never raises: each bad value becomes a :class:`Problem` (reported by the
system checks in :mod:`anarchon_django.checks`) and the key falls back to its default,
so that ``manage.py check`` can list every problem at once. ``manage.py anarchon run``
runs the checks first and refuses to start on any error.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from anarchon_core.backends import backend_from_url
from anarchon_core.errors import ConfigurationError
from anarchon_core.redact import brief, brief_url, redact_text
from anarchon_core.settings import SCHEDULER_SETTINGS, Setting
from anarchon_core.settings import read_settings as read_scheduler_settings

__all__ = ["DJANGO_SETTINGS", "AnarchonSettings", "Problem", "read_settings"]

#: The database alias of ``django://`` with none named.
DEFAULT_ALIAS = "default"
_MODULE = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*")


def _backend(value: Any, _values: Mapping[str, Any]) -> str:
    # Kept even when bad (E003/E004 say why): the scheduler then refuses to open it, and
    # the subcommands' default --backend fails on it instead of using another store.
    return value if isinstance(value, str) else repr(value)


def _autodiscover(value: Any, _values: Mapping[str, Any]) -> str | None:
    if value is None or value is False:
        return None
    if isinstance(value, str) and _MODULE.fullmatch(value):
        return value
    raise ValueError


def _import_paths(value: Any, _values: Mapping[str, Any]) -> tuple[str, ...]:
    if isinstance(value, list | tuple) and all(
        isinstance(v, str) and _MODULE.fullmatch(v) for v in value
    ):
        return tuple(value)
    raise ValueError


#: The keys of ``ANARCHON`` besides the core's scheduler settings (docs/django.md,
#: Settings reference), and ``BACKEND``'s default.
DJANGO_SETTINGS: Mapping[str, Setting] = {
    "backend": replace(SCHEDULER_SETTINGS["backend"], check=_backend, default="django://default"),
    # None: the core's default ("latest"), which a claim-only store ignores (given, it
    # would be refused there as a lease-only option).
    "catch_up": replace(SCHEDULER_SETTINGS["catch_up"], default=None),
    "autodiscover": Setting(
        "a module name looked up in every installed app, or False", _autodiscover, "jobs"
    ),
    "import_paths": Setting(
        'a list of dotted module paths, e.g. ["myproject.jobs"]', _import_paths, ()
    ),
}


@dataclass(frozen=True)
class Problem:
    """One bad setting: becomes a ``django.core.checks`` message with ``id``."""

    id: str
    msg: str
    hint: str | None = None
    warning: bool = False


@dataclass(frozen=True)
class AnarchonSettings:
    """The validated settings (defaults where a value was bad or missing)."""

    backend: str
    namespace: str | None
    autodiscover: str | None
    import_paths: tuple[str, ...]
    instance_id: str | None
    jitter_ms: int
    heartbeat_ms: int
    lease_ms: int | None
    catch_up: str | None
    history_retention: str | dt.timedelta
    grace_ms: int
    candidates: int | None
    enabled: bool | None
    sync_code_jobs: bool
    problems: tuple[Problem, ...] = field(default=(), compare=False)

    def scheduler_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``anarchon_core.Scheduler`` (besides the backend)."""
        given = {name: getattr(self, name) for name in SCHEDULER_SETTINGS if name != "backend"}
        if given["catch_up"] is None:
            del given["catch_up"]
        return given


def read_settings(raw: object, databases: Mapping[str, Any] | None = None) -> AnarchonSettings:
    """Validate ``settings.ANARCHON`` (``raw``); ``databases`` is ``settings.DATABASES``."""
    problems: list[Problem] = []
    if not isinstance(raw, Mapping):
        if raw is not None:
            problems.append(
                Problem(
                    "anarchon.E001",
                    f"ANARCHON = {raw!r} is not valid: it must be a dict",
                    'e.g. ANARCHON = {"BACKEND": "django://default", "JITTER_MS": 500}',
                )
            )
        raw = {}
    values, found = read_scheduler_settings(
        raw, spell=str.upper, label=lambda key: f"ANARCHON[{key!r}]", extra=DJANGO_SETTINGS
    )
    problems += [
        Problem("anarchon.E002" if p.unknown else "anarchon.E005", p.message, p.hint) for p in found
    ]
    if "BACKEND" in raw and (problem := _check_backend(raw["BACKEND"], databases)):
        problems.append(problem)
    return AnarchonSettings(**values, problems=tuple(problems))


def _check_backend(url: object, databases: Mapping[str, Any] | None) -> Problem | None:
    form = '"django://ALIAS" (a key of DATABASES) or a store URL such as "postgresql://…"'
    if not isinstance(url, str):
        return Problem(
            "anarchon.E003", f"ANARCHON['BACKEND'] = {brief_url(url)} is not valid", f"give {form}"
        )
    if url.startswith("django://"):
        try:
            alias = alias_from_url(url)
        except ConfigurationError as exc:
            return Problem(
                "anarchon.E003", f"ANARCHON['BACKEND'] is not valid: {exc}", f"give {form}"
            )
        if databases is not None and alias not in databases:
            known = ", ".join(map(repr, databases)) or "none"
            return Problem(
                "anarchon.E004",
                f"ANARCHON['BACKEND'] = {brief_url(url)} names the database alias {brief(alias)}, "
                f"which is not in DATABASES",
                f"use one of the aliases in DATABASES ({known}), e.g. 'django://default'",
            )
        return None
    try:
        backend_from_url(url)  # builds the adapter only: no connection is opened
    except ConfigurationError as exc:
        return Problem(
            "anarchon.E003",
            f"ANARCHON['BACKEND'] = {brief_url(url)} is not valid: {redact_text(str(exc), url)}",
            f"give {form}",
        )
    return None


def alias_from_url(url: str) -> str:
    """The alias of ``django://ALIAS`` (``default`` when empty), or a redacted refusal.

    Nothing but an alias may follow the scheme: no user, password, path, query or
    fragment, so a URL copied from a store's settings never passes with its password.
    """
    try:
        parts = urlsplit(url)
    except (TypeError, ValueError, AttributeError):
        parts = None
    if (
        parts is None
        or parts.scheme != "django"
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or "@" in parts.netloc
    ):
        raise ConfigurationError(
            f"Django backend URL {brief_url(url)} is not valid: use 'django://ALIAS', "
            f"ALIAS a key of settings.DATABASES (default: 'default')"
        )
    return parts.netloc or DEFAULT_ALIAS
