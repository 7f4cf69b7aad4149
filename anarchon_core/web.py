"""The standalone dashboard: an ASGI app (Starlette) over a backend URL.

``anarchon dashboard`` serves it with uvicorn; it needs the ``[web]`` extra. The app
opens the store at the first request and closes it on shutdown, answers the JSON API through
:class:`~anarchon_core.endpoints.DashboardAPI`, and serves the page at its root.

A token, when given, guards the whole API (``Authorization: Bearer <token>``): the page
reads it from the URL fragment ``#token=…``, which browsers never send to a server.
Bearer headers are not sent by browsers on their own, so no CSRF token is needed.
"""

from __future__ import annotations

import hmac
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .backend import Backend
from .backends import backend_from_url
from .endpoints import DashboardAPI, Reply, dashboard_file

__all__ = ["create_app"]

_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def create_app(
    backend: Backend | str, *, allow_actions: bool = False, token: str | None = None
) -> Starlette:
    """The dashboard app for ``backend`` (an instance or a URL).

    :raises ConfigurationError: a bad backend URL.
    """
    store = backend_from_url(backend) if isinstance(backend, str) else backend
    endpoints = DashboardAPI(
        store, allow_actions=allow_actions, requested_by=f"dashboard@{socket.gethostname()}"
    )

    async def page(request: Request) -> Response:
        # Mounted at a prefix, Starlette redirects "{prefix}" to "{prefix}/", which the
        # page's relative URLs need.
        return _file("index.html")

    async def asset(request: Request) -> Response:
        return _file(request.path_params["name"])

    async def api(request: Request) -> Response:
        if token is not None and not _authorized(request, token):
            reply = Reply(401, {"error": "this dashboard needs its token: open it with #token=…"})
        else:
            body = await request.body()
            reply = await endpoints.handle(
                request.method, request.path_params["path"], request.query_params, body
            )
        return Response(
            reply.json_bytes(),
            reply.status,
            headers={**_SECURITY_HEADERS, "Cache-Control": "no-store"},
            media_type="application/json",
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await endpoints.close()

    return Starlette(
        routes=[
            Route("/", page),
            Route("/api/{path:path}", api, methods=["GET", "HEAD", "POST"]),
            Route("/{name}", asset),
        ],
        lifespan=lifespan,
    )


def _file(name: str) -> Response:
    found = dashboard_file(name)
    if found is None:
        return Response("not found", 404, media_type="text/plain")
    content, content_type = found
    return Response(content, headers=_SECURITY_HEADERS, media_type=content_type)


def _authorized(request: Request, token: str) -> bool:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip(), token)
