"""The Redis backend's URL: ``redis://…``/``rediss://…`` with ``?strategy=`` and ``?prefix=``.

Our own parameters are taken out; the connection parameters redis-py understands are
checked here (redis-py itself would read ``socket_keepalive=maybe`` as true and
``redis://host/abc`` as database 0) and passed on; anything else is refused at
definition time, naming the bad value (briefly, credentials redacted) and the accepted
form, so that a typo never silently falls back to a default.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from ...errors import ConfigurationError
from ...redact import brief, brief_url, redact_url, userinfo_problem

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_URL",
    "DRIVER_PARAMS",
    "STRATEGIES",
    "RedisSettings",
    "parse_url",
    "validate_prefix",
]

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_PREFIX = "anarchon"
STRATEGIES = ("lease", "stream-id", "idmp", "script")
MAX_PREFIX_CHARS = 100

#: The largest database number, socket timeout (s), check interval (s) and pool size.
MAX_DB = 2_147_483_647
MAX_TIMEOUT_S = 3600
MAX_CONNECTIONS = 10_000
_URL_FORM = "redis://[user:password@]host[:port][/db][?strategy=lease&prefix=anarchon]"
_BOOL = {"1": "1", "true": "1", "yes": "1", "0": "0", "false": "0", "no": "0"}
_INT = re.compile(r"[0-9]{1,10}")
_SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?")
_CLIENT_NAME = re.compile(r"[!-~]{1,128}")  # CLIENT SETNAME refuses spaces
_MAX_PATH = 4096


def _in_range(text: str, low: int, high: int) -> bool:
    return bool(_INT.fullmatch(text)) and low <= int(text) <= high


def _seconds(text: str) -> bool:
    return bool(_SECONDS.fullmatch(text)) and 0 < float(text) <= MAX_TIMEOUT_S


#: Query parameters handed to redis-py, each with its check and the form it accepts;
#: anything else in a URL is refused.
DRIVER_CHECKS: dict[str, tuple[Callable[[str], bool], str]] = {
    "db": (lambda v: _in_range(v, 0, MAX_DB), f"an int from 0 to {MAX_DB}"),
    "client_name": (
        lambda v: bool(_CLIENT_NAME.fullmatch(v)),
        "1-128 printable ASCII characters without spaces",
    ),
    "socket_timeout": (_seconds, f"seconds > 0 and <= {MAX_TIMEOUT_S}, e.g. 5 or 0.5"),
    "socket_connect_timeout": (_seconds, f"seconds > 0 and <= {MAX_TIMEOUT_S}, e.g. 5 or 0.5"),
    "socket_keepalive": (lambda v: v.lower() in _BOOL, "true or false (1/0, yes/no)"),
    "health_check_interval": (
        lambda v: _in_range(v, 0, MAX_TIMEOUT_S),
        f"int seconds from 0 (off) to {MAX_TIMEOUT_S}",
    ),
    "max_connections": (
        lambda v: _in_range(v, 1, MAX_CONNECTIONS),
        f"an int from 1 to {MAX_CONNECTIONS}",
    ),
    "ssl_cert_reqs": (
        lambda v: v in ("none", "optional", "required"),
        "none, optional or required",
    ),
    "ssl_ca_certs": (lambda v: 0 < len(v) <= _MAX_PATH, "a file path"),
    "ssl_certfile": (lambda v: 0 < len(v) <= _MAX_PATH, "a file path"),
    "ssl_keyfile": (lambda v: 0 < len(v) <= _MAX_PATH, "a file path"),
    "ssl_check_hostname": (lambda v: v.lower() in _BOOL, "true or false (1/0, yes/no)"),
}
DRIVER_PARAMS = frozenset(DRIVER_CHECKS)


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """What a Redis URL (and the keyword arguments beside it) settles."""

    strategy: str
    prefix: str
    driver_url: str  # the URL redis-py connects with: our own parameters removed
    describe: str  # for logs: credentials redacted, strategy and prefix spelled out


def validate_prefix(prefix: object) -> str:
    """A key prefix: printable, 1-100 characters, no braces (they would move the hash tag)."""
    if (
        not isinstance(prefix, str)
        or not 0 < len(prefix) <= MAX_PREFIX_CHARS
        or "{" in prefix
        or "}" in prefix
        or not prefix.isprintable()
    ):
        raise ConfigurationError(
            f"Redis key prefix {brief(prefix)} is not valid: use 1-{MAX_PREFIX_CHARS} printable "
            f"characters without '{{' or '}}' (braces would change the Redis Cluster hash tag)"
        )
    return prefix


def parse_url(url: object, strategy: str | None, prefix: str | None) -> RedisSettings:
    """Validate ``url`` and the ``strategy``/``prefix`` given in code (which must agree).

    Query values are percent-decoded (``+`` reads as a space: write ``%2B``).
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"Redis URL {brief_url(url)} is not valid: use {_URL_FORM}")

    def invalid(why: str) -> ConfigurationError:
        return ConfigurationError(f"Redis URL {brief_url(url)} is not valid: {why}")

    problem = userinfo_problem(url)
    if problem is not None:
        raise invalid(problem)
    try:
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise invalid(f"use {_URL_FORM}") from None
    if parts.scheme not in ("redis", "rediss") or not parts.hostname or parts.fragment:
        raise invalid(f"use {_URL_FORM}")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise invalid(f"the port must be a number from 1 to 65535; use {_URL_FORM}")
    db = parts.path[1:]
    if db and not _in_range(db, 0, MAX_DB):
        raise invalid(
            f"database {brief(db)} (the path) is not an int from 0 to {MAX_DB}; use {_URL_FORM}"
        )
    query: dict[str, str] = {}
    for key, value in pairs:
        if key in query:
            raise invalid(f"{brief(key)} is given twice")
        query[key] = value
    unknown = sorted(set(query) - DRIVER_PARAMS - {"strategy", "prefix"})
    if unknown:
        raise invalid(
            f"unknown parameter(s) {', '.join(brief(k, 40) for k in unknown[:5])}; use strategy, "
            f"prefix or " + ", ".join(sorted(DRIVER_PARAMS))
        )
    for key, value in query.items():
        check, form = DRIVER_CHECKS.get(key, (None, ""))
        if check is not None and not check(value):
            raise invalid(f"{key}={brief(value)}: give {form}")
        if key.startswith("ssl_") and parts.scheme != "rediss":
            raise invalid(f"{key} is a TLS option: use rediss:// for TLS")
    if db and "db" in query:
        raise invalid("the database is given twice, as the path and as db=: give it once")
    chosen_strategy = _pick("strategy", query.get("strategy"), strategy, "lease", url)
    if chosen_strategy not in STRATEGIES:
        raise ConfigurationError(
            f"Redis strategy {brief(chosen_strategy)} is not valid: use one of "
            + ", ".join(STRATEGIES)
            + " (lease is the default and the only one with leases)"
        )
    chosen_prefix = validate_prefix(
        _pick("prefix", query.get("prefix"), prefix, DEFAULT_PREFIX, url)
    )
    driver = {k: v for k, v in query.items() if k in DRIVER_PARAMS}
    driver_url = urlunsplit(parts._replace(query=urlencode(driver)))
    shown = urlencode(
        {"strategy": chosen_strategy, "prefix": chosen_prefix, **driver}, quote_via=quote
    )
    described = redact_url(urlunsplit(parts._replace(query=shown)))
    return RedisSettings(chosen_strategy, chosen_prefix, driver_url, described)


def _pick(what: str, in_url: str | None, given: str | None, default: str, url: str) -> str:
    if in_url is not None and given is not None and in_url != given:
        raise ConfigurationError(
            f"Redis {what} is given twice, differently: {brief(given)} and {brief(in_url)} in "
            f"{brief_url(url)}; give it once"
        )
    return in_url if in_url is not None else given if given is not None else default
