"""The PostgreSQL lease backend: psycopg 3, async, one connection pool per backend.

Every decision of the contract is one statement, so one round trip, in autocommit:
the claim, the takeover and the trigger call PL/pgSQL functions created at
:meth:`open` (see :mod:`._sql` for why functions and not one CTE);
heartbeat, finish, release, the sweep, cancel and the registry are single statements
(:mod:`._ops` holds the operations' SQL). A batch is one round trip and one
commit too: ``claim_many`` calls a function that runs the claim function for each
request, and ``finish_many`` is one statement over arrays. Two claims of one run are decided
by the primary key (``INSERT … ON CONFLICT DO NOTHING``); "another live run of this
job" is decided under a transaction-scoped advisory lock on the job, so it cannot
race a claim of another slot. Every time is read from ``clock_timestamp()`` inside
the statement: leases are judged by the database's clock, never the instances'.

The layout (tables, indexes, functions, schema version) is created idempotently at
open, under an advisory lock, so that many instances may start at once.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from ...backend import (
    SCHEMA_VERSION,
    Capabilities,
)
from ...errors import BackendError, BackendUnavailable, ConfigurationError, SchemaVersionError
from ...redact import brief_url, redact_text, redact_url
from ._conninfo import connection_kwargs, parse_conninfo, split_url
from ._contract import Params, PostgresContract
from ._sql import (
    FILL_FACTORS,
    PREFIX_MAX,
    SCHEMA_MAX,
    Statements,
    identifier,
)
from ._supplied import SuppliedPostgresBackend

__all__ = ["FILL_FACTORS", "PostgresBackend", "SuppliedPostgresBackend"]

logger = logging.getLogger("anarchon.backends.postgres")

Conn = psycopg.AsyncConnection[tuple[Any, ...]]
Cursor = psycopg.AsyncCursor[tuple[Any, ...]]

_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK


class PostgresBackend(PostgresContract):
    """A lease backend on PostgreSQL (≥ 12), tables in ``schema`` named ``table_prefix*``.

    ``prepare_threshold`` is psycopg's: ``None`` disables server-side prepared
    statements (needed behind PgBouncer in transaction mode). ``min_size`` and
    ``max_size`` bound the pool; ``timeout`` (seconds) bounds the wait for a pooled
    connection before the store counts as unavailable.
    """

    capabilities = Capabilities(
        lease=True, store_clock=True, finish=True, finish_in_transaction=True
    )
    name = "postgresql"

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = "public",
        table_prefix: str = "anarchon_",
        prepare_threshold: int | None = 5,
        min_size: int = 1,
        max_size: int = 4,
        timeout: float = 5.0,
        prune_batch: int = 1000,
    ) -> None:
        self.schema = identifier("schema", schema, SCHEMA_MAX)
        self.table_prefix = identifier("table_prefix", table_prefix, PREFIX_MAX)
        self.conninfo = conninfo
        self._params = parse_conninfo(conninfo)
        if prepare_threshold is not None and not _is_int(prepare_threshold, 0):
            raise ConfigurationError(
                f"prepare_threshold {prepare_threshold!r} is not valid: give an int >= 0, "
                f"or None to disable prepared statements (PgBouncer transaction mode)"
            )
        for what, value, low in (("min_size", min_size, 0), ("max_size", max_size, 1)):
            if not _is_int(value, low):
                raise ConfigurationError(f"{what} {value!r} is not valid: give an int >= {low}")
        if max_size < min_size:
            raise ConfigurationError(f"max_size {max_size} is smaller than min_size {min_size}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigurationError(f"timeout {timeout!r} is not valid: give seconds > 0")
        if not _is_int(prune_batch, 1):
            raise ConfigurationError(f"prune_batch {prune_batch!r} is not valid: give an int >= 1")
        self.prepare_threshold = prepare_threshold
        self.min_size, self.max_size, self.timeout = min_size, max_size, float(timeout)
        self.prune_batch = prune_batch
        self.sql = Statements(self.schema, self.table_prefix)
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._cursors: weakref.WeakKeyDictionary[Conn, Cursor] = weakref.WeakKeyDictionary()

    @classmethod
    def from_url(cls, url: str) -> PostgresBackend:
        """``postgresql://…`` or ``postgres://…``; anarchon's own query parameters are
        ``schema``, ``table_prefix`` and ``prepare_threshold`` (``none`` disables
        prepared statements); every other parameter goes to libpq."""
        conninfo, own, threshold = split_url(url)
        try:
            return cls(
                conninfo,
                schema=own.get("schema", "public"),
                table_prefix=own.get("table_prefix", "anarchon_"),
                prepare_threshold=threshold,
            )
        except ConfigurationError as exc:
            raise ConfigurationError(f"{exc} (in {brief_url(url)})") from None

    def describe(self) -> str:
        where = redact_url(self.conninfo)
        if (self.schema, self.table_prefix) != ("public", "anarchon_"):
            where += f" [{self.schema}.{self.table_prefix}*]"
        return where

    # -- life cycle --------------------------------------------------------------
    async def open(self) -> None:
        """Create the layout on one direct connection (failing fast), then start the pool."""
        if self._pool is not None:
            return
        kwargs = connection_kwargs(self._params, self.prepare_threshold)
        conn = await self._direct_connection()
        try:
            await self._create_layout(conn)
        except psycopg.Error as exc:
            raise self._convert(exc) from exc
        finally:
            await conn.close()
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self.conninfo,
            kwargs=kwargs,
            min_size=self.min_size,
            max_size=self.max_size,
            timeout=self.timeout,
            # psycopg_pool doubles its reconnect delay up to this bound and then starts
            # afresh on the next request: a short bound keeps recovery after an outage
            # prompt (its default, 5 min, could leave a scheduler idle for minutes).
            reconnect_timeout=2 * self.timeout,
            open=False,
            name=f"anarchon:{self.schema}.{self.table_prefix}",
        )
        await pool.open(wait=False)
        self._pool = pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def watch_definitions(self, changed: Callable[[], None]) -> None:
        """``LISTEN`` on a connection of its own (not the pool's: a pooler in transaction
        mode would drop it) to the channel every definition write notifies at commit."""
        conn = await self._direct_connection()
        try:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.sql.channel)))
            changed()
            async for _ in conn.notifies():
                changed()
        except psycopg.Error as exc:
            raise self._convert(exc) from exc
        finally:
            await conn.close()

    async def _direct_connection(self) -> Conn:
        """A connection of its own, outside the pool, with the pool's settings (a store
        error, converted, if it cannot be made)."""
        kwargs = connection_kwargs(self._params, self.prepare_threshold)
        try:
            return await psycopg.AsyncConnection.connect(self.conninfo, **kwargs)
        except psycopg.Error as exc:
            raise self._convert(exc) from exc

    async def _create_layout(self, conn: Conn) -> None:
        """Check the version and create what is missing, serialised across instances.

        A store already at this version and complete (its tables, indexes, added
        columns and functions are counted, and none of the former indexes is left) is
        left alone: no table lock at all (``CREATE INDEX IF NOT EXISTS`` would take one
        even when the index exists).
        """
        async with conn.transaction():
            await conn.execute("SET LOCAL lock_timeout = '30s'")
            await conn.execute(self.sql.lock_layout)
            state = {
                "schema": self.schema,
                "meta": self.table_prefix + "meta",
                "functions": self.sql.function_names,
                "relations": self.sql.relations,
                "columns": self.sql.added_columns,
                "former": self.sql.former_relations,
            }
            row = await (await conn.execute(self.sql.layout_state, state)).fetchone()
            assert row is not None
            has_schema, has_meta, functions, relations, columns, former = row
            version: int | None = None
            if has_meta:
                cur = await conn.execute(self.sql.get_version)
                found = await cur.fetchone()
                version = None if found is None else _version(found[0])
            if version is not None and version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"the PostgreSQL store {self.describe()} holds schema version {version}, "
                    f"newer than version {SCHEMA_VERSION} known to this anarchon: "
                    f"upgrade anarchon to use it"
                )
            complete = (functions, relations, columns, former) == (
                len(self.sql.function_names),
                len(self.sql.relations),
                len(self.sql.added_columns),
                0,
            )
            if version == SCHEMA_VERSION and complete:
                return
            if not has_schema:  # IF NOT EXISTS would still need CREATE on the database
                await conn.execute(self.sql.create_schema)
            await conn.execute(self.sql.create_meta)
            await conn.execute(self.sql.create_tables)
            for statement in self.sql.create_functions:
                await conn.execute(statement)
            if version is None:
                await conn.execute(self.sql.set_version, (str(SCHEMA_VERSION),))

    # -- the one way statements run ------------------------------------------------
    async def _query(
        self, query: str, params: Params | None = None
    ) -> tuple[list[tuple[Any, ...]], int]:
        """One statement on a pooled connection: its rows and its row count.

        Driver errors are converted here, at the boundary. A connection that died
        while idle in the pool (server restart, an operator's ``pg_terminate_backend``,
        a proxy's idle timeout) fails its next statement: the pool is checked, dropping
        the other dead ones, and the statement is sent once more on a fresh connection.
        That is safe because every operation here is idempotent for its token (docs/guarantees.md).
        """
        pool = self._pool
        if pool is None:
            raise BackendError(f"{self.describe()} is not open: await open() first")
        for retry in (False, True):
            conn: Conn | None = None
            try:
                conn = await pool.getconn()
                try:
                    # One cursor per connection, reused: a new one per statement costs
                    # a measurable share of a claim that takes ~0.1 ms.
                    cur = self._cursors.get(conn)
                    if cur is None:
                        cur = self._cursors[conn] = conn.cursor()
                    await cur.execute(query, params)
                    result = cur.pgresult  # cheaper than cur.description, which builds columns
                    has_rows = result is not None and result.status == _TUPLES_OK
                    rows = await cur.fetchall() if has_rows else []
                    return rows, cur.rowcount
                finally:
                    await pool.putconn(conn)
            except (PoolTimeout, PoolClosed) as exc:
                raise self._convert(exc) from exc
            except psycopg.Error as exc:
                lost = conn is not None and (conn.broken or conn.closed)
                if not lost or retry:
                    raise self._convert(exc) from exc
                logger.warning(
                    "connection to %s lost (%s); retrying on a fresh connection",
                    self.describe(),
                    redact_text(str(exc).strip(), self.conninfo) or type(exc).__name__,
                )
                with contextlib.suppress(psycopg.Error):  # it logs what it discards
                    await pool.check()
        raise AssertionError("unreachable")  # pragma: no cover

    def _convert(self, exc: BaseException) -> BackendError:
        """Connection and operational problems are retryable; everything else is not."""
        text = redact_text(str(exc).strip(), self.conninfo) or type(exc).__name__
        message = f"PostgreSQL store {self.describe()}: {text}"
        if isinstance(exc, PoolClosed):
            return BackendError(f"{self.describe()} is not open: await open() first")
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | PoolTimeout):
            return BackendUnavailable(message)
        return BackendError(message)

    async def _rows(self, query: str, params: Params | None = None) -> list[tuple[Any, ...]]:
        return (await self._query(query, params))[0]


# -- helpers -------------------------------------------------------------------------
def _is_int(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _version(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise BackendError(f"the PostgreSQL store's schema version {raw!r} is unreadable") from None
