"""Under a real ``uvicorn`` that configures no logging for the app, anarchon's lines
show with the server's own."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

APP = """
from fastapi import FastAPI
from anarchon_core import Scheduler
from anarchon_fastapi import lifespan

scheduler = Scheduler("sqlite:///logs.sqlite3", instance_id="web-1", jitter_ms=0)

@scheduler.every("tick", "1s")
async def tick(ctx):
    pass

app = FastAPI(lifespan=lifespan(scheduler))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_anarchon_logs_with_uvicorns_own_lines(tmp_path: Path) -> None:
    (tmp_path / "logapp.py").write_text(APP)
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "logapp:app", "--port", str(free_port())],
            cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "run started" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Application startup complete" in text, text  # uvicorn's own line
    assert "anarchon started: 1 job(s)" in text, text
    assert "[tick@" in text and "run started" in text, text
    assert "stopped" in text or "Application shutdown complete" in text, text
