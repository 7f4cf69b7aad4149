"""``transactional=True``: a handler's writes and its run's outcome commit together.

The handler runs inside ``transaction.atomic(using=ALIAS)`` on the alias of the ORM
store, and before that block commits, the run's outcome is written *in the same
transaction* by the store's own fenced finish (the conditional ``UPDATE`` that matches
the attempt's token). If another instance took the run over, or it was cancelled or
handed over meanwhile, the token no longer matches, nothing is finished, and
:class:`AttemptFenced` rolls the handler's writes back: a runner that lost its run
commits nothing. Once the block commits, ``ctx.recorded`` tells the engine that the
outcome is in the store (its own finish afterwards is an idempotent repeat).

Only a handler that returns is finished here; one that raises rolls back and the engine
records the failure as usual (and retries it if ``retries`` allow). Sync handlers only:
``transaction.atomic`` does not span ``await``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from anarchon_core.backend import Lease, wall_clock_ms
from anarchon_core.backends.sqlite import _decisions as sqlite_decisions
from anarchon_core.context import RunContext, bounded_meta
from anarchon_core.errors import ConfigurationError, RunCancelled
from anarchon_core.records import Status

if TYPE_CHECKING:  # psycopg renders them: imported only where PostgreSQL is used
    from anarchon_core.backends.postgres._sql import Statements

__all__ = ["AttemptFenced", "store_alias", "transactional"]

_statements: dict[str, Statements] = {}
_statements_lock = threading.Lock()


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


def transactional(handler: Callable[[RunContext], Any], alias: str) -> Callable[[RunContext], Any]:
    """Wrap a sync handler: its writes on ``alias`` and its outcome commit as one."""

    @functools.wraps(handler)
    def run(ctx: RunContext) -> Any:
        from django.db import transaction

        lease = ctx.lease
        with transaction.atomic(using=alias):
            result = handler(ctx)
            if lease is not None and not record_success(alias, lease, ctx.meta):
                raise AttemptFenced(
                    f"run {ctx.job}@{ctx.slot} attempt {ctx.attempt} no longer holds its "
                    f"lease (taken over, cancelled or handed over): its writes were rolled back"
                )
        ctx.recorded = lease is not None
        return result

    return run


def record_success(alias: str, lease: Lease, meta: dict[str, Any]) -> bool:
    """Finish ``lease`` as a success in the current transaction of ``alias``.

    The same decision the store makes in :meth:`finish`, sent on the handler's
    connection instead of the store's: False if the attempt no longer holds the run.
    """
    from django.db import connections

    conn = connections[alias]
    meta = bounded_meta(meta)
    if conn.vendor == "postgresql":
        from anarchon_core.backends.postgres._contract import finish_params, finish_verdict

        with conn.cursor() as cursor:
            cursor.execute(
                _postgres_statements(conn).finish, finish_params(lease, Status.SUCCESS, meta=meta)
            )
            row = cursor.fetchone()
        return row is not None and finish_verdict(row, Status.SUCCESS)
    if conn.vendor == "sqlite":
        conn.ensure_connection()
        decide = sqlite_decisions.finish(lease, Status.SUCCESS, meta=meta)
        return decide(conn.connection, wall_clock_ms())
    raise ConfigurationError(
        f"database alias {alias!r} is {conn.vendor}: the ORM store supports PostgreSQL and SQLite"
    )


def _postgres_statements(conn: Any) -> Statements:
    """The store's statements for the schema of the alias's tables (looked up once)."""
    with _statements_lock:
        found = _statements.get(conn.alias)
    if found is None:
        with conn.cursor() as cursor:
            cursor.execute("SELECT current_schema()")
            (schema,) = cursor.fetchone()
        from anarchon_core.backends.postgres._sql import Statements

        from ._orm_postgres import PREFIX

        found = Statements(str(schema), PREFIX)
        with _statements_lock:
            _statements[conn.alias] = found
    return found
