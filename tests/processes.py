"""The process harness of every real-process test: children, their events, their locks.

Children (core workers, ``manage.py anarchon run``, uvicorn/gunicorn servers, beats)
append one JSON object per line to an events file; tests wait on it with bounded polls
(:func:`wait_until`), signal children (``SIGKILL`` crashes, ``SIGSTOP`` freezes at a
moment they hold no store lock: :func:`freeze_unlocked`) and always end them.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from anarchon_core import backend_from_url
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.backends.sqlite import SqliteBackend

Events = list[dict[str, Any]]


def wait_until(
    check: Callable[[], Any], timeout: float, what: str, logs: Callable[[], str] = str
) -> Any:
    """Poll ``check`` until it returns something true; its value. Fails after ``timeout``
    seconds naming ``what``, with the children's logs."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; logs:\n{logs()}")
        time.sleep(0.02)


def read_events(path: Path) -> Events:
    """The events written so far (none before the file exists)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def starts(events: Events, job: str | None = None) -> Events:
    return [e for e in events if e["e"] == "start" and (job is None or e["job"] == job)]


class Children:
    """Named child processes writing to one events file and one log file each, in ``tmp``.

    Subclasses start them; this ends, signals and observes them.
    """

    tmp: Path
    procs: dict[str, subprocess.Popen[bytes]]

    @property
    def events_path(self) -> Path:
        return self.tmp / "events.jsonl"

    def log_path(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    def events(self) -> Events:
        return read_events(self.events_path)

    def wait_for(self, predicate: Callable[[Events], Any], timeout: float, what: str) -> Any:
        return wait_until(lambda: predicate(self.events()), timeout, what, self.logs)

    def instance_of(self, pid: int) -> str:
        return next(name for name, p in self.procs.items() if p.pid == pid)

    def signal(self, name: str, sig: signal.Signals) -> None:
        self.procs[name].send_signal(sig)

    def stop_all(self, timeout: float = 15) -> None:
        """SIGTERM every child (a frozen one is thawed first); SIGKILL after ``timeout``."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def kill_all(self) -> None:
        """SIGKILL every child still running, and reap them all."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.tmp.glob("*.log"))
        )


# -- store locks: never freeze a child inside its own store write ------------------------
def sqlite_locked(path: str, wait_s: float = 0) -> bool:
    """Whether another process holds the write lock of the SQLite file at ``path``."""
    with closing(sqlite3.connect(path, timeout=wait_s)) as conn:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return True
        conn.rollback()
        return False


def store_locked(url: str, job: str, slot: int) -> bool:
    """Whether another process holds a lock that a takeover of ``(job, slot)`` would wait on."""
    backend = backend_from_url(url)
    if isinstance(backend, SqliteBackend):
        return sqlite_locked(backend.path)
    if isinstance(backend, PostgresBackend):
        runs = sql.Identifier(backend.schema, backend.table_prefix + "runs")
        with psycopg.connect(backend.conninfo, connect_timeout=5) as conn:
            try:
                conn.execute(
                    sql.SQL(
                        "SELECT 1 FROM {} WHERE job = %s AND slot = %s FOR UPDATE NOWAIT"
                    ).format(runs),
                    [job, slot],
                )
            except psycopg.errors.LockNotAvailable:
                return True
            conn.rollback()
            return False
    return False


def freeze_unlocked(proc: subprocess.Popen[bytes], name: str, locked: Callable[[], bool]) -> None:
    """SIGSTOP ``proc`` at a moment ``locked()`` says it holds no store lock.

    Frozen inside one of its own short store writes, it would block the backups'
    takeover until resumed (SQLite has one writer; PostgreSQL locks the rows an UPDATE
    in flight touches): the test would then wait for a takeover that cannot happen.
    Redis holds no client locks.
    """
    for _ in range(20):
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.05)
        if not locked():
            return
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"{name} held a store lock at every one of 20 tries")
