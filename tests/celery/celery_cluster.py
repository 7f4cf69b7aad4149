"""Real ``celery beat`` / ``celery worker`` processes for the process tests.

:class:`CeleryCluster` spawns Celery processes of ``celery_beat_app`` (each in its own
session, so a ``worker -B`` and its embedded beat die together), reads back what the
``record`` task wrote, and kills every process group at the end.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery_alias_dist import write_alias_dist
from processes import wait_until

import anarchon_celery
from anarchon_celery import job_name

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CELERY = [sys.executable, "-m", "celery", "-A", "celery_beat_app"]
RECORDS_URL = "redis://127.0.0.1:6379/14"
REDIS_BROKER = "redis://127.0.0.1:6379/15"
NAMESPACE = "anarchontest"
EVERY_SECOND = f"{NAMESPACE}:{job_name('every second', NAMESPACE)}"
EVERY_TWO = f"{NAMESPACE}:every-two-seconds"
EACH_MINUTE = f"{NAMESPACE}:each-minute"
EVERY_TWENTY = f"{NAMESPACE}:every-twenty-seconds"
FAST = ("--without-mingle", "--without-gossip")

Run = tuple[str, int]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def sleep_until(ms: int) -> None:
    time.sleep(max(0.0, (ms - now_ms()) / 1000))


def next_second(lead_ms: int = 1000) -> int:
    """A whole second at least ``lead_ms`` from now (the first slot of a test window)."""
    return math.ceil(now_ms() / 1000) * 1000 + lead_ms


def grid(job: str, start: int, end: int, every_ms: int) -> set[Run]:
    """Every slot of an ``every_ms`` epoch grid in ``[start, end]``."""
    first = math.ceil(start / every_ms) * every_ms
    return {(job, slot) for slot in range(first, end + 1, every_ms)}


@dataclass
class Verdict:
    """Executions of the wanted runs: once each, plus takeover re-sends (attempt >= 2)."""

    runs: int
    executions: int
    once: int
    takeovers: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.runs} runs, {self.executions} executions, {self.once} executed once, "
            f"{len(self.takeovers)} second record(s) from takeovers (same task id, attempt >= 2)"
        )


def check_exactly_once(rows: list[dict[str, Any]], wanted: set[Run]) -> Verdict:
    """Every wanted run executed; a second record only as a same-id takeover re-send."""
    by_run: dict[Run, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        run = (str(row["job"]), int(row["slot"]))
        if run in wanted:
            by_run[run].append(row)
    missing = sorted(wanted - set(by_run))
    assert not missing, f"never executed: {missing}"
    verdict = Verdict(runs=len(wanted), executions=sum(map(len, by_run.values())), once=0)
    for (job, slot), seen in by_run.items():
        expected = anarchon_celery.task_id_for(job, slot)
        assert all(row["task_id"] == expected for row in seen), seen
        assert len(seen) <= 2, f"{job}@{slot} executed {len(seen)} times: {seen}"
        if len(seen) == 1:
            verdict.once += 1
            continue
        attempts = sorted(int(row["attempt"]) for row in seen)
        assert attempts[-1] >= 2, f"{job}@{slot} executed twice without a takeover: {seen}"
        verdict.takeovers.append(max(seen, key=lambda row: int(row["attempt"])))
    return verdict


class CeleryCluster:
    """Celery processes of ``celery_beat_app`` sharing one broker, queue and store."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        broker: str,
        store: str,
        two_seconds: bool,
        clean_broker: bool,
        twenty_seconds: bool = False,
    ) -> None:
        self.tmp_path = tmp_path
        self.clean_broker = clean_broker
        self.queue = f"anarchon-celery-test-{uuid.uuid4().hex[:8]}"
        self.key = f"anarchon-celery-test:{uuid.uuid4().hex}"
        self.records = redis.Redis.from_url(RECORDS_URL)
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), str(write_alias_dist(tmp_path))]),
            "ANARCHON_TEST_BROKER": broker,
            "ANARCHON_TEST_QUEUE": self.queue,
            "ANARCHON_TEST_STORE": store,
            "ANARCHON_TEST_RECORDS": RECORDS_URL,
            "ANARCHON_TEST_RECORD_KEY": self.key,
        }
        if two_seconds:
            self.env["ANARCHON_TEST_TWO_SECONDS"] = "1"
        if twenty_seconds:
            self.env["ANARCHON_TEST_TWENTY_SECONDS"] = "1"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: dict[str, Path] = {}

    def spawn(
        self, name: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = self.tmp_path / f"{name}.log"
        self.logs[name] = log
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*CELERY, *args],
                cwd=HERE,
                env={**self.env, **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: worker -B's beat child dies too
            )
        self.processes.append(proc)
        return proc

    def beat(
        self, name: str, scheduler: str = "anarchon", env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        schedule = str(self.tmp_path / f"{name}-schedule")
        return self.spawn(name, "beat", "-S", scheduler, "-l", "info", "-s", schedule, env=env)

    def worker(
        self, name: str, *extra: str, queues: tuple[str, ...] = ()
    ) -> subprocess.Popen[bytes]:
        """A solo worker of the cluster's queue (and ``queues``: names that contain the
        cluster's queue name, so that :meth:`close` drops them from the broker)."""
        consumed = ",".join((self.queue, *queues))
        return self.spawn(
            name, "worker", "-P", "solo", "-Q", consumed, "-n", f"{name}@%h", *FAST, *extra
        )

    def embedded(self, name: str) -> subprocess.Popen[bytes]:
        """``worker -B --scheduler anarchon_celery:Scheduler``: executes and runs a beat."""
        schedule = str(self.tmp_path / f"{name}-schedule")
        return self.worker(
            name, "-B", "--scheduler", "anarchon_celery:Scheduler", "-s", schedule, "-l", "info"
        )

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def wait_started(self, names: list[str], timeout: float = 30) -> None:
        wait_until(
            lambda: all("anarchon started" in self.log(n) for n in names),
            timeout,
            f"{', '.join(names)} to start",
        )

    def rows(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.records.lrange(self.key, 0, -1)]

    def executed(self) -> set[Run]:
        return {(str(r["job"]), int(r["slot"])) for r in self.rows()}

    def wait_executed(self, wanted: set[Run], timeout: float = 15) -> list[dict[str, Any]]:
        wait_until(lambda: wanted <= self.executed(), timeout, "the worker to run every slot")
        time.sleep(1.0)  # a duplicate would arrive right behind
        return self.rows()

    def sends(self, *names: str) -> Counter[str]:
        """``sending ... as <task id>`` log lines per task id, in the named (or all) logs."""
        sent: Counter[str] = Counter()
        for name in names or tuple(self.logs):
            for line in self.log(name).splitlines():
                if "sending " in line and " as " in line:
                    sent[line.rsplit(" as ", 1)[1].strip()] += 1
        return sent

    def close(self) -> None:
        """Stop every process group (SIGCONT, SIGTERM, then SIGKILL) and drop test state."""
        try:
            for proc in self.processes:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
                    if proc.poll() is None:
                        os.killpg(proc.pid, signal.SIGTERM)
            for proc in self.processes:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        finally:
            for proc in self.processes:  # leftovers such as worker -B's beat child
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        self.records.delete(self.key)
        self.records.close()
        broker = self.env["ANARCHON_TEST_BROKER"]
        if not self.clean_broker:
            return
        if broker.startswith("redis://"):
            client = redis.Redis.from_url(broker)
            leftovers = [k for k in client.keys("*") if self.queue.encode() in k]
            if leftovers:
                client.delete(*leftovers)
            client.close()
        else:
            from kombu import Connection

            with contextlib.suppress(Exception), Connection(broker) as conn:
                conn.default_channel.queue_delete(self.queue)


def task_ids(runs: set[Run]) -> set[str]:
    """The deterministic task ids of ``runs``."""
    return {anarchon_celery.task_id_for(job, slot) for job, slot in runs}


def in_window(sent: Counter[str], runs: set[Run]) -> Counter[str]:
    """The send counts of ``runs`` only (zero counts omitted)."""
    ids = task_ids(runs)
    return Counter({task_id: n for task_id, n in sent.items() if task_id in ids})


@contextlib.contextmanager
def celery_cluster(
    tmp_path: Path,
    *,
    broker: str = REDIS_BROKER,
    store: str | None = None,
    two_seconds: bool = False,
    twenty_seconds: bool = False,
    clean_broker: bool = True,
) -> Iterator[CeleryCluster]:
    cluster = CeleryCluster(
        tmp_path,
        broker=broker,
        store=store or f"sqlite:///{tmp_path / 'anarchon.sqlite3'}",
        two_seconds=two_seconds,
        twenty_seconds=twenty_seconds,
        clean_broker=clean_broker,
    )
    try:
        yield cluster
    finally:
        cluster.close()
