"""The HTTP API of ``docs/api.md`` and the dashboard's files, with no web framework.

Every host (the standalone ``anarchon dashboard``, the FastAPI router, the Django admin)
turns its request into ``(method, path, params, body)``, calls :meth:`DashboardAPI.handle`
and sends back the :class:`Reply`; authentication and CSRF stay with the host, which
knows how its users log in. Paths are relative to the mount prefix (``"jobs"``,
``"jobs/reports.daily/pause"``, ``"runs/cancel"``), so the page works under any prefix.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from . import api, operations
from .backend import Backend
from .durations import parse_duration_ms
from .errors import BackendError, CapabilityError, ConfigurationError
from .operations import NoLiveInstanceError
from .records import iso_utc
from .redact import brief

__all__ = ["DashboardAPI", "Reply", "dashboard_file"]

logger = logging.getLogger("anarchon.dashboard")

_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}
_ACTIONS = ("pause", "resume", "trigger")
#: Slots and times are epoch milliseconds, stored as 64-bit integers.
_INT64 = (-(2**63), 2**63 - 1)

Handler = Callable[[Mapping[str, str], bytes], Awaitable[dict[str, Any]]]


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
    return (resources.files("anarchon_core") / "dashboard" / name).read_bytes(), content_type


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
            if not self._opened and not (self._lent is not None and self._lent()):
                await self._open()
            return Reply(200, await route(params, body))
        except CapabilityError as exc:
            return _error(501, exc)
        except ConfigurationError as exc:
            return _error(400, exc)
        except NoLiveInstanceError as exc:
            return _error(409, exc)
        except BackendError as exc:
            down = {"status": "unavailable", "backend": self.backend.describe(), "error": str(exc)}
            return Reply(503, down)
        except Exception as exc:  # the page shows it; the log keeps the traceback
            logger.exception("dashboard API %s /%s failed", method, path)
            return _error(500, exc)

    def _route(self, method: str, parts: list[str]) -> Handler | Reply:
        reads: dict[str, Handler] = {
            "jobs": self._jobs,
            "runs": self._runs,
            "instances": self._instances,
            "health": self._health,
        }
        if len(parts) == 1 and parts[0] in reads:
            return reads[parts[0]] if method in ("GET", "HEAD") else _not_allowed("GET")
        action = self._action(parts)
        if action is None:
            return Reply(404, {"error": f"no API at {'/'.join(parts)!r}: see docs/api.md"})
        if method != "POST":
            return _not_allowed("POST")
        if not self.allow_actions:
            return Reply(403, {"error": "actions are not enabled on this dashboard"})
        return action

    def _action(self, parts: list[str]) -> Handler | None:
        if parts == ["runs", "cancel"]:
            return self._cancel
        if len(parts) == 3 and parts[0] == "jobs" and parts[2] in _ACTIONS:
            return self._job_action(parts[2], parts[1])
        return None

    # -- reads -------------------------------------------------------------------------
    async def _jobs(self, params: Mapping[str, str], body: bytes) -> dict[str, Any]:
        window = params.get("window")
        window_ms = api.DEFAULT_WINDOW_MS
        if window is not None:
            window_ms = parse_duration_ms(window, what="window")
            if window_ms > api.MAX_WINDOW_MS:  # named as given, not in ms
                raise ConfigurationError(
                    f"window {brief(window)} is not valid: give a duration from 1ms to 7d"
                )
        return await api.jobs(self.backend, window_ms=window_ms, actions=self.allow_actions)

    async def _runs(self, params: Mapping[str, str], body: bytes) -> dict[str, Any]:
        return await api.runs(
            self.backend,
            job=params.get("job") or None,
            status=params.get("status") or None,
            since=_int_param(params, "since"),
            until=_int_param(params, "until"),
            limit=_int_param(params, "limit") or api.DEFAULT_RUNS_LIMIT,
            cursor=params.get("cursor") or None,
        )

    async def _instances(self, params: Mapping[str, str], body: bytes) -> dict[str, Any]:
        return await api.instances(self.backend)

    async def _health(self, params: Mapping[str, str], body: bytes) -> dict[str, Any]:
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

    # -- actions -----------------------------------------------------------------------
    def _job_action(self, verb: str, job: str) -> Handler:
        async def act(params: Mapping[str, str], body: bytes) -> dict[str, Any]:
            if verb == "trigger":
                slot = await operations.trigger(self.backend, job, requested_by=self.requested_by)
                return {"job": job, "slot": slot, "scheduled_at": iso_utc(slot)}
            await (operations.pause if verb == "pause" else operations.resume)(self.backend, job)
            return {"job": job, "paused": verb == "pause"}

        return act

    async def _cancel(self, params: Mapping[str, str], body: bytes) -> dict[str, Any]:
        job, slot = _cancel_body(body)
        cancelled = await operations.cancel(self.backend, job, slot)
        return {"job": job, "slot": slot, "cancelled": cancelled}


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


def _not_allowed(method: str) -> Reply:
    return Reply(405, {"error": f"method not allowed here: use {method}"})


def _error(status: int, exc: BaseException) -> Reply:
    return Reply(status, {"error": str(exc) or type(exc).__name__})
