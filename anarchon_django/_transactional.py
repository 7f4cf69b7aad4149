"""``transactional=True``: a handler's writes and its run's outcome commit together.

The handler runs inside ``transaction.atomic(using=ALIAS)`` on the ORM store's alias,
and the run's outcome is written in that transaction by the store's fenced finish; if
the attempt no longer holds its lease, :class:`AttemptFenced` rolls its writes back.
Only a returning, sync handler is finished here (``docs/django.md``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from anarchon_core.backend import Backend
from anarchon_core.context import RunContext, bounded_meta
from anarchon_core.errors import ConfigurationError, RunCancelled
from anarchon_core.records import Status

__all__ = ["AttemptFenced", "store_alias", "transactional"]


class AttemptFenced(RunCancelled):
    """The attempt lost its run before committing: its writes were rolled back."""


def store_alias(backend_url: str, job: str) -> str:
    """The database alias of a ``django://ALIAS`` store; any other store is refused."""
    parts = urlsplit(backend_url)
    if parts.scheme != "django":
        raise ConfigurationError(
            f"job {job!r}: transactional=True needs the ORM store (ANARCHON['BACKEND'] = "
            f"'django://ALIAS'), so that the outcome commits in the handler's transaction; "
            f"the store here is {parts.scheme}://…"
        )
    return parts.netloc or "default"


def transactional(
    handler: Callable[[RunContext], Any], alias: str, store: Callable[[], Backend]
) -> Callable[[RunContext], Any]:
    """Wrap a sync handler: its writes on ``alias`` and its outcome commit as one, the run
    finished on the handler's connection by ``store().finish_in_transaction()``."""

    @functools.wraps(handler)
    def run(ctx: RunContext) -> Any:
        from django.db import connections, transaction

        lease = ctx.lease
        with transaction.atomic(using=alias):
            result = handler(ctx)
            if lease is not None:
                conn = connections[alias]
                conn.ensure_connection()
                meta = bounded_meta(ctx.meta)
                if not store().finish_in_transaction(
                    conn.connection, lease, Status.SUCCESS, meta=meta
                ):
                    raise AttemptFenced(
                        f"run {ctx.job}@{ctx.slot} attempt {ctx.attempt} no longer holds its "
                        f"lease (taken over, cancelled or handed over): its writes were "
                        f"rolled back"
                    )
        ctx.recorded = lease is not None
        return result

    return run
