"""The HTTP API of ``docs/api.md`` and the dashboard's files, with no web framework.

Every host (the standalone ``anarchon dashboard``, the FastAPI router, the Django admin)
turns its request into ``(method, path, params, body)``, calls :meth:`DashboardAPI.handle`
and sends back the :class:`Reply`; authentication and CSRF stay with the host, which
knows how its users log in. Paths are relative to the mount prefix (``"jobs"``,
``"jobs/reports.daily/pause"``, ``"runs/cancel"``), so the page works under any prefix.
:data:`ROUTES` is the one table of the API's operations: the dispatcher's, and the
OpenAPI description a host publishes (:meth:`Route.openapi`).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from .. import operations, stored_jobs
from ..backend import Backend
from ..definitions import Definition
from ..durations import parse_duration_ms
from ..errors import BackendError, CapabilityError, ConfigurationError, ConflictError
from ..names import store_name, validate_namespace
from ..operations import NoLiveInstanceError
from ..records import Status, iso_utc
from ..redact import brief
from . import api

__all__ = ["ERRORS", "ROUTES", "DashboardAPI", "Reply", "Route", "dashboard_file"]

logger = logging.getLogger("anarchon.dashboard")

_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}
#: Slots and times are epoch milliseconds, stored as 64-bit integers.
_INT64 = (-(2**63), 2**63 - 1)
_JSON = "application/json"

#: What each error status of the API means (the descriptions of an OpenAPI schema).
ERRORS: Mapping[int, str] = {
    400: "a bad parameter (the error names it and the accepted form)",
    403: "actions are not enabled, or the request came from another site",
    404: "no API at this path (a job name holding a '/'), or no such stored definition",
    409: "no live instance has the job (trigger); a definition changed since it was read",
    415: "the body is not application/json",
    500: "an unexpected failure",
    501: "the store cannot do this (claim-only backends)",
    503: "the store is unavailable, or the API is not running in this app",
}
_WINDOW = "a duration such as 1h, 24h, 7d (default 24h, at most 7d)"
_RUNS_QUERY = {
    "job": "a job's store name",
    "status": "one of " + ", ".join(s.value for s in Status),
    "since": "epoch ms (integer): since <= slot",
    "until": "epoch ms (integer): slot < until",
    "limit": f"integer 1-{api.MAX_RUNS_LIMIT}, default {api.DEFAULT_RUNS_LIMIT}",
    "cursor": "next_cursor of the previous page",
}

#: A route's handler: ``(path parameters, query parameters, body) -> answer``.
Handler = Callable[[Mapping[str, str], Mapping[str, str], bytes], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Route:
    """One operation of the API: :class:`DashboardAPI` dispatches on it, and a host may
    publish its :meth:`openapi` description (the FastAPI router does).

    ``path`` is relative to the API (``"jobs/{job}/pause"``: ``{job}`` is one path
    segment). ``query`` names the query parameters with their descriptions: they are
    text, checked by the handler, so a bad value is a 400 naming the accepted form.
    ``POST`` routes are the actions, off unless enabled. ``answer``, ``body`` and
    ``failure`` name the :data:`~anarchon_core.web.api.SCHEMAS` of the answer, the request
    body and the answers of the ``errors`` statuses.
    """

    name: str
    method: str
    path: str
    summary: str
    answer: str
    query: Mapping[str, str] = field(default_factory=dict)
    body: str | None = None
    errors: tuple[int, ...] = (400, 500, 501, 503)
    failure: str = "error"

    @property
    def action(self) -> bool:
        return self.method == "POST"

    def match(self, parts: list[str]) -> dict[str, str] | None:
        """The path parameters if ``parts`` (the path's segments) are this route's."""
        pattern = self.path.split("/")
        if len(parts) != len(pattern):
            return None
        found: dict[str, str] = {}
        for want, got in zip(pattern, parts, strict=True):
            if want.startswith("{"):
                found[want[1:-1]] = got
            elif want != got:
                return None
        return found

    def openapi(self) -> dict[str, Any]:
        """This route's OpenAPI 3 operation: summary, parameters, request body and the
        schema of every answer."""
        parameters: list[dict[str, Any]] = [
            {"name": part[1:-1], "in": "path", "required": True, "schema": {"type": "string"}}
            for part in self.path.split("/")
            if part.startswith("{")
        ]
        parameters += [
            {
                "name": name,
                "in": "query",
                "required": False,
                "description": about,
                "schema": {"type": "string", "description": about},
            }
            for name, about in self.query.items()
        ]
        operation: dict[str, Any] = {
            "summary": self.summary,
            "responses": {
                "200": {"description": "the answer", **_json_content(self.answer)},
                **{
                    str(code): {"description": ERRORS[code], **_json_content(self.failure)}
                    for code in self.errors
                },
            },
        }
        if parameters:
            operation["parameters"] = parameters
        if self.body is not None:
            operation["requestBody"] = {"required": True, **_json_content(self.body)}
        return copy.deepcopy(operation)  # the caller's to change


def _json_content(schema: str) -> dict[str, Any]:
    return {"content": {_JSON: {"schema": api.SCHEMAS[schema]}}}


_ACTION_ERRORS = (400, 403, 404, 409, 415, 500, 501, 503)
#: Every operation of the API (``docs/api.md``): the reads, the job actions, cancel, and
#: the stored definitions (read, create, update, remove).
ROUTES: tuple[Route, ...] = (
    Route(
        "jobs",
        "GET",
        "jobs",
        "Every job of the cluster, with its schedule, state and stats",
        answer="jobs",
        query={"window": _WINDOW},
    ),
    Route(
        "runs",
        "GET",
        "runs",
        "History records, newest first, one page",
        answer="runs",
        query=_RUNS_QUERY,
    ),
    Route(
        "instances",
        "GET",
        "instances",
        "The live instances and any schedule mismatch between them",
        answer="instances",
    ),
    Route(
        "health",
        "GET",
        "health",
        "Whether the store answers",
        answer="health",
        errors=(503,),
        failure="health",
    ),
    *(
        Route(
            verb,
            "POST",
            f"jobs/{{job}}/{verb}",
            summary,
            answer=answer,
            body="action_body",
            errors=_ACTION_ERRORS,
        )
        for verb, answer, summary in (
            ("pause", "paused", "Pause a job on every instance from its next slot"),
            ("resume", "paused", "Resume a job from its next slot"),
            ("trigger", "trigger", "Run a job once now on exactly one live instance"),
        )
    ),
    Route(
        "cancel",
        "POST",
        "runs/cancel",
        "Cancel a pending or running run",
        answer="cancel",
        body="cancel_body",
        errors=_ACTION_ERRORS,
    ),
    Route(
        "definitions",
        "GET",
        "definitions",
        "Every job definition kept in the store, with its next slots",
        answer="definitions",
    ),
    Route(
        "definition",
        "GET",
        "definitions/{job}",
        "One stored definition, by its store name",
        answer="definition",
        errors=(400, 404, 500, 501, 503),
    ),
    Route(
        "add_definition",
        "POST",
        "definitions",
        "Store a new definition (every instance follows within one heartbeat)",
        answer="definition",
        body="definition_body",
        errors=_ACTION_ERRORS,
    ),
    Route(
        "update_definition",
        "POST",
        "definitions/{job}",
        "Replace a stored definition at the version read (409 if it changed since)",
        answer="definition",
        body="definition_body",
        errors=_ACTION_ERRORS,
    ),
    Route(
        "remove_definition",
        "POST",
        "definitions/{job}/remove",
        "Remove a stored definition at the version read (409 if it changed since)",
        answer="removed",
        body="remove_body",
        errors=_ACTION_ERRORS,
    ),
)


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP answer: status code and JSON body."""

    status: int
    body: dict[str, Any]

    def json_bytes(self) -> bytes:
        return json.dumps(self.body, ensure_ascii=False, separators=(",", ":")).encode()


def dashboard_file(name: str) -> tuple[bytes, str] | None:
    """The dashboard file ``name`` (``index.html``, ``dashboard.css``, ``dashboard.js``)
    and its content type, or ``None`` for any other name."""
    content_type = _ASSETS.get(name)
    if content_type is None:
        return None
    return (resources.files("anarchon_core.web") / "dashboard" / name).read_bytes(), content_type


#: The 403 of an action on a read-only dashboard, and how each host enables actions.
ACTIONS_OFF = (
    "actions are not enabled on this dashboard: `anarchon dashboard --allow-actions` "
    "(with a token), `router(allow_actions=True, dependencies=[...])` in FastAPI; the "
    "Django admin allows them by permission (docs/security.md)"
)


class DashboardAPI:
    """Answers the API over its own backend; actions only when ``allow_actions``.

    The backend is opened at the first request, not at start-up, so that a dashboard
    started while the store is down comes up and answers 503 until the store is back;
    :meth:`close` closes it. ``lent`` says whether the backend is open and owned by
    someone else right now (a running scheduler's, in the same app): the API then uses
    it as it is and neither opens nor closes it. ``requested_by`` names the operator's
    side in the store's manual-run record (``"dashboard@host"``).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        allow_actions: bool = False,
        requested_by: str = "dashboard",
        lent: Callable[[], bool] | None = None,
    ) -> None:
        self.backend = backend
        self.allow_actions = allow_actions
        self.requested_by = requested_by
        self._lent = lent
        self._opened = False
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        """Close the backend if a request opened it."""
        if self._opened:
            self._opened = False
            await self.backend.close()

    async def store(self) -> Backend:
        """The backend, open (or lent open): what every route calls, and a host that calls
        the store beside the routes (the Django admin's definition pages)."""
        if not self._opened and not (self._lent is not None and self._lent()):
            await self._open()
        return self.backend

    async def _open(self) -> None:
        async with self._lock:
            if self._opened:
                return
            try:
                await self.backend.open()
            except BaseException:
                await self.backend.close()  # free what a failed open left behind
                raise
            self._opened = True

    async def handle(
        self, method: str, path: str, params: Mapping[str, str], body: bytes = b""
    ) -> Reply:
        """Route one request; every failure is an answer, never an exception."""
        parts = [p for p in path.strip("/").split("/") if p]
        try:
            route = self._route(method.upper(), parts)
            if isinstance(route, Reply):
                return route
            await self.store()
            handler, found = route
            return Reply(200, await handler(found, params, body))
        except CapabilityError as exc:
            return _error(501, exc)
        except ConfigurationError as exc:
            return _error(400, exc)
        except NoLiveInstanceError as exc:
            return _error(409, exc)
        except ConflictError as exc:
            return Reply(409, {"error": str(exc), "current": exc.current})
        except _NotFound as exc:
            return _error(404, exc)
        except BackendError as exc:
            down = {"status": "unavailable", "backend": self.backend.describe(), "error": str(exc)}
            return Reply(503, down)
        except Exception as exc:  # the page shows it; the log keeps the traceback
            logger.exception("dashboard API %s /%s failed", method, path)
            return _error(500, exc)

    def _route(self, method: str, parts: list[str]) -> tuple[Handler, dict[str, str]] | Reply:
        matched = [(route, found) for route in ROUTES if (found := route.match(parts)) is not None]
        if not matched:
            return Reply(404, {"error": f"no API at {'/'.join(parts)!r}: see docs/api.md"})
        wanted = "GET" if method == "HEAD" else method
        chosen = next(((r, f) for r, f in matched if r.method == wanted), None)
        if chosen is None:
            allowed = " or ".join(sorted({r.method for r, _ in matched}))
            return Reply(405, {"error": f"method not allowed here: use {allowed}"})
        route, found = chosen
        if route.action and not self.allow_actions:
            return Reply(403, {"error": ACTIONS_OFF})
        handler: Handler = getattr(self, f"_{route.name}")
        return handler, found

    # -- reads -------------------------------------------------------------------------
    async def _jobs(
        self, path: Mapping[str, str], params: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        window = params.get("window")
        window_ms = api.DEFAULT_WINDOW_MS
        if window is not None:
            window_ms = parse_duration_ms(window, what="window")
            if window_ms > api.MAX_WINDOW_MS:  # named as given, not in ms
                raise ConfigurationError(
                    f"window {brief(window)} is not valid: give a duration from 1ms to 7d"
                )
        return await api.jobs(self.backend, window_ms=window_ms, actions=self.allow_actions)

    async def _runs(
        self, path: Mapping[str, str], params: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        return await api.runs(
            self.backend,
            job=params.get("job") or None,
            status=params.get("status") or None,
            since=_int_param(params, "since"),
            until=_int_param(params, "until"),
            limit=_int_param(params, "limit") or api.DEFAULT_RUNS_LIMIT,
            cursor=params.get("cursor") or None,
        )

    async def _instances(
        self, path: Mapping[str, str], params: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        return await api.instances(self.backend)

    async def _health(
        self, path: Mapping[str, str], params: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        now = await self.backend.now_ms()
        try:
            live: int | None = len(await self.backend.instances())
        except CapabilityError:
            live = None
        return {
            "status": "ok",
            "backend": self.backend.describe(),
            "now": now,
            "now_at": iso_utc(now),
            "instances": live,
        }

    async def _definitions(
        self, path: Mapping[str, str], params: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        return await api.definitions(self.backend)

    async def _definition(
        self, path: Mapping[str, str], params: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        namespace, name = api.split_store_name(path["job"])
        found = await stored_jobs.get_definition(self.backend, name, namespace)
        if found is None:
            raise _NotFound(f"no stored definition {path['job']!r}")
        return await self._shown(path["job"], found)

    async def _shown(self, job: str, definition: Definition) -> dict[str, Any]:
        held = await api.targets_held(self.backend)
        return api.definition_json(job, definition, held, await self.backend.now_ms())

    # -- actions -----------------------------------------------------------------------
    async def _add_definition(
        self, path: Mapping[str, str], params: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        definition, namespace = _definition_body(body)
        added = await stored_jobs.add_definition(self.backend, definition, namespace)
        return await self._shown(store_name(namespace, added.name), added)

    async def _update_definition(
        self, path: Mapping[str, str], params: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        definition, namespace = _definition_body(body)
        if store_name(namespace, definition.name) != path["job"]:
            raise ConfigurationError(
                f"the body names {store_name(namespace, definition.name)!r}, the path "
                f"{path['job']!r}: give the same definition (name and namespace)"
            )
        changed = await stored_jobs.update_definition(self.backend, definition, namespace)
        return await self._shown(path["job"], changed)

    async def _remove_definition(
        self, path: Mapping[str, str], params: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        version = _json_body(body, '{"version": <the version you read>}').get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ConfigurationError(
                f"version {brief(version)} is not valid: give the version you read, "
                '{"version": <integer>}'
            )
        namespace, name = api.split_store_name(path["job"])
        await stored_jobs.remove_definition(self.backend, name, version, namespace)
        return {"job": path["job"], "removed": True}

    async def _pause(
        self, path: Mapping[str, str], params: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        await operations.pause(self.backend, path["job"], force=_forced(body))
        return {"job": path["job"], "paused": True}

    async def _resume(
        self, path: Mapping[str, str], params: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        await operations.resume(self.backend, path["job"], force=_forced(body))
        return {"job": path["job"], "paused": False}

    async def _trigger(
        self, path: Mapping[str, str], params: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        job = path["job"]
        slot = await operations.trigger(self.backend, job, requested_by=self.requested_by)
        return {"job": job, "slot": slot, "scheduled_at": iso_utc(slot)}

    async def _cancel(
        self, path: Mapping[str, str], params: Mapping[str, str], body: bytes
    ) -> dict[str, Any]:
        job, slot = _cancel_body(body)
        cancelled = await operations.cancel(self.backend, job, slot)
        return {"job": job, "slot": slot, "cancelled": cancelled}


class _NotFound(LookupError):
    """A read of a stored definition that does not exist: a 404."""


def _json_body(body: bytes, form: str) -> dict[str, Any]:
    try:
        data = json.loads(body or b"null")
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ConfigurationError(f"body {body[:200]!r} is not valid: send a JSON object {form}")
    return data


def _definition_body(body: bytes) -> tuple[Definition, str | None]:
    """The definition of a create or update body, and its namespace."""
    data = _json_body(body, "of a definition (docs/api.md)")
    namespace = data.pop("namespace", None)
    if namespace is not None:
        validate_namespace(namespace)
    return Definition.from_json(data), namespace


def _forced(body: bytes) -> bool:
    """``{"force": true}`` in an action's body: act on a job the store does not know."""
    try:
        data = json.loads(body or b"null")
    except ValueError:
        data = None
    return isinstance(data, dict) and data.get("force") is True


def _cancel_body(body: bytes) -> tuple[str, int]:
    try:
        data = json.loads(body or b"null")
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("job"), str):
        raise ConfigurationError(
            f"cancel body {body[:200]!r} is not valid: send JSON "
            '{"job": "<job name>", "slot": <slot in epoch ms>}'
        )
    slot: Any = data.get("slot")  # operations.cancel checks its type and names the form
    if isinstance(slot, int) and not isinstance(slot, bool) and not _INT64[0] <= slot <= _INT64[1]:
        raise ConfigurationError(
            f"slot {slot!r} is not valid: give the run's slot in epoch ms (a 64-bit integer)"
        )
    return data["job"], slot


def _int_param(params: Mapping[str, str], name: str) -> int | None:
    text = params.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not _INT64[0] <= value <= _INT64[1]:
        raise ConfigurationError(f"{name}={text!r} is not valid: give a 64-bit integer")
    return value


def _error(status: int, exc: BaseException) -> Reply:
    return Reply(status, {"error": str(exc) or type(exc).__name__})
