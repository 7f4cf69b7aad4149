"""Serve ``apps/server_app.py`` with real uvicorn or gunicorn workers, and observe them.

Each server runs in its own session (process group), so teardown kills the master and
every worker it forked, whatever the test did to them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from chrome import free_port
from processes import read_events, wait_until

APPS = Path(__file__).with_name("apps")

#: Fast settings: 1 s slots, 200 ms heartbeats, 1 s leases. A runner fences itself
#: when no heartbeat is acknowledged for lease − heartbeat: 800 ms leaves room for a
#: store round trip slowed by a worker respawning on the same two cores (at 600 ms, a
#: takeover attempt once fenced itself that way in CI).
FAST = {"heartbeat_ms": 200, "lease_ms": 1000, "jitter_ms": 200}


@dataclass
class Server:
    kind: str
    tmp: Path
    port: int
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.time)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def events_path(self) -> Path:
        return self.tmp / "events.jsonl"

    def events(self) -> list[dict[str, Any]]:
        return read_events(self.events_path)

    def log(self) -> str:
        path = self.tmp / "server.log"
        return path.read_text(errors="replace")[-6000:] if path.exists() else ""

    def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], Any], timeout: float, what: str
    ) -> Any:
        return wait_until(lambda: predicate(self.events()), timeout, what, self.log)

    def ready_pids(self) -> set[int]:
        """Workers whose scheduler runs now (ready and not stopping)."""
        ready: set[int] = set()
        for e in self.events():
            if e["e"] == "ready":
                ready.add(e["pid"])
            elif e["e"] == "stopping":
                ready.discard(e["pid"])
        return ready

    def wait_ready(self, workers: int, timeout: float = 30) -> set[int]:
        self.wait_for(lambda ev: len(self.ready_pids()) >= workers, timeout, "workers ready")
        pids = self.ready_pids()
        deadline = time.monotonic() + timeout
        while True:  # the port answers once every worker is ready
            try:
                httpx.get(f"{self.base}/anarchon/api/health", timeout=2)
                return pids
            except httpx.TransportError:
                assert time.monotonic() < deadline, self.log()
                time.sleep(0.1)

    def terminate(self, timeout: float = 20) -> int:
        """SIGTERM the master and wait for it; returns its exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        """A request on a fresh connection, so that the kernel may pick any worker."""
        headers = {"Connection": "close", **kwargs.pop("headers", {})}
        return httpx.get(f"{self.base}{path}", headers=headers, timeout=10, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Connection": "close", **kwargs.pop("headers", {})}
        return httpx.post(f"{self.base}{path}", headers=headers, timeout=10, **kwargs)


def command(kind: str, port: int, workers: int, extra: list[str]) -> list[str]:
    if kind == "uvicorn":
        return [
            sys.executable,
            "-m",
            "uvicorn",
            "server_app:app",
            "--app-dir",
            str(APPS),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--no-access-log",
            *extra,
        ]
    if kind == "gunicorn":
        return [
            sys.executable,
            "-m",
            "gunicorn",
            "server_app:app",
            "--chdir",
            str(APPS),
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--worker-class",
            "uvicorn_worker.UvicornWorker",
            "--graceful-timeout",
            "10",
            *extra,
        ]
    raise ValueError(kind)


@contextmanager
def serve(
    kind: str,
    tmp: Path,
    *,
    backend: str,
    jobs: list[dict[str, Any]],
    workers: int = 3,
    extra: list[str] | None = None,
    **spec: Any,
) -> Iterator[Server]:
    """Start ``kind`` with ``workers`` workers; kill the whole process group at the end."""
    port = free_port()
    config = {
        "backend": backend,
        "events": str(tmp / "events.jsonl"),
        "scheduler": {**FAST, **spec.pop("scheduler", {})},
        "jobs": jobs,
        **spec,
    }
    env = {
        **os.environ,
        "ANARCHON_FASTAPI_SPEC": json.dumps(config),
        "ANARCHON_ENABLED": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
    }
    log = open(tmp / "server.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        command(kind, port, workers, extra or []),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp,
        start_new_session=True,
    )
    server = Server(kind, tmp, port, proc)
    try:
        yield server
    finally:
        with suppress(ProcessLookupError):  # the workers, even after their master died
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log.close()


def slots_of(events: list[dict[str, Any]], job: str, what: str = "start") -> list[int]:
    return [e["slot"] for e in events if e["e"] == what and e["job"] == job]
