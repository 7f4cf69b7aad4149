"""The SQLite backend's worker thread: group commit, busy retries, error conversion.

A burst of claims (every job due at the same second) would otherwise queue on the
backend's single worker thread as one ``BEGIN IMMEDIATE`` … ``COMMIT`` each, and the
commits, not the decisions, dominate. :class:`WriteQueue` sends whatever was queued
while the previous transaction ran as one transaction, at most :data:`MAX_BATCH`
decisions so that other processes sharing the file never wait long for the write
lock. Each decision runs inside its own ``SAVEPOINT``: one that fails rolls back only
itself and reports its own error, while the others commit. For its caller a decision
is still one round trip, answered when its transaction commits.

A decision may bring a *precheck*: a read made before the write lock is taken that
can settle the answer alone (a claim of a run someone else holds), so that losers
never take the lock.

A transaction that cannot start or commit because another process holds the file is
repeated within the backend's ``busy_timeout_ms``; an error that ends a whole
transaction is the error of each of its decisions, as none of them was committed.

The answers of a batch are handed back to the event loop at most
:data:`SETTLE_PER_TURN` per loop iteration: every answer wakes a caller that then
runs (a won claim starts its run, a finish reports its metrics), and 64 of them in
one iteration would hold the loop for milliseconds while the application sharing it
(a web server's requests) waits. In smaller portions the loop polls its sockets
between them.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from concurrent.futures import Future as ThreadFuture
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

from ...backend import wall_clock_ms
from ...errors import BackendError

__all__ = [
    "MAX_BATCH",
    "SETTLE_PER_TURN",
    "Decision",
    "Failed",
    "WriteQueue",
    "execute_batch",
    "retry_busy",
    "run_batch",
]

T = TypeVar("T")

#: Most decisions per transaction: bounds how long the write lock is held at once.
MAX_BATCH = 64
#: Most answers handed to their callers per event-loop iteration.
SETTLE_PER_TURN = 8
_SAVEPOINT = "anarchon_decision"
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6
_MIN_BUSY_RETRIES = 3


@dataclass(frozen=True, slots=True)
class Decision(Generic[T]):
    """One atomic decision: ``decide(conn, now)`` under the write lock.

    ``precheck(conn)``, if given, runs first without the write lock and returns the
    final answer, or ``None`` to let ``decide`` settle it. It must only ever answer
    what ``decide`` would answer at the moment of its read.
    """

    decide: Callable[[sqlite3.Connection, int], T]
    precheck: Callable[[sqlite3.Connection], T | None] | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """The error one decision of a batch ended with (in place of its answer)."""

    error: BaseException


def run_batch(
    conn: sqlite3.Connection,
    decisions: Sequence[Decision[Any]],
    convert: Callable[[sqlite3.Error], BackendError],
) -> list[Any]:
    """Settle ``decisions`` in one transaction; one answer or :class:`Failed` each.

    Raises only what ends the whole transaction (the lock, the commit, or a decision
    whose error made SQLite roll everything back): nothing is committed then, so the
    caller may repeat the batch or fail every decision of it.
    """
    answers: list[Any] = [None] * len(decisions)
    locked: list[int] = []
    for i, decision in enumerate(decisions):
        answer = None
        if decision.precheck is not None:
            try:
                answer = decision.precheck(conn)
            except sqlite3.Error:
                answer = None  # only a shortcut: the decision under the lock settles it
        if answer is None:
            locked.append(i)
        else:
            answers[i] = answer
    if not locked:
        return answers
    conn.execute("BEGIN IMMEDIATE")
    try:
        for i in locked:
            answers[i] = _in_savepoint(conn, decisions[i], convert)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return answers


def _in_savepoint(
    conn: sqlite3.Connection,
    decision: Decision[Any],
    convert: Callable[[sqlite3.Error], BackendError],
) -> Any:
    """Take the clock once the lock is held: each decision sees its own moment."""
    conn.execute(f"SAVEPOINT {_SAVEPOINT}")
    try:
        answer = decision.decide(conn, wall_clock_ms())
    except Exception as exc:
        if not conn.in_transaction:  # e.g. an I/O error: SQLite rolled back everything
            raise
        conn.execute(f"ROLLBACK TO {_SAVEPOINT}")
        conn.execute(f"RELEASE {_SAVEPOINT}")
        return Failed(convert(exc) if isinstance(exc, sqlite3.Error) else exc)
    conn.execute(f"RELEASE {_SAVEPOINT}")
    return answer


def execute_batch(
    conn: sqlite3.Connection,
    batch: list[Decision[Any]],
    *,
    timeout_ms: int,
    convert: Callable[[sqlite3.Error], BackendError],
) -> list[Any]:
    """:func:`run_batch` as the worker thread runs it: repeated while the file is busy."""
    try:
        return retry_busy(
            partial(run_batch, conn, batch, convert), timeout_ms=timeout_ms, convert=convert
        )
    except BackendError as exc:
        return [Failed(_clone(exc)) for _ in batch]


def retry_busy(
    op: Callable[[], T], *, timeout_ms: int, convert: Callable[[sqlite3.Error], BackendError]
) -> T:
    """Run ``op``, repeating it on busy answers for up to ``timeout_ms``; convert errors.

    SQLite's busy handler already waits up to the timeout for a lock; some answers
    come back busy without waiting (WAL recovery, the journal-mode switch of a
    concurrent first open), so they are retried here within the same budget.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    delay, tries = 0.002, 0
    while True:
        try:
            return op()
        except sqlite3.OperationalError as exc:
            tries += 1
            if _is_busy(exc) and (tries <= _MIN_BUSY_RETRIES or time.monotonic() < deadline):
                time.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, 0.1)
                continue
            raise convert(exc) from exc
        except sqlite3.Error as exc:
            raise convert(exc) from exc


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    message = str(exc)
    return "locked" in message or "busy" in message


def _clone(exc: BackendError) -> BackendError:
    """A copy per waiting caller: one exception object raised in many tasks is confusing."""
    clone = type(exc)(*exc.args)
    clone.__cause__ = exc.__cause__
    return clone


@dataclass(eq=False, slots=True)
class _Queued:
    decision: Decision[Any]
    future: asyncio.Future[Any]


class WriteQueue:
    """Batches the decisions of one event loop onto one worker thread, one batch at a time.

    ``execute`` runs in the worker thread with a batch's decisions and returns one
    answer or :class:`Failed` per decision. A decision submitted while no batch is in
    flight leaves at once (a lone claim waits for nothing); those submitted while one
    is in flight leave together when it is done. A caller cancelled before its batch
    leaves is dropped from it; one cancelled later only loses the answer, as with any
    call already running in a thread.
    """

    def __init__(
        self, executor: Executor, execute: Callable[[list[Decision[Any]]], list[Any]]
    ) -> None:
        self._executor = executor
        self._execute = execute
        self._queued: deque[_Queued] = deque()
        self._in_flight: asyncio.Future[list[Any]] | None = None
        #: Answers not yet handed to their callers, in order, and whether a later loop
        #: iteration will hand over the next portion.
        self._answered: deque[tuple[_Queued, Any]] = deque()
        self._settling: asyncio.Handle | None = None

    def submit(self, decision: Decision[T]) -> asyncio.Future[T]:
        """Queue ``decision``; the future gets its answer or its error."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queued.append(_Queued(decision, future))
        if self._in_flight is None:
            self._send_next()
        return future

    def submit_many(self, decisions: Sequence[Decision[Any]]) -> list[asyncio.Future[Any]]:
        """Queue ``decisions`` together, in order: they leave in one batch (while they fit
        in :data:`MAX_BATCH`), rather than the first alone and the rest after it."""
        loop = asyncio.get_running_loop()
        queued = [_Queued(decision, loop.create_future()) for decision in decisions]
        self._queued.extend(queued)
        if queued and self._in_flight is None:
            self._send_next()
        return [q.future for q in queued]

    async def drain(self) -> None:
        """Wait until every decision queued so far is settled (not cancellable midway)."""
        while self._in_flight is not None:
            await asyncio.wait({self._in_flight})
        if self._settling is not None:  # closing: hand over the rest at once
            self._settling.cancel()
        self._settle(len(self._answered))

    def _send_next(self) -> None:
        while True:
            batch: list[_Queued] = []
            while self._queued and len(batch) < MAX_BATCH:
                queued = self._queued.popleft()
                if not queued.future.done():  # its caller gave up before its turn
                    batch.append(queued)
            if not batch:
                self._in_flight = None
                return
            try:
                sent: ThreadFuture[list[Any]] = self._executor.submit(
                    self._execute, [q.decision for q in batch]
                )
            except RuntimeError as exc:  # the executor was shut down by an interrupted close
                error = BackendError(f"the SQLite store was closed: {exc}")
                self._answer(batch, [Failed(error)] * len(batch))
                continue
            self._in_flight = asyncio.wrap_future(sent)
            self._in_flight.add_done_callback(partial(self._done, batch))
            return

    def _done(self, batch: list[_Queued], in_flight: asyncio.Future[list[Any]]) -> None:
        try:
            answers = in_flight.result()
        except BaseException as exc:  # execute() reports errors per decision: a bug, or ^C
            error = exc if isinstance(exc, Exception) else BackendError(repr(exc))
            answers = [Failed(error)] * len(batch)
        self._send_next()  # the store works on the next batch while these are handed over
        self._answer(batch, answers)

    def _answer(self, batch: list[_Queued], answers: list[Any]) -> None:
        """Hand ``answers`` to their callers: a first portion now, the rest in later turns."""
        self._answered.extend(zip(batch, answers, strict=True))
        if self._settling is None:
            self._settle(SETTLE_PER_TURN)

    def _settle(self, count: int) -> None:
        self._settling = None
        answered = self._answered
        while answered and count > 0:
            queued, answer = answered.popleft()
            if queued.future.done():  # cancelled while its batch ran: nobody waits for it
                continue
            count -= 1
            if isinstance(answer, Failed):
                queued.future.set_exception(answer.error)
            else:
                queued.future.set_result(answer)
        if answered:  # the next portion after the loop has polled its sockets once
            loop = asyncio.get_running_loop()
            self._settling = loop.call_soon(self._settle, SETTLE_PER_TURN)
