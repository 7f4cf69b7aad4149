"""Real processes: three ``celery beat -S anarchon_celery:Scheduler`` and one worker.

Every slot of an every-second entry in a ~6 s window must be executed exactly once, with
the deterministic task id, and SIGKILL of one beat in the middle changes nothing.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import redis
from celery_alias_dist import write_alias_dist

import anarchon_celery
from anarchon_celery import job_name

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CELERY = [sys.executable, "-m", "celery", "-A", "celery_beat_app"]
RECORDS_URL = "redis://127.0.0.1:6379/14"
NAMESPACE = "anarchontest"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _sleep_until(ms: int) -> None:
    time.sleep(max(0.0, (ms - _now_ms()) / 1000))


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def records():
    client = redis.Redis.from_url(RECORDS_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip("Redis is not running at 127.0.0.1:6379")
    key = f"anarchon-celery-test:{uuid.uuid4().hex}"
    yield client, key
    client.delete(key)
    client.close()


def test_three_beats_send_every_slot_exactly_once(tmp_path: Path, records):
    client, key = records
    queue = f"anarchon-celery-test-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), str(write_alias_dist(tmp_path))]),
        "ANARCHON_TEST_BROKER": "redis://127.0.0.1:6379/15",
        "ANARCHON_TEST_QUEUE": queue,
        "ANARCHON_TEST_STORE": f"sqlite:///{tmp_path / 'anarchon.sqlite3'}",
        "ANARCHON_TEST_RECORDS": RECORDS_URL,
        "ANARCHON_TEST_RECORD_KEY": key,
    }
    processes: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def spawn(name: str, *args: str) -> subprocess.Popen[bytes]:
        log = tmp_path / f"{name}.log"
        logs.append(log)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*CELERY, *args], cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        processes.append(proc)
        return proc

    try:
        spawn("worker", "worker", "-P", "solo", "-l", "warning", "-Q", queue)
        beats = [
            spawn(
                f"beat{i}",
                "beat",
                "-S",
                "anarchon" if i else "anarchon_celery:Scheduler",  # alias and full path
                "-l",
                "info",
                "-s",
                str(tmp_path / f"beat{i}-schedule"),
            )
            for i in range(3)
        ]
        beat_logs = logs[1:]
        _wait_for(
            lambda: all("anarchon started" in log.read_text() for log in beat_logs),
            30,
            "three beats to start",
        )
        start = math.ceil(_now_ms() / 1000) * 1000 + 1000
        end = start + 6000
        _sleep_until(start + 3600)  # mid-second: between sends, never during one
        beats[0].send_signal(signal.SIGKILL)
        _sleep_until(end + 1500)
        for beat in beats[1:]:
            beat.send_signal(signal.SIGTERM)
        every = f"{NAMESPACE}:{job_name('every second', NAMESPACE)}"
        minute = f"{NAMESPACE}:each-minute"
        wanted = {(every, slot) for slot in range(start, end + 1, 1000)}
        wanted |= {(minute, s) for s in range(math.ceil(start / 60000) * 60000, end + 1, 60000)}

        def rows() -> list[dict[str, object]]:
            return [json.loads(raw) for raw in client.lrange(key, 0, -1)]

        _wait_for(
            lambda: wanted <= {(r["job"], r["slot"]) for r in rows()}, 15, "the worker to run"
        )
        time.sleep(1.0)  # a duplicate would arrive right behind
        seen = [r for r in rows() if (r["job"], r["slot"]) in wanted]
        counts = Counter((r["job"], r["slot"]) for r in seen)
        assert counts == Counter({run: 1 for run in wanted}), counts
        for row in seen:
            assert row["task_id"] == anarchon_celery.task_id_for(str(row["job"]), int(row["slot"]))
            assert row["attempt"] == 1
        assert beats[0].wait(5) == -signal.SIGKILL
        senders = [log.read_text().count("sending every second") for log in beat_logs]
        print(f"exactly once: {len(wanted)} runs, {len(seen)} executions; sent per beat {senders}")
    finally:
        for proc in processes:
            if proc.poll() is None:
                proc.terminate()
        for proc in processes:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        broker = redis.Redis.from_url(env["ANARCHON_TEST_BROKER"])
        leftovers = [k for k in broker.keys("*") if queue.encode() in k]
        if leftovers:
            broker.delete(*leftovers)
        broker.close()
