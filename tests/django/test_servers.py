"""The in-process start under real servers: the scheduler in every web worker.

The test project (``tests/django_project``) served on the test database by

* ``uvicorn django_project.asgi:application --workers 2``, the application wrapped in
  :func:`anarchon_django.asgi.with_scheduler` (the lifespan scope starts and stops it);
* ``gunicorn`` with the hooks of :mod:`anarchon_django.gunicorn` (``post_worker_init``
  / ``worker_exit``) and the workers it supports: ``sync``, and ``gthread`` with
  ``--preload`` (the scheduler built in the master: each worker gets its own id);
* ``gunicorn -k uvicorn_worker.UvicornWorker --preload`` and gunicorn's own ``-k
  asgi`` on the ASGI application (the wrapper under gunicorn, as
  :mod:`anarchon_django.asgi` documents).

Each worker is an instance on the ORM store (``django://default``). What is asserted:
both workers registered as instances (distinct pids), every slot of a 1 s job ran
exactly once across them, a request is served; then SIGTERM to the server: the run in
flight of a long job is handed over (recorded ``interrupted``, "handed over", by the
worker that held it), every worker left the instance registry (its scheduler stopped),
the server exits 0 within the grace period plus a margin, and its log has no traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import procs
import pytest
from processes import starts
from procs import child_env
from test_processes import grid_slots, history

from anarchon_core import Status
from anarchon_django.backend import DjangoBackend

T = TypeVar("T")

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

GRACE_MS = 300
LEASE_MS = 6_000  # a takeover after expiry would show as attempt 2 after 6 s: never here
#: How long SIGTERM → exit may take: the grace period, the hand-over and the servers'
#: own shutdown (gunicorn's arbiter wakes up every second), on a loaded 2-core machine.
EXIT_BOUND_S = GRACE_MS / 1000 + 8
JOBS = [
    {"name": "tick", "every": "1s", "orm": True},
    {"name": "long", "every": "2s", "sleep_s": 60},  # one run at a time (overlap: skip)
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gunicorn_has(setting: str) -> bool:
    """Whether the installed gunicorn knows ``setting`` (newer ones add options)."""
    try:
        from gunicorn.config import KNOWN_SETTINGS  # type: ignore[import-untyped]
    except ImportError:
        return False
    return any(s.name == setting for s in KNOWN_SETTINGS)


# Newer gunicorns open a control socket in ~/.gunicorn from the master: none from tests.
GUNICORN = [
    "-m",
    "gunicorn",
    "--workers",
    "2",
    *(["--no-control-socket"] if _gunicorn_has("control_socket_disable") else []),
]
HOOKS = ["-c", "python:django_project.gunicorn_conf"]
SERVERS = {
    "uvicorn": ["-m", "uvicorn", "django_project.asgi:application", "--workers", "2"],
    "gunicorn-sync": [*GUNICORN, *HOOKS, "django_project.wsgi:application"],
    # --preload: the scheduler is built in the master; each worker needs its own id.
    "gunicorn-gthread-preload": [
        *GUNICORN,
        *HOOKS,
        "-k",
        "gthread",
        "--threads",
        "2",
        "--preload",
        "django_project.wsgi:application",
    ],
    "gunicorn-uvicorn-worker-preload": [
        *GUNICORN,
        "-k",
        "uvicorn_worker.UvicornWorker",
        "--preload",
        "django_project.asgi:application",
    ],
    "gunicorn-asgi": [*GUNICORN, "-k", "asgi", "django_project.asgi:application"],
}
#: What each server needs beyond the test dependencies' minimum versions.
NEEDS = {"gunicorn-asgi": ("asgi_lifespan", "gunicorn's own ASGI worker (-k asgi)")}


def _command(server: str, port: int) -> list[str]:
    if server == "uvicorn":
        bind = ["--host", "127.0.0.1", "--port", str(port)]
    else:
        bind = ["--bind", f"127.0.0.1:{port}", "--graceful-timeout", "20"]
    return [sys.executable, *SERVERS[server], *bind]


@contextmanager
def serve(server: str, tmp: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path, int]]:
    """The server on the test database; killed (its whole process group) at the end."""
    events, log_path, port = tmp / "events.jsonl", tmp / "server.log", _free_port()
    env = child_env(
        ANARCHON_TEST_DJANGO_NAME=procs.database_name(),
        ANARCHON_TEST_BACKEND="django://default",
        ANARCHON_TEST_JOBS=json.dumps(JOBS),
        ANARCHON_TEST_SETTINGS=json.dumps({"GRACE_MS": GRACE_MS, "LEASE_MS": LEASE_MS}),
        ANARCHON_TEST_EVENTS=str(events),
    )
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            _command(server, port),
            env=env,
            cwd=procs.TESTS,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its workers share its process group: killed together
        )
    try:
        yield proc, events, log_path, port
    finally:
        # Never leave a worker connected when pytest-django drops the test database.
        _kill_group(proc.pid)
        proc.wait()


def _kill_group(pgid: int, timeout: float = 5) -> None:
    """SIGKILL what is left of the server's process group; wait until it is gone."""
    deadline = time.monotonic() + timeout
    try:
        os.killpg(pgid, signal.SIGKILL)
        while time.monotonic() < deadline:
            os.killpg(pgid, 0)
            time.sleep(0.02)
    except ProcessLookupError:
        pass


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _instances(runner: asyncio.Runner, backend: DjangoBackend) -> list[tuple[str, int]]:
    """The registry: (instance id, pid) of every running instance."""
    return [(i.instance_id, i.pid) for i in runner.run(backend.instances())]


def _wait(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    log: Path,
    proc: subprocess.Popen[bytes],
) -> T:
    """``predicate()`` once it is truthy; fails with the server's log after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what} (server exit {proc.poll()}); "
        f"log:\n{log.read_text(errors='replace')[-6000:]}"
    )


@pytest.mark.parametrize("server", list(SERVERS))
def test_scheduler_in_each_worker(
    server: str, tmp_path: Path, backend: DjangoBackend, runner: asyncio.Runner
) -> None:
    if server in NEEDS and not _gunicorn_has(NEEDS[server][0]):
        pytest.skip(f"this gunicorn has no {NEEDS[server][1]}")
    with serve(server, tmp_path) as (proc, events_path, log, port):

        def two_workers() -> list[tuple[str, int]]:
            found = _instances(runner, backend)
            return found if len({pid for _, pid in found}) == 2 else []

        registered = _wait(
            two_workers,
            45,
            "both workers to register as instances",
            log,
            proc,
        )
        ready = time.time()
        pids = {pid for _, pid in registered}
        assert proc.pid not in pids  # workers, never the server's master process
        assert len({name for name, _ in registered}) == 2, registered
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=10) as r:
            assert r.status == 200
        _wait(
            lambda: time.time() - ready > 4.5 and starts(_events(events_path), "long"),
            30,
            "a few slots and a long run in flight",
            log,
            proc,
        )
        until = time.time() - 0.5
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            code = proc.wait(EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{server} still running {EXIT_BOUND_S}s after SIGTERM:\n{log.read_text()}")
        took = time.monotonic() - sent
        left = _instances(runner, backend)
        events, text = _events(events_path), log.read_text(errors="replace")
    assert code == 0, text
    assert "Traceback" not in text, text
    assert "failed" not in text.lower(), text  # e.g. "lifespan.startup.failed"
    assert took < EXIT_BOUND_S
    assert left == [], f"instances still registered after the stop: {left}"

    ran = Counter(e["slot"] for e in starts(events, "tick"))
    assert not {s: n for s, n in ran.items() if n > 1}, f"tick ran twice: {ran}"
    expected = grid_slots(ready + 0.5, until, 1000)
    assert len(expected) >= 3
    assert not [s for s in expected if s not in ran], f"missed slots of {sorted(ran)}"
    assert {e["pid"] for e in events} <= pids  # every run in one of the two workers

    first_long = starts(events, "long")[0]
    assert first_long["attempt"] == 1
    records = [r for r in history("django://default", "long") if r["slot"] == first_long["slot"]]
    attempts = {r["attempt"]: (r["status"], r["error"]) for r in records}
    assert attempts[1] == (Status.INTERRUPTED.value, "handed over"), records
    # The other worker, stopping too, may have taken it over for a moment: handed over.
    assert all(status != Status.RUNNING.value for status, _ in attempts.values()), records
