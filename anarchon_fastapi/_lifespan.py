"""The lifespan that runs a :class:`~anarchon_core.Scheduler` inside a FastAPI app."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request

from anarchon_core import ConfigurationError, Scheduler
from anarchon_core.endpoints import DashboardAPI

__all__ = ["STATE_KEY", "SchedulerDep", "get_scheduler", "lifespan"]

logger = logging.getLogger("anarchon.fastapi")

#: The name of the scheduler in ``app.state`` and in the lifespan state (``request.state``).
STATE_KEY = "anarchon"
#: Where the lifespan keeps the API handlers of the app's routers (:class:`AppDashboards`).
STORE_KEY = "anarchon_store"

#: How long the hand-over itself (lease release, leaving the registry, closing the
#: store) may take after ``grace_ms`` before the lifespan stops waiting for it. Leases
#: that were not released then simply expire, and a backup takes the run over.
HANDOVER_MARGIN_S = 3.0

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[Mapping[str, Any] | None]]


class AppDashboards:
    """The API handlers of one app's routers, over its scheduler's store.

    While the scheduler runs (enabled), its backend is open and used concurrently by the
    engine's loops on this event loop; every backend is made for that, so the API uses
    it as lent and never opens or closes it. A disabled scheduler (``ANARCHON_ENABLED=0``)
    never opens its backend: then the first request opens it and the lifespan closes it.
    Either way the API reads the one shared store, whichever worker serves the request.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._apis: dict[tuple[bool, str], DashboardAPI] = {}

    def api(self, *, allow_actions: bool, requested_by: str) -> DashboardAPI:
        """The handler for a router of these settings (one per kind, made at first use)."""
        key = (allow_actions, requested_by)
        found = self._apis.get(key)
        if found is None:
            scheduler = self.scheduler
            found = self._apis[key] = DashboardAPI(
                scheduler.backend,
                allow_actions=allow_actions,
                requested_by=requested_by,
                lent=lambda: scheduler.running and scheduler.enabled,
            )
        return found

    async def aclose(self) -> None:
        """Close the store if a request opened it (never the running scheduler's)."""
        for api in self._apis.values():
            await api.close()


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
        async with _inner(inner, app) as inner_state:
            await scheduler.start()
            store = AppDashboards(scheduler)
            setattr(app.state, STATE_KEY, scheduler)
            setattr(app.state, STORE_KEY, store)
            try:
                yield {**(inner_state or {}), STATE_KEY: scheduler, STORE_KEY: store}
            finally:
                try:
                    await _stop(scheduler, scheduler.grace_ms if grace_ms is None else grace_ms)
                finally:
                    await store.aclose()
                    for key in (STATE_KEY, STORE_KEY):
                        if getattr(app.state, key, None) is not None:
                            delattr(app.state, key)

    return run


#: The server loggers whose handlers anarchon's records go through when nothing else
#: is configured: uvicorn's (also under gunicorn's uvicorn workers) and hypercorn's.
SERVER_LOGGERS = ("uvicorn.error", "hypercorn.error")


def _log_with_the_server() -> None:
    """Send the ``anarchon`` loggers' records (INFO and up) through the server's own log
    handlers when neither they nor the root logger have any: under ``uvicorn`` nothing
    configures the root logger, and start-up, takeovers and hand-overs would go unseen.
    A ``--log-config`` or an application that configures logging decides instead."""
    ours = logging.getLogger("anarchon")
    if ours.handlers or logging.getLogger().handlers:
        return
    for name in SERVER_LOGGERS:
        handlers = _handlers_of(logging.getLogger(name))
        if handlers:
            for handler in handlers:
                ours.addHandler(handler)
            if ours.level == logging.NOTSET:
                ours.setLevel(logging.INFO)
            return


def _handlers_of(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers a record of ``logger`` reaches below the root (uvicorn's are on
    ``uvicorn``, the parent of ``uvicorn.error``)."""
    found: logging.Logger | None = logger
    while found is not None and found is not logging.getLogger():
        if found.handlers:
            return list(found.handlers)
        found = found.parent if found.propagate else None
    return []


@asynccontextmanager
async def _inner(inner: Lifespan | None, app: FastAPI) -> AsyncIterator[Mapping[str, Any] | None]:
    if inner is None:
        yield None
        return
    async with inner(app) as state:
        yield state


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
        raise HTTPException(
            503,
            "anarchon is not running in this app: give FastAPI(lifespan=lifespan(scheduler)) "
            "(or APIRouter(lifespan=…)) from anarchon_fastapi",
        )
    return found


#: ``async def endpoint(scheduler: SchedulerDep): ...``
SchedulerDep = Annotated[Scheduler, Depends(get_scheduler)]
