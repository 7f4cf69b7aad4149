"""The JSON API of ``docs/api.md`` and the dashboard page, as a FastAPI ``APIRouter``."""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, params
from fastapi.responses import Response

from anarchon_core.endpoints import DashboardAPI, Reply
from anarchon_core.errors import ConfigurationError
from anarchon_core.http_guard import HttpAnswer, action_refusal, file_answer, json_answer
from anarchon_core.http_guard import trusted_origins as checked_origins

from . import _models as m
from ._lifespan import STORE_KEY, AppDashboards

__all__ = ["router"]

logger = logging.getLogger("anarchon.fastapi")

TAG = "anarchon"
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": m.ErrorAnswer, "description": text}
    for code, text in (
        (400, "a bad parameter (the error names it and the accepted form)"),
        (500, "an unexpected failure"),
        (501, "the store cannot do this (claim-only backends)"),
        (503, "the store is unavailable, or anarchon is not running in this app"),
    )
}
_ACTION_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": m.ErrorAnswer, "description": text}
    for code, text in (
        (403, "actions are not enabled, or the request came from another site"),
        (404, "no API at this path (a job name holding a '/')"),
        (409, "no live instance has the job (trigger)"),
        (415, "the body is not application/json"),
    )
}
# Query parameters are declared as text and checked by the core's DashboardAPI, so that a
# bad value answers 400 {"error": …} naming the accepted form, like every other error.
_WINDOW = "a duration such as 1h, 24h, 7d (default 24h, at most 7d)"
_STATUS = "one of claimed, running, success, failed, interrupted, skipped, paused, cancelled"
_NOT_RUNNING = Reply(
    503,
    {
        "error": "anarchon is not running in this app: give FastAPI(lifespan=lifespan(scheduler)) "
        "(or APIRouter(lifespan=…)) from anarchon_fastapi"
    },
)


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
    requested_by = f"fastapi@{socket.gethostname()}"

    async def answer(request: Request, path: str) -> Response:
        store = getattr(request.state, STORE_KEY, None) or getattr(
            request.app.state, STORE_KEY, None
        )
        if not isinstance(store, AppDashboards):
            reply = _NOT_RUNNING
        else:
            handler = store.api(allow_actions=allow_actions, requested_by=requested_by)
            reply = await _handle(request, handler, path, allow_actions, trusted)
        return _respond(json_answer(reply))

    # -- reads -------------------------------------------------------------------------
    @api.get(
        "/api/jobs",
        response_model=m.JobsAnswer,
        responses=_ERRORS,
        summary="Every job of the cluster, with its schedule, state and stats",
    )
    async def jobs(
        request: Request,
        window: Annotated[str | None, Query(description=_WINDOW)] = None,
    ) -> Response:
        return await answer(request, "jobs")

    @api.get(
        "/api/runs",
        response_model=m.RunsAnswer,
        responses=_ERRORS,
        summary="History records, newest first, one page",
    )
    async def runs(
        request: Request,
        job: Annotated[str | None, Query(description="a job's store name")] = None,
        status: Annotated[str | None, Query(description=_STATUS)] = None,
        since: Annotated[str | None, Query(description="epoch ms (integer): since <= slot")] = None,
        until: Annotated[str | None, Query(description="epoch ms (integer): slot < until")] = None,
        limit: Annotated[str | None, Query(description="integer 1-1000, default 50")] = None,
        cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
    ) -> Response:
        return await answer(request, "runs")

    @api.get(
        "/api/instances",
        response_model=m.InstancesAnswer,
        responses=_ERRORS,
        summary="The live instances and any schedule mismatch between them",
    )
    async def instances(request: Request) -> Response:
        return await answer(request, "instances")

    @api.get(
        "/api/health",
        response_model=m.HealthAnswer,
        responses={503: {"model": m.HealthAnswer, "description": "the store is unavailable"}},
        summary="Whether the store answers",
    )
    async def health(request: Request) -> Response:
        return await answer(request, "health")

    # -- actions -----------------------------------------------------------------------
    action_responses = {**_ERRORS, **_ACTION_ERRORS}
    for verb, model, summary in (
        ("pause", m.PausedAnswer, "Pause a job on every instance from its next slot"),
        ("resume", m.PausedAnswer, "Resume a job from its next slot"),
        ("trigger", m.TriggerAnswer, "Run a job once now on exactly one live instance"),
    ):
        _add_action(api, answer, verb, model, summary, allow_actions, action_responses)

    @api.post(
        "/api/runs/cancel",
        response_model=m.CancelAnswer,
        responses=action_responses,
        summary="Cancel a pending or running run",
        include_in_schema=allow_actions,
        openapi_extra=_json_body(m.CancelRequest.model_json_schema()),
    )
    async def cancel(request: Request) -> Response:
        return await answer(request, "runs/cancel")

    @api.api_route("/api/{path:path}", methods=["GET", "HEAD", "POST"], include_in_schema=False)
    async def other(request: Request, path: str) -> Response:
        return await answer(request, path)  # 404/405 in the API's own words

    if not dashboard:
        return api

    # -- the page (no dependencies: it carries no data) --------------------------------
    outer = APIRouter(tags=[TAG])

    @outer.get("/", include_in_schema=False)
    async def page() -> Response:
        return _file("index.html")

    @outer.get("/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        return _file(name)

    outer.include_router(api)  # "/{name}" is one segment: it never hides "/api/…"
    return outer


async def _handle(
    request: Request,
    handler: DashboardAPI,
    path: str,
    allow_actions: bool,
    trusted: tuple[str, ...],
) -> Reply:
    if request.method != "POST":
        return await handler.handle(request.method, path, request.query_params)
    if allow_actions:
        refusal = action_refusal(
            request.headers, host=request.headers.get("host"), trusted_origins=trusted
        )
        if refusal is not None:
            return refusal
    return await handler.handle(request.method, path, request.query_params, await request.body())


def _add_action(
    api: APIRouter,
    answer: Callable[[Request, str], Awaitable[Response]],
    verb: str,
    model: type[m._Model],
    summary: str,
    allowed: bool,
    responses: dict[int | str, dict[str, Any]],
) -> None:
    async def act(request: Request, job: str) -> Response:
        return await answer(request, f"jobs/{job}/{verb}")

    act.__name__ = verb
    api.add_api_route(
        f"/api/jobs/{{job}}/{verb}",
        act,
        methods=["POST"],
        response_model=model,
        responses=responses,
        summary=summary,
        include_in_schema=allowed,
        openapi_extra=_json_body(
            {"type": "object", "description": "any JSON object, e.g. {}; ignored"}
        ),
    )


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    """A required JSON request body: actions take ``application/json`` only."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _file(name: str) -> Response:
    return _respond(file_answer(name))


def _respond(answer: HttpAnswer) -> Response:
    return Response(answer.body, answer.status, headers=dict(answer.headers))
