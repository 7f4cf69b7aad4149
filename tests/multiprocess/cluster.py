"""Start, signal and observe worker processes for the multi-process tests."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from anarchon_core import backend_from_url
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.records import HistoryQuery, RunRecord

WORKER = Path(__file__).with_name("worker.py")


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


@dataclass
class Cluster:
    """A set of worker processes sharing one store URL and one events file."""

    backend: str
    tmp: Path
    scheduler: dict[str, Any]
    jobs: list[dict[str, Any]]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: Workers dump their Prometheus samples and stats at stop (see :meth:`metrics`).
    dump_metrics: bool = False

    @property
    def events_path(self) -> Path:
        return self.tmp / "events.jsonl"

    def start(self, instance_id: str, **overrides: Any) -> subprocess.Popen[bytes]:
        spec = {
            "backend": self.backend,
            "instance_id": instance_id,
            "events": str(self.events_path),
            "scheduler": {**self.scheduler, **overrides},
            "jobs": self.jobs,
        }
        if self.dump_metrics:
            spec["metrics_out"] = str(self.metrics_path(instance_id))
        env = {**os.environ, "ANARCHON_TEST_SPEC": json.dumps(spec), "PYTHONUNBUFFERED": "1"}
        log = open(self.tmp / f"{instance_id}.log", "ab")  # noqa: SIM115 - closed by the child
        proc = subprocess.Popen([sys.executable, str(WORKER)], env=env, stdout=log, stderr=log)
        log.close()
        self.procs[instance_id] = proc
        return proc

    def start_all(self, count: int, prefix: str = "w") -> None:
        for n in range(count):
            self.start(f"{prefix}{n}")
        self.wait_for(lambda ev: sum(e["e"] == "ready" for e in ev) >= count, 20, "workers ready")

    def events(self) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        lines = self.events_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], Any], timeout: float, what: str
    ) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = predicate(self.events())
            if result:
                return result
            time.sleep(0.02)
        raise AssertionError(
            f"timed out after {timeout}s waiting for {what}; logs:\n" + self.logs()
        )

    def instance_of(self, pid: int) -> str:
        return next(name for name, p in self.procs.items() if p.pid == pid)

    def signal(self, instance_id: str, sig: signal.Signals) -> None:
        self.procs[instance_id].send_signal(sig)

    def freeze(self, instance_id: str, job: str, slot: int) -> None:
        """SIGSTOP ``instance_id`` at a moment it holds no lock on the run of ``slot``."""
        locked = partial(store_locked, self.backend, job, slot)
        freeze_unlocked(self.procs[instance_id], instance_id, locked)

    def stop_all(self, timeout: float = 15) -> None:
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

    def metrics_path(self, instance_id: str) -> Path:
        return self.tmp / f"{instance_id}.metrics.json"

    def metrics(self, instance_id: str) -> dict[str, Any] | None:
        """What a stopped worker dumped: ``{"stats": {...}, "samples": [...]}``, or None."""
        path = self.metrics_path(instance_id)
        return json.loads(path.read_text()) if path.exists() else None

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text()[-4000:]}" for p in sorted(self.tmp.glob("*.log"))
        )

    def history(self, job: str | None = None) -> list[RunRecord]:
        async def read() -> list[RunRecord]:
            backend = backend_from_url(self.backend)
            await backend.open()
            try:
                return await backend.history(HistoryQuery(job=job, limit=100_000))
            finally:
                await backend.close()

        return asyncio.run(read())


@contextmanager
def cluster(
    backend: str,
    tmp: Path,
    *,
    jobs: list[dict[str, Any]],
    dump_metrics: bool = False,
    **scheduler: Any,
) -> Iterator[Cluster]:
    c = Cluster(backend, tmp, scheduler, jobs, dump_metrics=dump_metrics)
    try:
        yield c
    finally:
        c.stop_all()


def starts(events: list[dict[str, Any]], job: str | None = None) -> list[dict[str, Any]]:
    return [e for e in events if e["e"] == "start" and (job is None or e["job"] == job)]
