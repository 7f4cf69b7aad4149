"""The lifespan that runs a :class:`~anarchon_core.Scheduler` inside a FastAPI app."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request

from anarchon_core import ConfigurationError, Scheduler
from anarchon_core.web.endpoints import DashboardAPI

__all__ = ["STATE_KEY", "SchedulerDep", "get_scheduler", "lifespan"]

logger = logging.getLogger("anarchon.fastapi")

#: The name of the scheduler in ``app.state`` and in the lifespan state (``request.state``).
STATE_KEY = "anarchon"
#: Where the lifespan keeps the routers' API handlers, by ``allow_actions``.
APIS_KEY = "anarchon_apis"
NOT_RUNNING = (
    "anarchon is not running in this app: give FastAPI(lifespan=lifespan(scheduler)) "
    "(or APIRouter(lifespan=…)) from anarchon_fastapi"
)

#: How long the hand-over itself (lease release, leaving the registry, closing the
#: store) may take after ``grace_ms`` before the lifespan stops waiting for it. Leases
#: that were not released then simply expire, and a backup takes the run over.
HANDOVER_MARGIN_S = 3.0
#: The server loggers whose handlers anarchon's records go through when nothing else
#: is configured: uvicorn's (also under gunicorn's uvicorn workers) and hypercorn's.
SERVER_LOGGERS = ("uvicorn.error", "hypercorn.error")

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[Mapping[str, Any] | None]]


def lifespan(
    scheduler: Scheduler, *, inner: Lifespan | None = None, grace_ms: int | None = None
) -> Callable[[FastAPI], AbstractAsyncContextManager[dict[str, Any]]]:
    """A lifespan for ``FastAPI(lifespan=…)`` (or ``APIRouter(lifespan=…)``) that runs
    ``scheduler``.

    Start-up: the app's own lifespan ``inner`` first (so that the pools the handlers use
    exist), then ``scheduler.start()``. The scheduler is then ``app.state.anarchon`` and
    ``request.state.anarchon`` (the lifespan state, merged with ``inner``'s). Shut-down:
    ``scheduler.stop(grace_ms)`` first (stop claiming, wait up to ``grace_ms`` for runs
    in flight, hand the rest over to a backup at once), bounded by ``grace_ms`` plus
    :data:`HANDOVER_MARGIN_S`, then ``inner``'s shut-down; ``app.state.anarchon`` is
    removed. ``grace_ms`` defaults to the scheduler's (10 s unless set).

    The routers' API reads the scheduler's store: while the scheduler runs, its open
    backend as lent; a disabled one (``ANARCHON_ENABLED=0``) never opens it, so the
    first request does and the lifespan closes it.

    Starting a scheduler that already runs in this process (two apps, or the lifespan
    given twice) raises :class:`~anarchon_core.SchedulerStateError`.
    """
    if not isinstance(scheduler, Scheduler):
        raise ConfigurationError(
            f"lifespan({scheduler!r}) is not valid: give an anarchon_core.Scheduler"
        )
    if grace_ms is not None and (
        isinstance(grace_ms, bool) or not isinstance(grace_ms, int) or grace_ms < 0
    ):
        raise ConfigurationError(
            f"grace_ms = {grace_ms!r} is not valid: give milliseconds as an int >= 0"
        )
    if inner is not None and not callable(inner):
        raise ConfigurationError(
            f"inner = {inner!r} is not valid: give the app's lifespan, a function of the app "
            f"returning an async context manager"
        )

    @asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        _log_with_the_server()
        async with inner(app) if inner is not None else nullcontext() as inner_state:
            await scheduler.start()
            apis = {
                actions: DashboardAPI(
                    scheduler.backend,
                    allow_actions=actions,
                    requested_by=f"fastapi@{socket.gethostname()}",
                    lent=lambda: scheduler.running and scheduler.enabled,
                )
                for actions in (False, True)
            }
            setattr(app.state, STATE_KEY, scheduler)
            setattr(app.state, APIS_KEY, apis)
            try:
                yield {**(inner_state or {}), STATE_KEY: scheduler, APIS_KEY: apis}
            finally:
                try:
                    await _stop(scheduler, scheduler.grace_ms if grace_ms is None else grace_ms)
                finally:
                    for api in apis.values():
                        await api.close()  # only if a request opened the store
                    for key in (STATE_KEY, APIS_KEY):
                        if getattr(app.state, key, None) is not None:
                            delattr(app.state, key)

    return run


def _log_with_the_server() -> None:
    """Send the ``anarchon`` loggers' records (INFO and up) through the server's own log
    handlers when neither they nor the root logger have any: under ``uvicorn`` nothing
    configures the root logger, and start-up, takeovers and hand-overs would go unseen.
    A ``--log-config`` or an application that configures logging decides instead."""
    ours, root = logging.getLogger("anarchon"), logging.getLogger()
    if ours.handlers or root.handlers:
        return
    for name in SERVER_LOGGERS:
        # The handlers a record of the server's logger reaches below the root (uvicorn's
        # are on "uvicorn", the parent of "uvicorn.error").
        found: logging.Logger | None = logging.getLogger(name)
        while found is not None and found is not root and not found.handlers:
            found = found.parent if found.propagate else None
        if found is not None and found is not root:
            for handler in found.handlers:
                ours.addHandler(handler)
            if ours.level == logging.NOTSET:
                ours.setLevel(logging.INFO)
            return


async def _stop(scheduler: Scheduler, grace_ms: int) -> None:
    try:
        async with asyncio.timeout(grace_ms / 1000 + HANDOVER_MARGIN_S):
            await scheduler.stop(grace_ms)
    except TimeoutError:
        logger.warning(
            "anarchon: the hand-over did not finish within grace_ms=%d + %.0fs; "
            "leases not released expire on their own and a backup takes the runs over",
            grace_ms,
            HANDOVER_MARGIN_S,
        )


def get_scheduler(request: Request) -> Scheduler:
    """The app's scheduler (``Depends(get_scheduler)``); 503 outside ``lifespan(...)``."""
    found = getattr(request.state, STATE_KEY, None) or getattr(request.app.state, STATE_KEY, None)
    if not isinstance(found, Scheduler):
        raise HTTPException(503, NOT_RUNNING)
    return found


#: ``async def endpoint(scheduler: SchedulerDep): ...``
SchedulerDep = Annotated[Scheduler, Depends(get_scheduler)]
