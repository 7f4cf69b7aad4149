"""The JSON API of ``docs/api.md`` and the dashboard page, as a FastAPI ``APIRouter``.

Every route, its OpenAPI description and every answer come from the core
(:data:`anarchon_core.web.endpoints.ROUTES`, :func:`anarchon_core.web.api_response`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from fastapi import APIRouter, Request, params
from fastapi.responses import Response

from anarchon_core.errors import ConfigurationError
from anarchon_core.web import api_response, starlette_response
from anarchon_core.web.endpoints import ROUTES, Reply
from anarchon_core.web.http_guard import file_answer
from anarchon_core.web.http_guard import trusted_origins as checked_origins

from ._lifespan import APIS_KEY, NOT_RUNNING

__all__ = ["router"]

logger = logging.getLogger("anarchon.fastapi")

TAG = "anarchon"


def router(
    *,
    dashboard: bool = True,
    allow_actions: bool = False,
    dependencies: Sequence[params.Depends] | None = None,
    public: bool = False,
    insecure_no_auth: bool = False,
    trusted_origins: Sequence[str] = (),
) -> APIRouter:
    """An ``APIRouter`` with the JSON API (``api/jobs``, ``api/runs``, ``api/instances``,
    ``api/health``) and, with ``dashboard``, the page at its root.

    Include it with a prefix: ``app.include_router(router(dependencies=[Depends(auth)]),
    prefix="/anarchon")``; the page is then at ``/anarchon/`` (``/anarchon`` redirects
    there). Every answer is read from the shared store of the app's scheduler (started
    by :func:`lifespan`), so under ``--workers N`` any worker answers the same.

    ``dependencies`` (e.g. ``[Depends(check_token)]``) guard every API route; the page
    and its files carry no data and are served without them (a browser cannot add a
    header to a page load). The API shows run errors, host names and process ids, so a
    router without dependencies must say ``public=True``.

    ``allow_actions`` adds ``POST api/jobs/{job}/pause|resume|trigger`` and
    ``POST api/runs/cancel``; without it they answer 403 and are not in the OpenAPI
    schema. Actions need ``dependencies`` that authenticate, or the explicit opt-out
    ``insecure_no_auth=True`` (anyone who reaches the app may then pause, trigger and
    cancel jobs). Every action takes a JSON body (``415`` otherwise) from the page's
    own origin (``403`` for a cross-site ``Origin`` or ``Sec-Fetch-Site``, unless the
    origin is one of ``trusted_origins``, e.g. ``"https://ops.example.com"`` behind a
    proxy that rewrites ``Host``), so a form or a script on another site cannot act
    with a user's cookies.

    :raises ConfigurationError: no ``dependencies`` and neither ``public`` nor, with
        actions, ``insecure_no_auth``; a trusted origin that is not
        ``scheme://host[:port]``.
    """
    guarded = bool(dependencies)
    if allow_actions and not guarded and not insecure_no_auth:
        raise ConfigurationError(
            "router(allow_actions=True) lets every caller pause, trigger and cancel jobs: "
            "give dependencies=[Depends(...)] that authenticate the caller, or "
            "insecure_no_auth=True to serve the actions to anyone who reaches the app"
        )
    if not guarded and not public and not insecure_no_auth:
        raise ConfigurationError(
            "router() serves run errors, host names and process ids: give "
            "dependencies=[Depends(...)] that authenticate the caller, or public=True to "
            "serve the read-only API to anyone who reaches the app"
        )
    if insecure_no_auth and not guarded:
        logger.warning(
            "anarchon_fastapi.router(insecure_no_auth=True): the API and its actions "
            "(%s) are served without authentication",
            "enabled" if allow_actions else "disabled",
        )
    trusted = checked_origins(trusted_origins)
    api = APIRouter(tags=[TAG], dependencies=list(dependencies or ()))

    def answer(template: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            apis = getattr(request.state, APIS_KEY, None) or getattr(
                request.app.state, APIS_KEY, None
            )
            if apis is None:
                return starlette_response(Reply(503, {"error": NOT_RUNNING}))
            path = template.format_map(request.path_params)
            return await api_response(request, apis[allow_actions], path, trusted_origins=trusted)

        return endpoint

    for route in ROUTES:  # documented (actions only when allowed), answered by the core
        api.add_api_route(
            f"/api/{route.path}",
            answer(route.path),
            methods=[route.method],
            name=route.name,
            include_in_schema=allow_actions or not route.action,
            openapi_extra=route.openapi(),
        )
    # Any other path and method: 404/405 in the API's own words.
    api.add_api_route(
        "/api/{path:path}",
        answer("{path}"),
        methods=["GET", "HEAD", "POST"],
        include_in_schema=False,
    )
    if not dashboard:
        return api

    # -- the page (no dependencies: it carries no data) --------------------------------
    outer = APIRouter(tags=[TAG])

    @outer.get("/", include_in_schema=False)
    async def page() -> Response:
        return starlette_response(file_answer("index.html"))

    @outer.get("/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        return starlette_response(file_answer(name))

    outer.include_router(api)  # "/{name}" is one segment: it never hides "/api/…"
    return outer
