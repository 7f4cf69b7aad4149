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
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from anarchon_core.backends import backend_from_url
from anarchon_core.errors import ConfigurationError
from anarchon_core.redact import brief, brief_url, redact_text
from anarchon_core.scheduler import DEFAULT_CANDIDATES
from anarchon_core.settings import read_settings as read_scheduler_settings

__all__ = ["DEFAULTS", "AnarchonSettings", "Problem", "read_settings"]

#: Every accepted key and its default (docs/django.md, Settings reference).
DEFAULTS: dict[str, Any] = {
    "BACKEND": "django://default",
    "NAMESPACE": None,
    "AUTODISCOVER": "jobs",
    "IMPORT_PATHS": [],
    "INSTANCE_ID": None,
    "JITTER_MS": 500,
    "HEARTBEAT_MS": 2000,
    "LEASE_MS": None,
    "CATCH_UP": "none",
    "HISTORY_RETENTION": "7d",
    "GRACE_MS": 10_000,
    "CANDIDATES": DEFAULT_CANDIDATES,
    "ENABLED": None,
}

#: The keys this adapter checks itself; the rest are the core's scheduler settings.
_OWN_KEYS = ("BACKEND", "AUTODISCOVER", "IMPORT_PATHS")
#: The database alias of ``django://`` with none named.
DEFAULT_ALIAS = "default"
_MODULE = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*")


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

    backend: str = "django://default"
    namespace: str | None = None
    autodiscover: str | None = "jobs"
    import_paths: tuple[str, ...] = ()
    instance_id: str | None = None
    jitter_ms: int = 500
    heartbeat_ms: int = 2000
    lease_ms: int | None = None
    catch_up: str = "none"
    history_retention: str | dt.timedelta = "7d"
    grace_ms: int = 10_000
    candidates: int | None = DEFAULT_CANDIDATES
    enabled: bool | None = None
    problems: tuple[Problem, ...] = field(default=(), compare=False)

    @property
    def django_alias(self) -> str | None:
        """The database alias of a ``django://ALIAS`` backend, else ``None``."""
        if self.backend.startswith("django://"):
            return self.backend[len("django://") :].split("?", 1)[0].strip("/") or "default"
        return None

    def scheduler_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``anarchon_core.Scheduler`` (besides the backend)."""
        return {
            "namespace": self.namespace,
            "instance_id": self.instance_id,
            "heartbeat_ms": self.heartbeat_ms,
            "lease_ms": self.lease_ms,
            "history_retention": self.history_retention,
            "grace_ms": self.grace_ms,
            "candidates": self.candidates,
            "enabled": self.enabled,
            "jitter_ms": self.jitter_ms,
            "catch_up": self.catch_up,
        }


def read_settings(raw: object, databases: Mapping[str, Any] | None = None) -> AnarchonSettings:
    """Validate ``settings.ANARCHON`` (``raw``); ``databases`` is ``settings.DATABASES``."""
    problems: list[Problem] = []
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        problems.append(
            Problem(
                "anarchon.E001",
                f"ANARCHON = {raw!r} is not valid: it must be a dict",
                'e.g. ANARCHON = {"BACKEND": "django://default", "JITTER_MS": 500}',
            )
        )
        return AnarchonSettings(problems=tuple(problems))
    values, found = read_scheduler_settings(
        raw,
        spell=str.upper,
        label=lambda key: f"ANARCHON[{key!r}]",
        own=_OWN_KEYS,
        defaults={key.lower(): value for key, value in DEFAULTS.items()},
    )
    problems.extend(
        Problem("anarchon.E002" if p.unknown else "anarchon.E005", p.message, p.hint) for p in found
    )

    def bad(key: str, form: str) -> None:
        problems.append(
            Problem(
                "anarchon.E005",
                f"ANARCHON[{key!r}] = {brief(raw[key])} is not valid",
                f"give {form} (default: {DEFAULTS[key]!r})",
            )
        )

    if "BACKEND" in raw:
        backend = raw["BACKEND"]
        problem = _check_backend(backend, databases)
        if problem is not None:
            problems.append(problem)
        # Kept even when bad: the scheduler then refuses to open it (with the reason),
        # and the subcommands' default --backend fails on it instead of another store.
        values["backend"] = backend if isinstance(backend, str) else repr(backend)
    if "AUTODISCOVER" in raw:
        value = raw["AUTODISCOVER"]
        if value is None or value is False:
            values["autodiscover"] = None
        elif isinstance(value, str) and _MODULE.fullmatch(value):
            values["autodiscover"] = value
        else:
            bad("AUTODISCOVER", "a module name looked up in every installed app, or False")
    if "IMPORT_PATHS" in raw:
        value = raw["IMPORT_PATHS"]
        if isinstance(value, list | tuple) and all(
            isinstance(v, str) and _MODULE.fullmatch(v) for v in value
        ):
            values["import_paths"] = tuple(value)
        else:
            bad("IMPORT_PATHS", 'a list of dotted module paths, e.g. ["myproject.jobs"]')
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
