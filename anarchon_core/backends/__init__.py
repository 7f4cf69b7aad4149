"""Backends and the one factory that builds any of them from a URL.

Built-in schemes map to modules of this package, imported only when used so that
their drivers stay optional. Other packages (the Django adapter's ``django://``)
register a scheme in the ``anarchon.backends`` entry-point group with a callable
taking the URL; the core never imports an adapter.

Every URL in a message goes through :mod:`anarchon_core.redact` (``mask_url`` is its
``redact_url`` under the older name), so no password reaches a log, page or error.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import cast

from ..backend import Backend
from ..errors import ConfigurationError
from ..redact import brief, brief_url, redact_url
from .memory import MemoryBackend

__all__ = ["DEFAULT_URL", "MemoryBackend", "backend_from_url", "mask_url"]

#: The embedded default: a SQLite file in the working directory.
DEFAULT_URL = "sqlite:///anarchon.sqlite3"

_BUILTIN: dict[str, str] = {
    "memory": "anarchon_core.backends.memory:MemoryBackend.from_url",
    "sqlite": "anarchon_core.backends.sqlite:SqliteBackend.from_url",
    "postgresql": "anarchon_core.backends.postgres:PostgresBackend.from_url",
    "postgres": "anarchon_core.backends.postgres:PostgresBackend.from_url",
    "redis": "anarchon_core.backends.redis:RedisBackend.from_url",
    "rediss": "anarchon_core.backends.redis:RedisBackend.from_url",
    "amqp": "anarchon_core.backends.rabbitmq:RabbitMQBackend.from_url",
    "amqps": "anarchon_core.backends.rabbitmq:RabbitMQBackend.from_url",
    "nats": "anarchon_core.backends.nats:NatsBackend.from_url",
}

#: The optional extra that brings each scheme's driver.
_EXTRAS = {
    "postgresql": "postgres",
    "postgres": "postgres",
    "redis": "redis",
    "rediss": "redis",
    "amqp": "rabbitmq",
    "amqps": "rabbitmq",
    "nats": "nats",
}

ENTRY_POINT_GROUP = "anarchon.backends"

_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*)://")


def backend_from_url(url: str) -> Backend:
    """Build the backend a URL names, e.g. ``sqlite:///anarchon.sqlite3``.

    :raises ConfigurationError: the URL is malformed or its scheme is unknown.
    """
    if not isinstance(url, str):
        raise ConfigurationError(
            f"backend {brief_url(url)} is not valid: give a Backend or a URL string such as "
            f"'sqlite:///anarchon.sqlite3'"
        )
    match = _SCHEME.match(url)
    if match is None:
        raise ConfigurationError(
            f"backend URL {brief_url(url)} is not valid: expected SCHEME://..., such as "
            f"'sqlite:///anarchon.sqlite3' or 'memory://'"
        )
    scheme = match.group(1)
    return _factory(scheme)(url)


def _factory(scheme: str) -> Callable[[str], Backend]:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == scheme:
            return cast(Callable[[str], Backend], ep.load())
    target = _BUILTIN.get(scheme)
    if target is None:
        known = sorted({*_BUILTIN, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})
        raise ConfigurationError(
            f"backend scheme {brief(scheme)} is unknown: use one of "
            + ", ".join(f"{s}://" for s in known)
        )
    module_name, _, attr = target.partition(":")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        extra = _EXTRAS.get(scheme, scheme)
        raise ConfigurationError(
            f"backend scheme {brief(scheme)} needs its driver: "
            f"pip install 'anarchon[{extra}]' ({exc})"
        ) from exc
    for part in attr.split("."):
        obj = getattr(obj, part)
    return cast(Callable[[str], Backend], obj)


#: The older name of :func:`anarchon_core.redact.redact_url`, kept for its callers.
mask_url = redact_url
