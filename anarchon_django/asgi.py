"""Run the scheduler inside each ASGI worker: ``with_scheduler(get_asgi_application())``.

The wrapper answers the ASGI ``lifespan`` scope (which Django's handler does not): the
project's scheduler starts on the server's event loop at ``lifespan.startup`` and stops
with hand-over at ``lifespan.shutdown``; every other scope goes to the wrapped
application unchanged. Each worker is one instance. Trade-offs: ``docs/django.md``,
"Inside each ASGI worker".
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
    """Wrap ``app`` so that its server's lifespan starts and stops ``scheduler`` (default:
    the project's, looked up at startup, after every ``jobs.py`` was imported; ``grace_ms``
    default: ``ANARCHON["GRACE_MS"]``)."""

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
        phase = (await receive())["type"].removeprefix("lifespan.")
        if phase not in ("startup", "shutdown"):
            continue
        try:
            if phase == "startup":
                if scheduler is None:
                    from ._scheduler import get_scheduler

                    scheduler = get_scheduler()
                await scheduler.start()
                running = scheduler
            elif running is not None:
                await running.stop(grace_ms)
        except Exception as exc:
            await send({"type": f"lifespan.{phase}.failed", "message": f"anarchon: {exc}"})
            return
        await send({"type": f"lifespan.{phase}.complete"})
        if phase == "shutdown":
            return
