"""The FastAPI app that ``benchmarks.fastapi_latency`` serves with ``uvicorn --workers``.

A trivial JSON endpoint, ``GET /ping``, and ``FastAPI(lifespan=lifespan(scheduler))``
with the embedded default store (``Scheduler()``: ``sqlite:///anarchon.sqlite3`` in
the server's working directory, a fresh temp directory per run). Configured by
environment variables, read when each worker imports this module:

* ``ANARCHON_BENCH_JOBS``: how many jobs ``every(ANARCHON_BENCH_EVERY)`` the scheduler
  holds (``1`` for the baseline, ``1000`` for the load), each with an async no-op
  handler;
* ``ANARCHON_BENCH_EVERY``: their interval (default ``10s``);
* ``ANARCHON_BENCH_JITTER_MS``: the scheduler's ``jitter_ms`` (unset: the default);
* ``ANARCHON_BENCH_DIR``: where each worker writes ``ready-<pid>`` once its scheduler
  runs and appends ``runs-<pid>`` with the number of handler calls when it stops.

Run as a script (``python -m benchmarks._fastapi_app``), it is the scheduler alone, in
a process of its own beside the web workers (which then run with one job): the
deployment the FastAPI guide suggests when the app's p99 matters. It writes
``scheduler-ready-<pid>`` and ``scheduler-runs-<pid>`` and stops on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from anarchon_core import RunContext, Scheduler
from anarchon_fastapi import lifespan

JOBS = int(os.environ.get("ANARCHON_BENCH_JOBS", "1"))
EVERY = os.environ.get("ANARCHON_BENCH_EVERY", "10s")
JITTER = os.environ.get("ANARCHON_BENCH_JITTER_MS", "")
BENCH_DIR = Path(os.environ.get("ANARCHON_BENCH_DIR", "."))

options: dict[str, Any] = {"jitter_ms": int(JITTER)} if JITTER else {}
scheduler = Scheduler(**options)  # $ANARCHON_BACKEND is unset: the embedded SQLite default
runs = 0


async def noop(ctx: RunContext) -> None:
    global runs
    runs += 1


for i in range(JOBS):
    scheduler.every(f"bench.{i:04d}", EVERY, noop)

anarchon = lifespan(scheduler)
PID = os.getpid()


@asynccontextmanager
async def observed(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    """``lifespan(scheduler)`` itself, plus a marker once the scheduler runs, so that the
    benchmark starts its load only when every worker is up (nothing else is added)."""
    async with anarchon(app) as state:
        (BENCH_DIR / f"ready-{PID}").write_text(str(len(scheduler.jobs)))
        yield state
    (BENCH_DIR / f"runs-{PID}").write_text(str(runs))


app = FastAPI(lifespan=observed)


@app.get("/ping")
async def ping() -> dict[str, Any]:
    """A small amount of work: a dict built and serialised, as a typical JSON endpoint."""
    return {"pid": PID, "ok": True, "items": [{"i": i, "sq": i * i} for i in range(10)]}


async def _scheduler_alone() -> None:
    """The scheduler without the app, until SIGTERM (``anarchon run`` would do the same)."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await scheduler.start()
    (BENCH_DIR / f"scheduler-ready-{PID}").write_text(str(len(scheduler.jobs)))
    await stop.wait()
    await scheduler.stop()
    (BENCH_DIR / f"scheduler-runs-{PID}").write_text(str(runs))


if __name__ == "__main__":
    asyncio.run(_scheduler_alone())
