"""The SQLite lease backend: the embedded default, one file shared by a host's processes.

Every decision of the contract runs under SQLite's write lock (``BEGIN
IMMEDIATE``), so the processes sharing the file serialise exactly where the
in-memory reference serialises on the event loop; the decisions mirror
:mod:`anarchon_core.backends.memory` step for step. Decisions queued at the same
moment share one transaction, each in a savepoint of its own
(:mod:`~anarchon_core.backends.sqlite._batch`), and a claim that can only lose reads
the run without taking the lock at all. The store's clock is the host's wall clock,
read under the lock for each decision (every process on one host shares it). The
decisions themselves are in :mod:`~anarchon_core.backends.sqlite._decisions`.

``sqlite3`` blocks, so each backend owns one worker thread holding its connection
and every statement runs there, never on the event loop. The file uses WAL (readers
never wait for the writer) with ``synchronous=NORMAL`` (a commit survives a process
crash; a power loss may lose the last commits, which the lease protocol tolerates).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable, Collection, Sequence, Set
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from ...backend import (
    SCHEMA_VERSION,
    Backend,
    Capabilities,
    Claim,
    ClaimRequest,
    DueRun,
    FinishRequest,
    InstanceInfo,
    Lease,
    PruneScope,
    StoredDefinition,
    TakeoverRequest,
    instance_json,
    wall_clock_ms,
)
from ...errors import BackendError, BackendUnavailable, ConfigurationError, SchemaVersionError
from ...records import HistoryQuery, Origin, RunRecord, Status
from ...redact import brief_url
from .._sql import history_filter, record_from_row
from ..supply import ConnectionSupply
from . import _decisions as decisions
from . import _sql as sql
from ._batch import Decision, WriteQueue, execute_batch, retry_busy

__all__ = ["SqliteBackend"]

T = TypeVar("T")

#: Why :meth:`SqliteBackend.due_runs` lists a run, by the run's state.
_REASONS: dict[str, Literal["expired", "retry", "manual"]] = {
    Status.RUNNING.value: "expired",
    sql.WAITING: "retry",
    sql.PENDING: "manual",
}

_URL_FORMS = "'sqlite:///relative/path.db' (from the working directory) or 'sqlite:////abs/path.db'"


class SqliteBackend(Backend):
    """A lease backend on one SQLite file; several processes on one host may share it.

    ``busy_timeout_ms`` bounds how long an operation waits for another process's
    write lock before the store counts as unavailable. With ``supply``, the statements
    run on a host's own connection to the file (the Django ORM's: see
    :mod:`anarchon_core.backends.supply`), whose migrations made the layout.
    """

    capabilities = Capabilities(
        lease=True, store_clock=True, finish=True, finish_in_transaction=True
    )
    name = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_ms: int = 5000,
        supply: ConnectionSupply[sqlite3.Connection] | None = None,
    ) -> None:
        valid = isinstance(busy_timeout_ms, int) and not isinstance(busy_timeout_ms, bool)
        if not valid or busy_timeout_ms <= 0:
            raise ConfigurationError(
                f"busy_timeout_ms {busy_timeout_ms!r} is not valid: give a positive int (ms)"
            )
        self.path = os.fspath(path)
        if self.path:  # relative paths mean the working directory of the definition
            self.path = os.path.abspath(self.path)
        else:
            raise ConfigurationError(f"SQLite path {path!r} is not valid: give a file path")
        self.busy_timeout_ms = busy_timeout_ms
        self._supply = supply
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._queue: WriteQueue | None = None

    @classmethod
    def from_url(cls, url: str) -> SqliteBackend:
        """``sqlite:///relative.db`` (from the working directory) or ``sqlite:////abs.db``."""
        try:
            parts = urlsplit(url)
        except ValueError:
            parts = None
        if (
            parts is None
            or parts.scheme != "sqlite"
            or not url.startswith("sqlite:///")
            or parts.netloc
            or parts.query
            or parts.fragment
            or parts.path in ("", "/")
            or parts.path.endswith("/")
        ):
            raise ConfigurationError(
                f"SQLite backend URL {brief_url(url)} is not valid: use {_URL_FORMS}"
            )
        return cls(parts.path[1:])

    @property
    def local_to(self) -> str | None:
        return "host"

    def describe(self) -> str:
        return self._supply.describe() if self._supply else f"sqlite:///{self.path}"

    # -- life cycle --------------------------------------------------------------
    async def open(self) -> None:
        """Connect in the worker thread and create the layout (idempotent, race-safe).

        With a supply: start the write queue on its thread (the layout is the host's).
        """
        supply = self._supply
        if supply is not None:
            if self._queue is None:
                self._queue = WriteQueue(supply.executor, self._supplied_batch)
            return
        if self._executor is not None:
            return
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anarchon-sqlite")
        connecting = executor.submit(self._guarded, self._connect)
        try:
            conn = await asyncio.wrap_future(connecting)
        except BaseException:
            # Cancelled mid-connect: close the connection the thread still makes.
            connecting.add_done_callback(_close_connection)
            executor.shutdown(wait=False)
            raise
        self._executor, self._conn = executor, conn
        execute = partial(
            execute_batch, conn, timeout_ms=self.busy_timeout_ms, convert=self._convert
        )
        self._queue = WriteQueue(executor, execute)

    async def close(self) -> None:
        if self._supply is not None:
            queue, self._queue = self._queue, None
            if queue is not None:
                await queue.drain()
            return
        executor, conn, queue = self._executor, self._conn, self._queue
        if executor is None or conn is None or queue is None:
            return
        # Later calls fail fast instead of queueing; decisions queued before still run.
        self._executor = self._conn = self._queue = None
        try:
            await queue.drain()
        finally:
            try:
                await asyncio.get_running_loop().run_in_executor(executor, conn.close)
            finally:
                executor.shutdown(wait=True)  # the queue is empty: the thread exits at once

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout_ms / 1000,
            isolation_level=None,  # explicit transactions only
            check_same_thread=False,  # created here, used only by the worker thread
        )
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            _transaction(conn, _create_layout)
        except BaseException:
            conn.close()
            raise
        return conn

    # -- the worker thread ---------------------------------------------------------
    def _supplied_batch(self, batch: list[Decision[Any]]) -> list[Any]:
        """A batch on the supply's connection (on its thread, where the queue runs it)."""
        assert self._supply is not None
        execute = partial(execute_batch, timeout_ms=self.busy_timeout_ms, convert=self._convert)
        return self._supply.run(lambda conn: execute(conn, batch))

    async def _call(self, op: Callable[[sqlite3.Connection], T]) -> T:
        supply = self._supply
        if supply is not None:
            if self._queue is None:
                raise BackendError(f"{self.describe()} is not open: await open() first")
            loop = asyncio.get_running_loop()
            guarded = partial(self._guarded_on, op)
            return await loop.run_in_executor(supply.executor, supply.run, guarded)
        executor, conn = self._executor, self._conn
        if executor is None or conn is None:
            raise BackendError(f"{self.describe()} is not open: await open() first")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, self._guarded, partial(op, conn))

    async def _write(
        self,
        decide: Callable[[sqlite3.Connection, int], T],
        precheck: Callable[[sqlite3.Connection], T | None] | None = None,
    ) -> T:
        """Settle ``decide(conn, now)`` under the write lock, batched with its neighbours."""
        queue = self._queue
        if queue is None:
            raise BackendError(f"{self.describe()} is not open: await open() first")
        return await queue.submit(Decision(decide, precheck))

    async def _write_many(self, batch: list[Decision[T]]) -> list[T]:
        """Settle ``batch`` in order, queued together; the first error once all are settled."""
        queue = self._queue
        if queue is None:
            raise BackendError(f"{self.describe()} is not open: await open() first")
        answers = await asyncio.gather(*queue.submit_many(batch), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return answers  # type: ignore[return-value]

    def _guarded_on(self, op: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
        return self._guarded(partial(op, conn))

    def _guarded(self, op: Callable[[], T]) -> T:
        """Run ``op`` in the worker thread, retrying busy answers; convert driver errors."""
        return retry_busy(op, timeout_ms=self.busy_timeout_ms, convert=self._convert)

    def _convert(self, exc: sqlite3.Error) -> BackendError:
        """The driver error as the contract names it: operational errors are retryable."""
        kind = BackendUnavailable if isinstance(exc, sqlite3.OperationalError) else BackendError
        error = kind(f"SQLite store {self.describe()}: {exc}")
        error.__cause__ = exc
        return error

    async def now_ms(self) -> int:
        return wall_clock_ms()

    def _read_clock(self, conn: sqlite3.Connection) -> int:
        """The store's clock for a read outside the write lock (due runs, the registry):
        the host's wall clock, which every process sharing the file reads."""
        return wall_clock_ms()

    # -- the claim ---------------------------------------------------------------
    async def claim(self, request: ClaimRequest) -> Claim:
        return await self._write(
            partial(decisions.claim, request=request),
            partial(decisions.claim_precheck, request=request),
        )

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        """The claims queued at once, so they share one transaction (up to ``MAX_BATCH``)."""
        return await self._write_many(
            [
                Decision(
                    partial(decisions.claim, request=request),
                    partial(decisions.claim_precheck, request=request),
                )
                for request in requests
            ]
        )

    # -- lease operations ----------------------------------------------------------
    async def heartbeat(self, leases: Sequence[Lease], lease_ms: int) -> list[bool]:
        if not leases:
            return []

        def decide(conn: sqlite3.Connection, now: int) -> list[bool]:
            return [
                conn.execute(
                    sql.HEARTBEAT,
                    (now + lease_ms, lease.job, lease.slot, lease.attempt, lease.token),
                ).rowcount
                == 1
                for lease in leases
            ]

        return await self._write(decide)

    async def finish(
        self,
        lease: Lease,
        status: Status,
        *,
        error: str | None = None,
        meta: dict[str, Any] | None = None,
        retry_in_ms: int | None = None,
    ) -> bool:
        decide = decisions.finish(lease, status, error=error, meta=meta, retry_in_ms=retry_in_ms)
        return await self._write(decide)

    def finish_in_transaction(
        self, conn: Any, lease: Lease, status: Status, *, meta: dict[str, Any] | None = None
    ) -> bool:
        """The decision of :meth:`finish`, on ``conn`` (a ``sqlite3`` connection to the
        same file) in the transaction it holds open, which already has the write lock
        or takes it here: the decision reads and writes under the caller's lock."""
        return decisions.finish(lease, status, meta=meta)(conn, wall_clock_ms())

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[bool]:
        """The finishes queued at once, so they share one transaction (up to ``MAX_BATCH``)."""
        return await self._write_many(
            [
                Decision(
                    decisions.finish(
                        r.lease, r.status, error=r.error, meta=r.meta, retry_in_ms=r.retry_in_ms
                    )
                )
                for r in requests
            ]
        )

    async def release(self, lease: Lease) -> bool:
        def decide(conn: sqlite3.Connection, now: int) -> bool:
            if decisions.held_state(conn, lease) != Status.RUNNING:
                return False
            # Forgetting the token fences the runner: its later heartbeats and finish fail.
            conn.execute(sql.RELEASE_RUN, (now, lease.job, lease.slot))
            conn.execute(
                sql.INTERRUPT_ATTEMPT, (now, "handed over", lease.job, lease.slot, lease.attempt, 0)
            )
            return True

        return await self._write(decide)

    async def due_runs(self, jobs: Collection[str]) -> list[DueRun]:
        if not jobs:
            return []
        # Due runs are few whatever the number of jobs: read them all (one indexed
        # range) and keep those of ``jobs`` here rather than send every name.
        names = jobs if isinstance(jobs, Set) else frozenset(jobs)

        def read(conn: sqlite3.Connection) -> list[DueRun]:
            now = self._read_clock(conn)
            due: list[DueRun] = []
            for job, slot, attempt, origin, state in conn.execute(sql.DUE_RUNS, (now, now)):
                if job in names:
                    due.append(DueRun(job, slot, attempt, Origin(origin), _REASONS[state]))
            due.sort(key=lambda run: (run.slot, run.job))
            return due

        return await self._call(read)

    async def take_over(self, request: TakeoverRequest) -> Claim:
        return await self._write(partial(decisions.take_over, request=request))

    async def last_scheduled_slot(self, job: str) -> int | None:
        def read(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(sql.LAST_SCHEDULED_SLOT, (job,)).fetchone()
            return None if row is None else int(row[0])

        return await self._call(read)

    # -- history -----------------------------------------------------------------
    async def history(self, query: HistoryQuery) -> list[RunRecord]:
        where, params = history_filter(query, "?")
        text = sql.HISTORY_COLUMNS + where + sql.HISTORY_ORDER
        params.append(max(query.limit, 0))

        def read(conn: sqlite3.Connection) -> list[RunRecord]:
            return [record_from_row(row) for row in conn.execute(text, params)]

        return await self._call(read)

    async def prune(
        self,
        older_than_ms: int,
        *,
        jobs: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> int:
        scope = PruneScope.of(jobs, namespace)
        return await self._write(partial(decisions.prune, older_than_ms=older_than_ms, scope=scope))

    # -- job definitions -------------------------------------------------------------
    async def write_definition(self, job: str, body: str | None, *, expected: int | None) -> int:
        """One decision under the write lock: the counter advances in the write's own
        transaction (see :func:`~anarchon_core.backends.sqlite._decisions.write_definition`)."""
        return await self._write(
            partial(decisions.write_definition, job=job, body=body, expected=expected)
        )

    async def definitions_since(self, version: int) -> list[StoredDefinition]:
        return await self._call(partial(decisions.definitions_since, version=version))

    async def read_definition(self, job: str) -> StoredDefinition | None:
        return await self._call(partial(decisions.read_definition, job=job))

    async def definitions_version(self) -> int:
        return await self._call(decisions.definitions_version)

    # -- operations ----------------------------------------------------------------
    async def set_paused(self, job: str, paused: bool) -> None:
        """Pause or resume ``job``: claims of a paused job record ``paused`` and run nothing."""
        await self._write(lambda conn, _now: conn.execute(sql.SET_PAUSED, (job, int(paused))))

    async def paused_jobs(self) -> set[str]:
        def read(conn: sqlite3.Connection) -> set[str]:
            return {str(job) for (job,) in conn.execute(sql.PAUSED_JOBS)}

        return await self._call(read)

    async def trigger(self, job: str, requested_by: str) -> int:
        return await self._write(partial(decisions.trigger, job=job, requested_by=requested_by))

    async def cancel(self, job: str, slot: int) -> bool:
        return await self._write(partial(decisions.cancel, job=job, slot=slot))

    async def register(self, info: InstanceInfo, ttl_ms: int) -> None:
        text = instance_json(info)  # refused here, before the store, if not JSON
        await self._write(
            partial(decisions.register, instance_id=info.instance_id, info_json=text, ttl_ms=ttl_ms)
        )

    async def unregister(self, instance_id: str) -> None:
        await self._write(lambda conn, _now: conn.execute(sql.UNREGISTER, (instance_id,)))

    async def instances(self) -> list[InstanceInfo]:
        def read(conn: sqlite3.Connection) -> list[InstanceInfo]:
            rows = conn.execute(sql.INSTANCES, (self._read_clock(conn),))
            return [decisions.instance_from_row(row) for row in rows]

        return await self._call(read)


# -- decisions: each runs under the write lock, in a savepoint of a batch ---------------
def _transaction(conn: sqlite3.Connection, decide: Callable[[sqlite3.Connection, int], T]) -> T:
    """One decision alone (the layout, at connect): the lock first, then the clock."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = decide(conn, wall_clock_ms())
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def _create_layout(conn: sqlite3.Connection, _now: int) -> None:
    conn.execute(sql.META_TABLE)
    row = conn.execute(sql.GET_VERSION).fetchone()
    try:
        version = None if row is None else int(row[0])
    except ValueError:
        raise BackendError(f"the SQLite store's schema version {row[0]!r} is unreadable") from None
    if version is not None and version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"the SQLite store holds schema version {version}, newer than version "
            f"{SCHEMA_VERSION} known to this anarchon: upgrade anarchon to use it"
        )
    for statement in sql.SCHEMA:
        conn.execute(statement)
    for table, column, declared in sql.ADDED_COLUMNS:  # a file of an earlier layout
        present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declared}")
    if version is None:
        conn.execute(sql.SET_VERSION, (str(SCHEMA_VERSION),))


def _close_connection(future: Future[sqlite3.Connection]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()
