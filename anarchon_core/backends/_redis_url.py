"""The Redis backend's URL: ``redis://…``/``rediss://…`` with ``?strategy=`` and ``?prefix=``.

Our own parameters are taken out; the connection parameters redis-py understands are
passed on, and anything else is refused at definition time, naming it (credentials
masked), so that a typo never silently falls back to a default.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from ..errors import ConfigurationError

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

#: Query parameters handed to redis-py; anything else in a URL is refused.
DRIVER_PARAMS = frozenset(
    {
        "db",
        "client_name",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "health_check_interval",
        "max_connections",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_check_hostname",
    }
)
_URL_FORM = "redis://[user:password@]host[:port][/db][?strategy=lease&prefix=anarchon]"


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """What a Redis URL (and the keyword arguments beside it) settles."""

    strategy: str
    prefix: str
    driver_url: str  # the URL redis-py connects with: our own parameters removed
    describe: str  # for logs: credentials masked, strategy and prefix spelled out


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
            f"Redis key prefix {prefix!r} is not valid: use 1-{MAX_PREFIX_CHARS} printable "
            f"characters without '{{' or '}}' (braces would change the Redis Cluster hash tag)"
        )
    return prefix


def parse_url(url: object, strategy: str | None, prefix: str | None) -> RedisSettings:
    """Validate ``url`` and the ``strategy``/``prefix`` given in code (which must agree).

    Query values are percent-decoded (``+`` reads as a space: write ``%2B``).
    """
    from . import mask_url  # the package imports this module lazily: no cycle

    if not isinstance(url, str):
        raise ConfigurationError(f"Redis URL {url!r} is not valid: use {_URL_FORM}")
    try:
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise ConfigurationError(
            f"Redis URL {mask_url(url)!r} is not valid: use {_URL_FORM}"
        ) from None
    if parts.scheme not in ("redis", "rediss") or not parts.hostname or parts.fragment:
        raise ConfigurationError(f"Redis URL {mask_url(url)!r} is not valid: use {_URL_FORM}")
    query: dict[str, str] = {}
    for key, value in pairs:
        if key in query:
            raise ConfigurationError(
                f"Redis URL {mask_url(url)!r} is not valid: {key!r} is given twice"
            )
        query[key] = value
    unknown = sorted(set(query) - DRIVER_PARAMS - {"strategy", "prefix"})
    if unknown:
        raise ConfigurationError(
            f"Redis URL {mask_url(url)!r} is not valid: unknown parameter(s) "
            f"{', '.join(unknown)}; use strategy, prefix or " + ", ".join(sorted(DRIVER_PARAMS))
        )
    chosen_strategy = _pick("strategy", query.get("strategy"), strategy, "lease", url)
    if chosen_strategy not in STRATEGIES:
        raise ConfigurationError(
            f"Redis strategy {chosen_strategy!r} is not valid: use one of "
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
    described = mask_url(urlunsplit(parts._replace(query=shown)))
    return RedisSettings(chosen_strategy, chosen_prefix, driver_url, described)


def _pick(what: str, in_url: str | None, given: str | None, default: str, url: str) -> str:
    from . import mask_url

    if in_url is not None and given is not None and in_url != given:
        raise ConfigurationError(
            f"Redis {what} is given twice, differently: {given!r} and {in_url!r} in "
            f"{mask_url(url)!r}; give it once"
        )
    return in_url if in_url is not None else given if given is not None else default
