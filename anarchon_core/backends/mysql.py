"""MySQL/MariaDB on a supplied connection: the core SQLite store's decisions, on the server.

A host that manages MySQL connections (the Django ORM, with its migrations) supplies
one (:class:`~anarchon_core.backends.supply.ConnectionSupply` of a MySQLdb
connection), and every decision of :class:`~anarchon_core.backends.sqlite.SqliteBackend`
runs on it as it is: this class inherits them and replaces the plumbing they run on
(a batch must lock, and read the clock, on the server). The tables are the core's
layout, made by the host (``anarchon_django.models``, binary-collated key columns). They are
written as "read, then write" under a lock that serialises every writer of the store;
on SQLite that is the file's write lock, and here it is one row lock:

- **Atomicity.** Each batch of decisions (:class:`WriteQueue`: the decisions queued
  while the previous batch ran, at most 64) is one InnoDB transaction that first
  takes the store-wide lock, ``SELECT … FROM anarchon_meta WHERE `key` =
  'schema_version' FOR UPDATE``, then runs each decision in a ``SAVEPOINT`` of its own
  (one that fails rolls back alone, as on SQLite), then commits. Every process that
  writes the store takes the same row lock first, so decisions are serialised across
  processes and hosts exactly as SQLite serialises them; a claim that can only lose
  reads the run without the lock (the core's precheck). The counter of job definition
  changes (``anarchon_meta``'s ``definitions_version``) is read and advanced under the
  same lock, in the change's own transaction, so versions are issued in commit order.
  The session is READ COMMITTED and the lock is the transaction's first statement, so
  each read of a decision sees everything committed before it (no REPEATABLE READ
  snapshot taken before the lock can mislead it), and InnoDB takes no gap locks.
- **The clock** is the database server's: the lock statement reads it
  (``SYSDATE(6)``, evaluated once the row lock is granted, not when the statement
  began waiting), in a UTC session so that no daylight-saving hour is ambiguous, and
  later decisions of the batch add the time elapsed since on this host's monotonic
  clock. Every host sharing the database is judged by one clock.
- **Waiting.** A lock wait is bounded by ``innodb_lock_wait_timeout`` (set to the
  store's budget, 5 s); deadlocks (1213) and lock-wait timeouts (1205) roll the batch
  back and repeat it within that budget, then answer
  :class:`~anarchon_core.errors.BackendUnavailable`. On MariaDB the session's
  ``idle_transaction_timeout`` ends a transaction whose process stalls while holding
  the lock (a frozen VM, SIGSTOP), so one stalled instance cannot hold every other
  one off for longer than that.
- **Statements.** The core's SQLite statements are translated once per text
  (:func:`translate`): an explicit MySQL form for each statement whose syntax differs
  (:data:`OVERRIDES`: ``INSERT OR REPLACE``, ``ON CONFLICT … DO UPDATE``, ``IS NOT ?``,
  the column ``key``),
  and for the others the placeholder change alone (``?`` → ``%s``). A statement still
  holding SQLite-only syntax is refused, not sent, so a core change that adds one
  fails loudly (``tests/django/test_orm_mysql.py`` translates every statement).
- **transactional=True.** :meth:`SuppliedMysqlBackend.finish_in_transaction` runs the core's
  finish on the handler's own connection, in its transaction: it takes the same lock
  first (held until that transaction commits, right after), and its reads lock the
  rows they read, so a REPEATABLE READ snapshot of the handler's cannot hide a takeover.

The statements run on the supplied MySQLdb connection (checked and reconnected by the
host before each call), through one plain cursor. The session is set once per
connection (isolation, time zone, lock timeouts); the decisions need
``CLIENT.FOUND_ROWS``, which Django sets (an ``UPDATE`` that matches a row but
changes nothing, a heartbeat within the same millisecond, still counts it). Driver
errors become the contract's (:class:`~anarchon_core.errors.BackendUnavailable` for
operational ones) with the password redacted; a lost connection is left to the supply
to drop (its error passes through) and the call is repeated once on a fresh one (every
store operation is idempotent for its token).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache, partial
from typing import Any, TypeVar, cast

import MySQLdb  # type: ignore[import-untyped]
from MySQLdb.constants import CLIENT  # type: ignore[import-untyped]

from ..backend import SCHEMA_VERSION, Claim, Lease
from ..errors import BackendError, BackendUnavailable, ConfigurationError
from ..records import Status
from ..redact import redact_text
from .sqlite import SqliteBackend
from .sqlite import _decisions as decisions
from .sqlite import _sql as sql
from .sqlite._batch import Decision, Failed, WriteQueue
from .supply import ConnectionSupply

__all__ = ["OVERRIDES", "Connection", "SuppliedMysqlBackend", "translate"]

T = TypeVar("T")

logger = logging.getLogger("anarchon.backends.mysql")

#: How long a batch may wait for the store's lock, in total, before the store counts as
#: unavailable (SQLite's default busy timeout).
DEFAULT_LOCK_TIMEOUT_MS = 5000
#: The shortest ``idle_transaction_timeout`` (MariaDB) of the store's session, in s.
MIN_IDLE_TRANSACTION_S = 10

#: The server's clock in epoch ms. ``SYSDATE`` is read when evaluated (after a row lock
#: is granted), unlike ``NOW()``, fixed when the statement starts; the session is UTC,
#: and ``TIMESTAMPDIFF`` has none of ``UNIX_TIMESTAMP``'s 2038 limit (MariaDB < 11.5).
CLOCK_MS = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6)) DIV 1000"
#: The store-wide lock (the row every writer locks first) and the clock under it.
LOCK = f"SELECT {CLOCK_MS} FROM anarchon_meta WHERE `key` = 'schema_version' FOR UPDATE"
#: The lock's row, where a flush of the tables removed it (the backend's open writes it).
LOCK_ROW = (
    "INSERT INTO anarchon_meta (`key`, value) VALUES ('schema_version', %s) "
    "ON DUPLICATE KEY UPDATE id = id"
)
#: The server's clock alone (no lock): ``now_ms``, the reads judged by the clock.
CLOCK = f"SELECT {CLOCK_MS}"
#: The clock in a session of any time zone, read when the statement starts (after a lock
#: an earlier statement took): on the handler's connection of ``transactional=True``.
UTC_CLOCK = "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000"
#: The store-wide lock alone (:data:`LOCK_ROW` writes its row if a flush removed it).
LOCK_ONLY = "SELECT 1 FROM anarchon_meta WHERE `key` = 'schema_version' FOR UPDATE"
_SAVEPOINT = "anarchon_decision"

#: The MySQL form of each core statement whose SQLite syntax MySQL lacks: ``REPLACE``
#: for ``INSERT OR REPLACE`` (both delete the conflicting row and insert the new one),
#: ``ON DUPLICATE KEY UPDATE c = VALUES(c)`` for ``ON CONFLICT (k) DO UPDATE SET c =
#: excluded.c``, the null-safe ``NOT (x <=> ?)`` for ``x IS NOT ?``, ```key``` quoted
#: (``anarchon_meta``'s column, a reserved word); and the claim precheck's read, which
#: also reads the server's clock (:data:`CLOCKED`). Keyed by the core's text: a core
#: statement that changes no longer matches, and is refused until its MySQL form is
#: updated here.
OVERRIDES: dict[str, str] = {
    sql.RUN_TOKEN: f"SELECT token, {CLOCK_MS} FROM anarchon_runs WHERE job = %s AND slot = %s",
    sql.SET_PAUSED: """
INSERT INTO anarchon_jobs (job, paused) VALUES (%s, %s)
ON DUPLICATE KEY UPDATE paused = VALUES(paused)
""",
    sql.REGISTER: """
INSERT INTO anarchon_instances (instance_id, info, last_seen, expires_at) VALUES (%s, %s, %s, %s)
ON DUPLICATE KEY UPDATE
    info = VALUES(info), last_seen = VALUES(last_seen), expires_at = VALUES(expires_at)
""",
    sql.INSERT_ATTEMPT: """
REPLACE INTO anarchon_attempts
    (job, slot, attempt, origin, status, instance_id, claimed_at, started_at, finished_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
""",
    sql.INSERT_NOTHING_RAN: """
REPLACE INTO anarchon_attempts
    (job, slot, attempt, origin, status, instance_id, claimed_at, started_at, finished_at,
     error)
VALUES (%s, %s, 0, %s, %s, %s, %s, NULL, %s, %s)
""",
    # Job definitions: the counter row of anarchon_meta (read and advanced under the
    # store-wide lock, as every write is) and the job's row.
    sql.DEFINITIONS_VERSION: (
        "SELECT value FROM anarchon_meta WHERE `key` = 'definitions_version'"
    ),
    sql.SET_DEFINITIONS_VERSION: """
INSERT INTO anarchon_meta (`key`, value) VALUES ('definitions_version', %s)
ON DUPLICATE KEY UPDATE value = VALUES(value)
""",
    sql.WRITE_DEFINITION: """
INSERT INTO anarchon_jobs (job, paused, version, definition) VALUES (%s, 0, %s, %s)
ON DUPLICATE KEY UPDATE version = VALUES(version), definition = VALUES(definition)
""",
    sql.PRUNE_ATTEMPTS: sql.PRUNE_ATTEMPTS.replace(
        "slot IS NOT ? AND slot IS NOT ?", "NOT (slot <=> %s) AND NOT (slot <=> %s)"
    ).replace("?", "%s"),
    sql.PRUNE_RUNS: sql.PRUNE_RUNS.replace(
        "slot IS NOT ? AND slot IS NOT ?", "NOT (slot <=> %s) AND NOT (slot <=> %s)"
    ).replace("?", "%s"),
}
#: Core statements whose MySQL form reads the server's clock as one more, last, column
#: (the decisions read the columns before it): a claim that the precheck settles without
#: the lock answers with the store's clock in the same round trip.
CLOCKED = frozenset({sql.RUN_TOKEN})
#: Statements the backend builds from a core prefix (history: columns, filter, order):
#: ``meta`` is read as text, which MySQL 8's ``JSON`` type would send as bytes.
PREFIX_OVERRIDES: dict[str, str] = {
    sql.HISTORY_COLUMNS: sql.HISTORY_COLUMNS.replace(
        "error, meta", "error, CAST(meta AS CHAR) AS meta"
    ),
}

#: SQLite syntax that must not reach MySQL (it would fail, or mean something else),
#: looked for outside string literals.
_SQLITE_ONLY = re.compile(
    r"\bINSERT\s+OR\b|\bON\s+CONFLICT\b|\bexcluded\.|\bIS\s+NOT\s+(\?|%s)|"
    r"\bBEGIN\s+IMMEDIATE\b|(?<![`\w])key(?![`\w])|\?",
    re.IGNORECASE,
)
_LITERAL = re.compile(r"'[^']*'")

#: MySQL error codes a batch repeats: a deadlock (InnoDB rolled the transaction back)
#: and a lock wait timeout (only the statement was rolled back; the batch rolls back).
DEADLOCK, LOCK_WAIT_TIMEOUT = 1213, 1205
_RETRYABLE = frozenset({DEADLOCK, LOCK_WAIT_TIMEOUT})
#: Errors of a connection that is gone: server gone away / lost during a query, killed
#: (MariaDB), disconnected for inactivity (MySQL 8), server shutting down.
_LOST = frozenset({2006, 2013, 2055, 1927, 4031, 1053})
_MIN_RETRIES = 3


# -- statements ----------------------------------------------------------------------------
@lru_cache(maxsize=512)
def translate(text: str) -> str:
    """The MySQL form of a core SQLite statement (cached: once per statement text).

    :raises BackendError: the text still holds SQLite-only syntax (a core statement
        added or changed without a MySQL form in :data:`OVERRIDES`).
    """
    mysql = OVERRIDES.get(text)
    if mysql is None:
        for prefix, replacement in PREFIX_OVERRIDES.items():
            if text.startswith(prefix):
                text = replacement + text[len(prefix) :]
                break
        mysql = _placeholders(text)
    problem = _SQLITE_ONLY.search(_LITERAL.sub("''", mysql).replace("DUPLICATE KEY", ""))
    if problem is not None:
        raise BackendError(
            f"the MySQL store has no form for this SQLite statement ({problem.group(0)!r} "
            f"is SQLite syntax): {' '.join(text.split())}"
        )
    return mysql


def _placeholders(text: str) -> str:
    """``?`` → ``%s`` outside string literals; ``%`` → ``%%`` (MySQLdb formats with ``%``)."""
    out: list[str] = []
    quoted = False
    for char in text:
        if char == "'":
            quoted = not quoted
        if char == "%":
            out.append("%%")
        elif char == "?" and not quoted:
            out.append("%s")
        else:
            out.append(char)
    return "".join(out)


class Result:
    """The rows and row count of one statement (buffered: the cursor is reused at once)."""

    __slots__ = ("_next", "_rows", "rowcount")

    def __init__(self, rows: Sequence[tuple[Any, ...]], rowcount: int) -> None:
        self._rows = rows
        self._next = 0
        self.rowcount = rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._next = self._rows[self._next :], len(self._rows)
        return list(rows)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.fetchall())


class Connection:
    """A MySQLdb connection as the core's SQLite decisions use theirs: ``execute(sql, params)``.

    ``execute`` translates the statement (:func:`translate`) and answers a
    :class:`Result`; the rest is the batch's plumbing (transactions, the lock, the clock).
    With ``locking_reads`` every ``SELECT`` is sent ``FOR UPDATE``: a locking read sees
    the latest committed row whatever the transaction's isolation level (a REPEATABLE
    READ snapshot of the caller's may predate a takeover), for ``transactional=True``.
    """

    __slots__ = ("_cursor", "_locking", "clock_read", "raw")

    def __init__(self, raw: Any, *, locking_reads: bool = False) -> None:
        self.raw = raw
        self._cursor = raw.cursor()
        self._locking = locking_reads
        #: The server's clock as the last :data:`CLOCKED` statement that found a row read it.
        self.clock_read: int | None = None

    def execute(self, text: str, params: Sequence[Any] = ()) -> Result:
        mysql = translate(text)
        if self._locking and mysql.lstrip().upper().startswith("SELECT"):
            mysql = f"{mysql.rstrip()} FOR UPDATE"
        result = self._run(mysql, tuple(params))
        if text in CLOCKED and result.rowcount:
            self.clock_read = int(result._rows[0][-1])
        return result

    def _run(self, text: str, params: tuple[Any, ...] | None = None) -> Result:
        cursor = self._cursor
        cursor.execute(text, params)
        rows = cursor.fetchall() if cursor.description is not None else ()
        return Result(rows, cursor.rowcount)

    def begin(self) -> None:
        self._run("START TRANSACTION")

    def commit(self) -> None:
        self.raw.commit()

    def rollback(self) -> None:
        """Roll back whatever is open; on a connection already broken, nothing to do."""
        with contextlib.suppress(MySQLdb.Error):
            self.raw.rollback()

    def savepoint(self) -> None:
        # Setting it again replaces the previous one: no RELEASE (a round trip) needed.
        self._run(f"SAVEPOINT {_SAVEPOINT}")

    def rollback_to_savepoint(self) -> None:
        self._run(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")

    def lock(self) -> int:
        """Take the store-wide lock (in a transaction); the server's clock once held."""
        row = self._run(LOCK).fetchone()
        if row is None:  # the row is gone (a flush): inserting it locks it
            self._run(LOCK_ROW, (str(SCHEMA_VERSION),))
            row = self._run(LOCK).fetchone()
        assert row is not None
        return int(row[0])

    def clock(self) -> int:
        """The server's clock in epoch ms (no lock)."""
        row = self._run(CLOCK).fetchone()
        assert row is not None
        return int(row[0])

    @property
    def as_sqlite(self) -> sqlite3.Connection:
        """This connection, typed as the decisions expect: they only call ``execute`` and
        use the result's ``fetchone``, ``fetchall``, ``rowcount`` and iteration."""
        return cast(sqlite3.Connection, self)


# -- the store ---------------------------------------------------------------------------------
class SuppliedMysqlBackend(SqliteBackend):
    """:class:`SqliteBackend`'s decisions on a supplied MySQLdb connection.

    ``secrets`` are URLs whose passwords never show in an error (the host's settings,
    see :func:`~anarchon_core.redact.redact_text`). ``lock_timeout_ms`` bounds how long a
    batch waits for the store's lock (retries included) before the store counts as
    unavailable.
    """

    name = "mysql"

    def __init__(
        self,
        supply: ConnectionSupply[Any],
        *,
        secrets: Sequence[str] = (),
        lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
    ) -> None:
        super().__init__(supply.describe() or "mysql", busy_timeout_ms=lock_timeout_ms)
        self._mysql = supply
        self._secrets = list(secrets)
        self._session: Connection | None = None

    @property
    def local_to(self) -> str | None:
        return None  # a server: any host that reaches it shares the store

    def describe(self) -> str:
        return self._mysql.describe()

    # -- life cycle --------------------------------------------------------------
    async def open(self) -> None:
        """Prepare the session (and check it) on the worker's thread; start the queue."""
        await self._read(lambda _db: None)
        self._queue = WriteQueue(self._mysql.executor, self._execute_batch)

    async def close(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            await queue.drain()
        self._session = None

    # -- the worker thread ---------------------------------------------------------
    async def _call(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """The core's reads (history, paused jobs …): on the worker, without the lock."""
        if self._queue is None:
            raise BackendError(f"{self.describe()} is not open: await open() first")
        return await self._read(lambda db: op(db.as_sqlite))

    async def _read(self, op: Callable[[Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._mysql.executor, self._run, op)

    def _execute_batch(self, batch: list[Decision[Any]]) -> list[Any]:
        return self._run(partial(self._batch, batch))

    def _run(self, op: Callable[[Connection], T]) -> T:
        """``op`` on the supplied connection (on its thread); once more if it was lost."""
        for retry in (False, True):
            try:
                return self._mysql.run(partial(self._on_session, op))
            except BackendUnavailable as exc:
                if retry or not _lost(exc):
                    raise
                logger.warning(
                    "connection to %s lost (%s); retrying on a fresh connection",
                    self.describe(),
                    exc,
                )
        raise AssertionError("unreachable")  # pragma: no cover

    def _on_session(self, op: Callable[[Connection], T], raw: Any) -> T:
        db = self._session_of(raw)
        try:
            return op(db)
        except MySQLdb.Error as exc:
            if _lost(exc):  # as it is: the supply drops the connection
                raise
            raise self._driver_error(exc) from exc

    def _session_of(self, raw: Any) -> Connection:
        """The :class:`Connection` of the supplied driver connection; a new one is set up
        first (the host has just connected it, or connected it again)."""
        session = self._session
        if session is not None and session.raw is raw:
            return session
        if not raw.client_flag & CLIENT.FOUND_ROWS:
            raise ConfigurationError(
                f"{self.describe()}: the connection lacks CLIENT.FOUND_ROWS, which Django "
                f"sets: keep it in OPTIONS['client_flag'] (heartbeats compare matched rows)"
            )
        session = Connection(raw)
        wait_s = max(1, math.ceil(self.busy_timeout_ms / 1000))
        session._run("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        session._run(
            "SET SESSION time_zone = '+00:00', SESSION innodb_lock_wait_timeout = %s", (wait_s,)
        )
        if "mariadb" in str(raw.get_server_info()).lower():
            idle_s = max(MIN_IDLE_TRANSACTION_S, 2 * wait_s)
            session._run("SET SESSION idle_transaction_timeout = %s", (idle_s,))
        self._session = session
        return session

    def _driver_error(self, exc: BaseException) -> BackendError:
        """The driver error as the contract names it, its text without the password."""
        kind = BackendUnavailable if isinstance(exc, MySQLdb.OperationalError) else BackendError
        return kind(f"{self.describe()}: {redact_text(str(exc), *self._secrets)}")

    # -- a batch: one transaction under the store's lock ---------------------------
    def _batch(self, batch: list[Decision[Any]], db: Connection) -> list[Any]:
        """Settle ``batch`` (on the worker): prechecks without the lock, the rest under it.

        An answer a precheck settled (a claim that can only lose) carries the server's
        clock, which its read returned beside the run (:data:`CLOCKED`; the core's
        precheck stamps its host's clock).
        """
        answers: list[Any] = [None] * len(batch)
        locked: list[int] = []
        for i, decision in enumerate(batch):
            answer = None
            if decision.precheck is not None:
                db.clock_read = None
                try:
                    answer = decision.precheck(db.as_sqlite)
                except MySQLdb.Error as exc:
                    if _lost(exc):
                        raise
                    answer = None  # only a shortcut: the decision under the lock settles it
                if isinstance(answer, Claim):
                    now = db.clock() if db.clock_read is None else db.clock_read
                    answer = Claim(answer.outcome, answer.attempt, now)
            if answer is None:
                locked.append(i)
            else:
                answers[i] = answer
        if locked:
            self._locked(db, batch, locked, answers)
        return answers

    def _locked(
        self, db: Connection, batch: list[Decision[Any]], locked: list[int], answers: list[Any]
    ) -> None:
        """:meth:`_transaction`, repeated on deadlocks and lock waits within the budget."""
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        delay, tries = 0.002, 0
        while True:
            try:
                self._transaction(db, batch, locked, answers)
                return
            except MySQLdb.OperationalError as exc:
                tries += 1
                code = _code(exc)
                instant = code == DEADLOCK and tries <= _MIN_RETRIES
                if code in _RETRYABLE and (instant or time.monotonic() < deadline):
                    time.sleep(random.uniform(delay / 2, delay))
                    delay = min(delay * 2, 0.1)
                    continue
                raise

    def _transaction(
        self, db: Connection, batch: list[Decision[Any]], locked: list[int], answers: list[Any]
    ) -> None:
        """One transaction: the lock first, then each decision at its own moment; commit.

        Raises only what ends the whole transaction (the lock, the commit, a deadlock, a
        lost connection): nothing is committed then, and the batch may be repeated.
        """
        db.begin()
        try:
            clock = db.lock()
            held = time.monotonic_ns()
            alone = len(locked) == 1
            for i in locked:
                now = clock + (time.monotonic_ns() - held) // 1_000_000
                answers[i] = self._decide(db, batch[i], now, alone=alone)
            db.commit()
        except BaseException:
            db.rollback()
            raise

    def _decide(self, db: Connection, decision: Decision[Any], now: int, *, alone: bool) -> Any:
        """One decision in its savepoint: one that fails rolls back alone and reports it.

        A decision alone in its batch needs no savepoint: if it fails, the whole
        transaction rolls back (the commit that follows has nothing to do).
        """
        if not alone:
            db.savepoint()
        try:
            return decision.decide(db.as_sqlite, now)
        except Exception as exc:
            if isinstance(exc, MySQLdb.OperationalError) and (
                _code(exc) in _RETRYABLE or _lost(exc)
            ):
                raise  # the transaction is gone (deadlock) or must be repeated whole
            if alone:
                db.rollback()
            else:
                db.rollback_to_savepoint()
            if isinstance(exc, MySQLdb.Error):
                return Failed(self._driver_error(exc))
            return Failed(exc)

    # -- transactional=True ------------------------------------------------------------
    def finish_in_transaction(
        self, conn: Any, lease: Lease, status: Status, *, meta: dict[str, Any] | None = None
    ) -> bool:
        """The decision of :meth:`finish` on ``conn`` (the handler's MySQLdb connection to
        the store's database), inside the transaction it holds open.

        It takes the store-wide lock first, as every writer of the store does, held until
        the caller's transaction ends (the finish is its last statement: at once); then
        the core's finish decision runs at the server's clock, its reads locking
        (:class:`Connection`), so they see the run as committed whatever the caller's
        isolation level.
        """
        db = Connection(conn, locking_reads=True)
        try:
            if db._run(LOCK_ONLY).fetchone() is None:
                db._run(LOCK_ROW, (str(SCHEMA_VERSION),))
            row = db._run(UTC_CLOCK).fetchone()
            assert row is not None
            return decisions.finish(lease, status, meta=meta)(db.as_sqlite, int(row[0]))
        except MySQLdb.Error as exc:
            raise self._driver_error(exc) from exc

    # -- where the core reads its host's clock: the server's here --------------------
    async def now_ms(self) -> int:
        return await self._read(Connection.clock)

    def _read_clock(self, conn: sqlite3.Connection) -> int:
        """The server's clock (the core's reads of due runs and the registry use it)."""
        return cast(Connection, conn).clock()


# -- helpers -------------------------------------------------------------------------------------
def _code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _lost(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) says the connection is gone."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, MySQLdb.InterfaceError) or (
            isinstance(exc, MySQLdb.OperationalError) and _code(exc) in _LOST
        ):
            return True
        exc, seen = exc.__cause__, seen + 1
    return False
