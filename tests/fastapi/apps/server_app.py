"""The FastAPI app the multi-worker tests serve with uvicorn or gunicorn.

Configured by the JSON in ``$ANARCHON_FASTAPI_SPEC``: ``backend``, ``events`` (a file
every process appends JSON lines to, ``O_APPEND`` keeping lines whole), ``scheduler``
(keyword arguments), ``jobs`` (``name``, ``every``, ``sleep_s``, ``kind``: ``sync``,
``async`` or ``fail``, options), ``grace_ms`` and ``allow_actions``. Each worker process
imports this module and is one instance.

The app's own lifespan opens a "pool" and records when; every handler records whether
the pool was open, so the tests see the order of start-up and shut-down.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response

from anarchon_core import RunContext, Scheduler
from anarchon_fastapi import SchedulerDep, lifespan, router

SPEC: dict[str, Any] = json.loads(os.environ["ANARCHON_FASTAPI_SPEC"])
EVENTS: str = SPEC["events"]


def emit(**event: Any) -> None:
    event.update(pid=os.getpid(), t=time.time())
    fd = os.open(EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(event) + "\n").encode())
    finally:
        os.close(fd)


class Pool:
    """Stands in for the app's database pool."""

    open = False


scheduler = Scheduler(SPEC["backend"], **SPEC.get("scheduler", {}))


def make_handler(sleep_s: float, kind: str) -> Any:
    if kind == "fail":  # every run fails, so the history holds errors

        def failing(ctx: RunContext) -> None:
            emit(e="start", origin=str(ctx.origin), job=ctx.job, slot=ctx.slot, attempt=1)
            raise ValueError(f"run {ctx.slot} of {ctx.job} failed on purpose")

        return failing
    if kind == "async":  # cancelled at the end of the grace period, and awaited

        async def async_handler(ctx: RunContext) -> None:
            info = {"job": ctx.job, "slot": ctx.slot, "attempt": ctx.attempt}
            emit(e="start", origin=str(ctx.origin), pool=Pool.open, **info)
            try:
                await asyncio.sleep(sleep_s)
            except asyncio.CancelledError:
                emit(e="end", cancelled=ctx.cancel_reason or "cancelled", **info)
                raise
            emit(e="end", cancelled=None, **info)

        return async_handler

    # A sync handler is signalled through ctx; at shut-down its thread is abandoned, so
    # its "end" may not be written before the process exits.
    def handler(ctx: RunContext) -> None:
        info = {"job": ctx.job, "slot": ctx.slot, "attempt": ctx.attempt}
        emit(e="start", origin=str(ctx.origin), pool=Pool.open, **info)
        cancelled = ctx.wait(sleep_s) if sleep_s else False
        emit(e="end", cancelled=ctx.cancel_reason if cancelled else None, **info)

    return handler


for job in SPEC["jobs"]:
    options = {k: v for k, v in job.items() if k not in ("name", "every", "sleep_s", "kind")}
    handler = make_handler(job.get("sleep_s", 0), job.get("kind", "sync"))
    scheduler.every(job["name"], job["every"], handler, **options)


@asynccontextmanager
async def app_lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    Pool.open = True
    emit(e="pool-open", scheduler_running=scheduler.running)
    try:
        yield {"pool": Pool}
    finally:
        emit(e="pool-close", scheduler_running=scheduler.running)
        Pool.open = False


anarchon = lifespan(scheduler, inner=app_lifespan, grace_ms=SPEC.get("grace_ms"))


@asynccontextmanager
async def observed(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    """Around anarchon's lifespan only to record, in the events file, when it is done."""
    async with anarchon(app) as state:
        emit(e="ready", running=scheduler.running, instance=scheduler.instance_id)
        yield state
        emit(e="stopping")
    emit(e="stopped", running=scheduler.running, state=hasattr(app.state, "anarchon"))


app = FastAPI(lifespan=observed)
# A test server on loopback: the read API is public, and actions (when the spec enables
# them) are served without authentication, said as loudly as the router asks.
actions = SPEC.get("allow_actions", False)
app.include_router(
    router(allow_actions=actions, public=True, insecure_no_auth=actions), prefix="/anarchon"
)


@app.middleware("http")
async def tag_worker(request: Request, call_next: Any) -> Response:
    response: Response = await call_next(request)
    response.headers["X-Worker-Pid"] = str(os.getpid())
    return response


@app.get("/whoami")
async def whoami(s: SchedulerDep, request: Request) -> dict[str, Any]:
    return {"pid": os.getpid(), "instance": s.instance_id, "pool": request.state.pool.open}
