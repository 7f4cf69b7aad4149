"""The standalone dashboard: an ASGI app (Starlette) over a backend URL.

``anarchon dashboard`` serves it with uvicorn; it needs the ``[web]`` extra. The app
opens the store at the first request and closes it in its lifespan (a host that mounts it
enters ``app.router.lifespan_context(app)`` in its own: a mounted app gets no lifespan
events), answers the JSON API through :class:`~anarchon_core.web.endpoints.DashboardAPI`, and
serves the page at its root.

Every request must name an allowed host in its ``Host`` header (``400`` otherwise), so a
hostile page cannot reach a loopback dashboard through a DNS name rebound to
``127.0.0.1``. A token, when given, guards the whole API (``Authorization: Bearer
<token>``): the page reads it from the URL fragment ``#token=…``, which browsers never
send to a server. Actions need the token, a JSON body and a same-origin request
(:mod:`anarchon_core.web.http_guard`); bearer headers are never attached by a browser on its
own, so no CSRF token is needed.
"""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..backend import Backend
from ..backends import backend_from_url
from ..errors import ConfigurationError
from .endpoints import DashboardAPI, Reply
from .http_guard import (
    HttpAnswer,
    action_refusal,
    allowed_hosts,
    bearer_token,
    check_token,
    file_answer,
    host_refusal,
    json_answer,
    token_matches,
)

__all__ = ["api_response", "create_app", "starlette_response"]


def create_app(
    backend: Backend | str,
    *,
    allow_actions: bool = False,
    token: str | None = None,
    allow_hosts: Iterable[str] = (),
    insecure_no_auth: bool = False,
) -> Starlette:
    """The dashboard app for ``backend`` (an instance or a URL).

    The app answers only to ``Host: localhost``, ``127.0.0.1`` and ``[::1]`` (any port),
    and to the names in ``allow_hosts``: ``ops.example.com``, ``.example.com`` for a
    domain and its subdomains, ``"*"`` for any (when the server in front checks
    ``Host`` itself). ``allow_actions``
    needs a ``token``, unless ``insecure_no_auth`` says that whatever serves this app
    authenticates every request itself.

    :raises ConfigurationError: a bad backend URL, token or host; actions without a
        token.
    """
    if token is not None:
        check_token(token)
    elif allow_actions and not insecure_no_auth:
        raise ConfigurationError(
            "create_app(allow_actions=True) lets anyone who reaches it pause, trigger and "
            "cancel jobs: give token=… (every API request then needs it as a Bearer "
            "header), or insecure_no_auth=True if the server in front authenticates"
        )
    allowed = allowed_hosts(None, allow_hosts)
    store = backend_from_url(backend) if isinstance(backend, str) else backend
    endpoints = DashboardAPI(
        store, allow_actions=allow_actions, requested_by=f"dashboard@{socket.gethostname()}"
    )

    async def page(request: Request) -> Response:
        # Mounted at a prefix, Starlette redirects "{prefix}" to "{prefix}/", which the
        # page's relative URLs need.
        return starlette_response(file_answer("index.html"))

    async def asset(request: Request) -> Response:
        return starlette_response(file_answer(request.path_params["name"]))

    async def api(request: Request) -> Response:
        if token is not None and not token_matches(_bearer(request), token):
            return starlette_response(
                Reply(401, {"error": "this dashboard needs its token: open it with #token=…"})
            )
        return await api_response(request, endpoints, request.path_params["path"])

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await endpoints.close()

    api_route = Route("/api/{path:path}", api, methods=["GET", "HEAD", "POST"])
    # Every path under api/ is the API's to answer, line breaks included (a bad job name
    # is a 400 naming the accepted form, not the router's plain-text 404).
    api_route.path_regex = re.compile(api_route.path_regex.pattern, re.DOTALL)
    return Starlette(
        routes=[Route("/", page), api_route, Route("/{name}", asset)],
        middleware=[Middleware(_HostGuard, allowed=allowed)],
        lifespan=lifespan,
    )


class _HostGuard:
    """Answers ``400`` to any HTTP request whose ``Host`` is not allowed."""

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            refusal = host_refusal(Headers(scope=scope).get("host"), self.allowed)
            if refusal is not None:
                await starlette_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _bearer(request: Request) -> bytes | None:
    """The Bearer credentials as the client sent them (bytes, not a decoded text)."""
    for name, value in request.headers.raw:
        if name == b"authorization":
            return bearer_token(value)
    return None


async def api_response(
    request: Request, endpoints: DashboardAPI, path: str, *, trusted_origins: Iterable[str] = ()
) -> Response:
    """The API's answer to ``request`` for ``path`` (relative to the API: ``"jobs"``):
    an action goes through :func:`~anarchon_core.web.http_guard.action_refusal` first
    (``trusted_origins`` as checked by
    :func:`~anarchon_core.web.http_guard.trusted_origins`). Authentication is the caller's."""
    if endpoints.allow_actions and request.method == "POST":
        refusal = action_refusal(
            request.headers, host=request.headers.get("host"), trusted_origins=trusted_origins
        )
        if refusal is not None:
            return starlette_response(refusal)
    body = await request.body()
    return starlette_response(
        await endpoints.handle(request.method, path, request.query_params, body)
    )


def starlette_response(answer: HttpAnswer | Reply) -> Response:
    """``answer`` as a Starlette response (a :class:`Reply` through
    :func:`~anarchon_core.web.http_guard.json_answer`, with its security headers)."""
    if isinstance(answer, Reply):
        answer = json_answer(answer)
    return Response(answer.body, answer.status, headers=dict(answer.headers))
