"""Connections of :mod:`anarchon_core.backends.postgres`: URLs, parsing, defaults, masking.

libpq parses every connection string itself (so bad input fails when the scheduler is
defined); anarchon only removes its own URL parameters and masks passwords.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ..errors import ConfigurationError
from . import mask_url

__all__ = [
    "CONNECTION_DEFAULTS",
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
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")
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
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("postgresql", "postgres") or parts.fragment:
        raise ConfigurationError(
            f"PostgreSQL backend URL {mask_url(url)!r} is not valid: use {URL_FORMS}"
        )
    own: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in _OWN_PARAMS:
            rest.append((key, value))
        elif key in own:
            raise ConfigurationError(
                f"PostgreSQL backend URL {mask_url(url)!r} is not valid: {key!r} is given twice"
            )
        else:
            own[key] = value
    threshold: int | None = 5
    if "prepare_threshold" in own:
        raw = own["prepare_threshold"]
        if raw.lower() == "none":
            threshold = None
        elif raw.isdigit():
            threshold = int(raw)
        else:
            raise ConfigurationError(
                f"prepare_threshold {raw!r} in {mask_url(url)!r} is not valid: give an "
                f"int >= 0, or 'none' to disable prepared statements (PgBouncer)"
            )
    conninfo = url  # libpq reads the URL itself; only anarchon's parameters leave it
    if own:
        conninfo = url.split("?", 1)[0] + ("?" + urlencode(rest) if rest else "")
    return conninfo, own, threshold


def parse_conninfo(conninfo: object) -> dict[str, Any]:
    """libpq's own parse of the connection string, so bad input fails at definition."""
    if not isinstance(conninfo, str):
        raise ConfigurationError(
            f"PostgreSQL conninfo {conninfo!r} is not valid: give a string, {URL_FORMS}"
        )
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        raise ConfigurationError(
            f"PostgreSQL conninfo {mask_conninfo(conninfo)!r} is not valid ({exc}): use {URL_FORMS}"
        ) from None
    for port in str(params.get("port", "")).split(","):
        if port and not port.isdigit():
            raise ConfigurationError(
                f"PostgreSQL conninfo {mask_conninfo(conninfo)!r} is not valid: port {port!r} "
                f"is not a number; use {URL_FORMS}"
            )
    return params


def mask_conninfo(conninfo: str) -> str:
    """A URL or ``key=value`` conninfo with its password replaced by ``***``."""
    if "://" in conninfo:
        masked = mask_url(conninfo)
        parts = urlsplit(masked)
        if "password" in parts.query:  # ?password=… is a libpq parameter too
            query = [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)]
            masked = urlunsplit(parts._replace(query=urlencode(query, safe="*")))
        return masked
    return _KEYWORD_PASSWORD.sub(r"\1***", conninfo)
