"""Run the scheduler inside each ASGI worker: ``with_scheduler(get_asgi_application())``.

::

    # myproject/asgi.py
    from django.core.asgi import get_asgi_application
    from anarchon_django.asgi import with_scheduler

    application = with_scheduler(get_asgi_application())

The wrapper answers the ASGI ``lifespan`` scope (which Django's own handler does not
speak): the project's scheduler starts on the server's event loop at
``lifespan.startup`` and stops with hand-over at ``lifespan.shutdown``. Every other
scope goes to the wrapped application unchanged. Under ``uvicorn --workers N`` (or
``gunicorn -k uvicorn_worker.UvicornWorker``, or gunicorn's own ``-k asgi``) each
worker is one instance (under ``--preload`` the scheduler built in the master mints a
fresh default instance id when it starts in each worker).

Trade-offs (see ``docs/django.md``): no extra process to deploy, but the scheduler
lives and dies with the web worker (worker recycling is instance churn; a hung worker
is a hung instance until its lease expires) and shares its event loop; nothing runs
the system checks or the migration check first (run ``manage.py check`` in the
deploy); a server started without lifespan support (``--lifespan off``) never starts
it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from anarchon_core import Scheduler

__all__ = ["with_scheduler"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def with_scheduler(
    app: ASGIApp, *, scheduler: Scheduler | None = None, grace_ms: int | None = None
) -> ASGIApp:
    """Wrap ``app`` so that its server's lifespan starts and stops ``scheduler``.

    ``scheduler`` defaults to the project's (``anarchon_django.scheduler``), looked up
    at startup, after every ``jobs.py`` was imported. ``grace_ms`` defaults to
    ``ANARCHON["GRACE_MS"]``.
    """

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        await _lifespan(scheduler, grace_ms, receive, send)

    return application


async def _lifespan(
    scheduler: Scheduler | None, grace_ms: int | None, receive: Receive, send: Send
) -> None:
    running: Scheduler | None = None
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                if scheduler is None:
                    from ._scheduler import get_scheduler

                    scheduler = get_scheduler()
                await scheduler.start()
                running = scheduler
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": f"anarchon: {exc}"})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            try:
                if running is not None:
                    await running.stop(grace_ms)
            except Exception as exc:
                await send({"type": "lifespan.shutdown.failed", "message": f"anarchon: {exc}"})
                return
            await send({"type": "lifespan.shutdown.complete"})
            return
