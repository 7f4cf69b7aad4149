"""A FastAPI service whose periodic jobs run exactly once across all its workers.

Run it with several workers (each one is an anarchon instance; the store decides which
worker runs each slot):

    uvicorn app:app --workers 3 --app-dir examples/fastapi_app
    # or: gunicorn app:app --chdir examples/fastapi_app -w 3 -k uvicorn_worker.UvicornWorker

then open http://127.0.0.1:8000/anarchon/ for the dashboard. The store is
``$ANARCHON_BACKEND`` (e.g. ``postgresql://…`` or ``redis://…``), else the embedded
SQLite file ``anarchon.sqlite3`` in the working directory, which the workers of one
host share. With ``ANARCHON_DASHBOARD_TOKEN`` set, the API needs ``Authorization:
Bearer <token>`` (open the page as ``/anarchon/#token=<token>``) and the dashboard's
pause/resume/run-now/cancel buttons are enabled; without it the API is read-only and
public (``router(public=True)``).
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request

from anarchon_core import RunContext, Scheduler
from anarchon_fastapi import SchedulerDep, lifespan, router

logging.basicConfig(level=logging.INFO)
log = logging.getLogger("example")

scheduler = Scheduler()  # $ANARCHON_BACKEND, else sqlite:///anarchon.sqlite3


class Cache:
    """Stands in for a resource the app opens at start-up (a database pool, a client)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.refreshes = 0


@scheduler.every("cache.refresh", "30s")
async def refresh(ctx: RunContext) -> None:
    # Handlers run after the app's own start-up, so the app's resources exist here.
    cache: Cache = app.state.cache
    cache.refreshes += 1
    log.info("refreshing the cache: slot %s, attempt %s", ctx.scheduled_at, ctx.attempt)


@scheduler.cron("reports.daily", "0 7 * * *", tz="Europe/Athens")
def daily_report(ctx: RunContext) -> None:
    # A plain ``def`` runs in a worker thread; it may poll ctx.cancelled while it works.
    log.info("writing the daily report for %s", ctx.scheduled_at.date())


@asynccontextmanager
async def app_lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.cache = Cache()  # open pools, clients … here
    try:
        yield
    finally:
        del app.state.cache  # … and close them here, after the scheduler stopped


app = FastAPI(title="anarchon example", lifespan=lifespan(scheduler, inner=app_lifespan))

TOKEN = os.environ.get("ANARCHON_DASHBOARD_TOKEN")


def bearer_token(request: Request) -> None:
    """Header auth: browsers never add it on their own, so actions need no CSRF token.

    Compared as bytes: ``hmac.compare_digest`` raises on non-ASCII text, which any
    client can send.
    """
    assert TOKEN is not None
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode("utf-8", "surrogatepass"), TOKEN.encode()
    ):
        raise HTTPException(401, "give Authorization: Bearer <token>")


if TOKEN:  # the API and the actions behind the token
    app.include_router(
        router(allow_actions=True, dependencies=[Depends(bearer_token)]), prefix="/anarchon"
    )
else:  # read-only, for anyone who reaches the app: keep it on a private network
    app.include_router(router(public=True), prefix="/anarchon")


@app.get("/")
async def index(scheduler: SchedulerDep, request: Request) -> dict[str, Any]:
    return {
        "instance": scheduler.instance_id,
        "jobs": sorted(scheduler.jobs),
        "cache refreshes in this worker": request.app.state.cache.refreshes,
        "dashboard": "/anarchon/",
    }
