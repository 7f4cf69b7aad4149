"""Connections of :mod:`anarchon_core.backends.postgres`: URLs, parsing, defaults, checks.

libpq parses every connection string itself (so bad input fails when the scheduler is
defined); anarchon removes its own URL parameters, checks the numbers libpq would read
only when connecting (ports, timeouts, keepalives) and shows every connection string
redacted (:mod:`anarchon_core.redact`).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ...errors import ConfigurationError
from ...redact import brief, brief_url, redact_text, redact_url, userinfo_problem

__all__ = [
    "CONNECTION_DEFAULTS",
    "INT_PARAMS",
    "MAX_PREPARE_THRESHOLD",
    "URL_FORMS",
    "connection_kwargs",
    "mask_conninfo",
    "parse_conninfo",
    "split_url",
]

URL_FORMS = (
    "'postgresql://user:password@host:5432/dbname' or 'postgres://…', optionally with "
    "?schema=NAME&table_prefix=NAME&prepare_threshold=N|none and any libpq parameter"
)
_OWN_PARAMS = ("schema", "table_prefix", "prepare_threshold")
MAX_PREPARE_THRESHOLD = 1_000_000
#: libpq's integer parameters, checked at definition (libpq reads them only when it
#: connects): the lowest and highest value accepted, and what the number means.
INT_PARAMS: dict[str, tuple[int, int, str]] = {
    "connect_timeout": (1, 3600, "seconds"),
    "keepalives": (0, 1, "0 (off) or 1 (on)"),
    "keepalives_idle": (1, 86_400, "seconds"),
    "keepalives_interval": (1, 3600, "seconds"),
    "keepalives_count": (1, 1000, "probes"),
    "tcp_user_timeout": (0, 3_600_000, "milliseconds, 0 for the system default"),
}
_DIGITS = re.compile(r"[0-9]{1,10}")
# Named connections, so operators find them in pg_stat_activity. libpq's defaults would
# wait forever for an unroutable host and notice a server that vanished without closing
# the connection (host down, partition) only after the kernel's ~15 minutes: with these
# TCP settings a dead connection fails in about 25 s and the pool replaces it.
CONNECTION_DEFAULTS = {
    "application_name": "anarchon",
    "connect_timeout": "10",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "25000",
}

#: The older name of :func:`anarchon_core.redact.redact_url` (URLs and keyword strings).
mask_conninfo = redact_url


def connection_kwargs(params: dict[str, Any], prepare_threshold: int | None) -> dict[str, Any]:
    """psycopg's connection arguments: autocommit, and the defaults the URL does not set."""
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": prepare_threshold}
    for key, default in CONNECTION_DEFAULTS.items():
        if key not in params:  # the URL's own settings win
            kwargs[key] = default
    return kwargs


def split_url(url: str) -> tuple[str, dict[str, str], int | None]:
    """``postgresql://…`` or ``postgres://…`` → (libpq conninfo, anarchon's own
    parameters, prepare threshold); anarchon's parameters are removed from the URL."""

    def invalid(why: str) -> ConfigurationError:
        return ConfigurationError(f"PostgreSQL backend URL {brief_url(url)} is not valid: {why}")

    if not isinstance(url, str):
        raise invalid(f"use {URL_FORMS}")
    problem = userinfo_problem(url, raw_at=False)
    if problem is not None:
        raise invalid(problem)
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("postgresql", "postgres") or parts.fragment:
        raise invalid(f"use {URL_FORMS}")
    own: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in _OWN_PARAMS:
            rest.append((key, value))
        elif key in own:
            raise invalid(f"{key!r} is given twice")
        else:
            own[key] = value
    threshold: int | None = 5
    if "prepare_threshold" in own:
        raw = own["prepare_threshold"]
        if raw.lower() == "none":
            threshold = None
        elif _DIGITS.fullmatch(raw) and int(raw) <= MAX_PREPARE_THRESHOLD:
            threshold = int(raw)
        else:
            raise ConfigurationError(
                f"prepare_threshold {brief(raw)} in {brief_url(url)} is not valid: give an int "
                f"from 0 to {MAX_PREPARE_THRESHOLD}, or 'none' to disable prepared statements "
                f"(PgBouncer)"
            )
    conninfo = url  # libpq reads the URL itself; only anarchon's parameters leave it
    if own:
        conninfo = url.split("?", 1)[0] + ("?" + urlencode(rest) if rest else "")
    return conninfo, own, threshold


def parse_conninfo(conninfo: object) -> dict[str, Any]:
    """libpq's own parse of the connection string, so bad input fails at definition.

    Its integer parameters (ports, timeouts, keepalives) are checked here too: libpq
    reads them only when it connects, which would make a typo a store outage.
    """
    if not isinstance(conninfo, str):
        raise ConfigurationError(
            f"PostgreSQL conninfo {brief_url(conninfo)} is not valid: give a string, {URL_FORMS}"
        )

    def invalid(why: str) -> ConfigurationError:
        return ConfigurationError(
            f"PostgreSQL conninfo {brief_url(conninfo)} is not valid: {why}; use {URL_FORMS}"
        )

    problem = userinfo_problem(conninfo, raw_at=False)
    if problem is not None:
        raise invalid(problem)
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error as exc:  # libpq quotes the bad token: it may be a password
        text = redact_text(str(exc).strip(), conninfo)
        raise invalid(f"libpq: {text[:200]}{'…' if len(text) > 200 else ''}") from None
    for port in str(params.get("port", "")).split(","):
        if port and not (_DIGITS.fullmatch(port) and 1 <= int(port) <= 65535):
            raise invalid(f"port {brief(port)} is not a number from 1 to 65535")
    for key, (low, high, unit) in INT_PARAMS.items():
        value = params.get(key)
        if value is not None and not (_DIGITS.fullmatch(str(value)) and low <= int(value) <= high):
            raise invalid(f"{key}={brief(value)}: give an int from {low} to {high} ({unit})")
    return params
