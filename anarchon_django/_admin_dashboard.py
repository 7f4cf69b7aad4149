"""The dashboard inside the Django admin: the page, its two files and the JSON API.

Mounted by :class:`anarchon_django.admin.HistoryRecordAdmin` under ``…/historyrecord/
dashboard/``, every view wrapped in ``admin_site.admin_view`` (staff session,
``never_cache``, ``csrf_protect``). The answers come from the core's
:class:`~anarchon_core.web.endpoints.DashboardAPI` over a store of its own, on one loop
thread per process (a backend belongs to the loop that opened it, and Django gives a
view no lasting loop): started at the first request, closed at exit, started afresh in
a forked child. Each action needs its model permission (:data:`ACTION_PERMISSIONS`,
403 otherwise), a JSON body and the admin's own origin
(:func:`anarchon_core.web.http_guard.action_refusal`), beyond Django's CSRF check.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import socket
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.http.request import RawPostDataException
from django.views.decorators.csrf import ensure_csrf_cookie

from anarchon_core.backend import Backend
from anarchon_core.backends import backend_from_url
from anarchon_core.errors import ConfigurationError
from anarchon_core.loop_thread import LoopThread
from anarchon_core.redact import redact_text
from anarchon_core.web.endpoints import ROUTES, DashboardAPI, Reply
from anarchon_core.web.http_guard import (
    SECURITY_HEADERS,
    HttpAnswer,
    action_refusal,
    file_answer,
    json_answer,
)

logger = logging.getLogger("anarchon.django.admin")
T = TypeVar("T")

#: How long a request waits for the store's answer before answering 504.
TIMEOUT_S = 30.0

#: The permission each action (a route of ``endpoints.ROUTES``) needs: a model permission.
ACTION_PERMISSIONS = {
    "pause": "anarchon_django.pause_job",
    "resume": "anarchon_django.pause_job",
    "trigger": "anarchon_django.trigger_job",
    "cancel": "anarchon_django.cancel_run",
    # Stored definitions: Django's own model permissions of the jobs table.
    "add_definition": "anarchon_django.add_job",
    "update_definition": "anarchon_django.change_job",
    "remove_definition": "anarchon_django.delete_job",
}

# CsrfViewMiddleware checks the Referer over HTTPS, so the admin keeps it on its own origin.
_SECURITY_HEADERS = {**SECURITY_HEADERS, "Referrer-Policy": "same-origin"}


def unavailable_reply(url: str, exc: BaseException) -> Reply:
    """The 503 for a ``BACKEND`` the dashboard cannot build: the reason, never a secret
    (staff users who may read the dashboard need not be those who may read the settings)."""
    error = redact_text(str(exc), url)
    return Reply(503, {"status": "unavailable", "backend": "?", "error": error})


class _LoopHost:
    """The ``DashboardAPI`` of this process, living on a loop thread of its own."""

    def __init__(self) -> None:
        self.thread = LoopThread("anarchon-admin-dashboard")
        self.endpoints: DashboardAPI | None = None
        self.actions_lock = asyncio.Lock()  # bound to the loop thread's loop at first use

    def call(
        self, request_by: str | None, method: str, path: str, params: Any, body: bytes
    ) -> Reply:
        """Answer one API request on the loop (``request_by``: an action's operator)."""
        try:
            return self.thread.call(self._handle(request_by, method, path, params, body), TIMEOUT_S)
        except TimeoutError:
            return Reply(504, {"error": f"the store did not answer within {TIMEOUT_S:g} s"})

    def store_call(self, call: Callable[[Backend], Awaitable[T]]) -> T:
        """``call(backend)`` on the loop, with the store open (the definition pages).

        :raises TimeoutError: the store did not answer within :data:`TIMEOUT_S`.
        :raises ConfigurationError: ``BACKEND`` names no store that can be built.
        """

        async def run() -> T:
            endpoints = self._endpoints()
            if isinstance(endpoints, Reply):
                raise ConfigurationError(str(endpoints.body["error"]))
            return await call(await endpoints.store())

        return self.thread.call(run(), TIMEOUT_S)

    def _endpoints(self) -> DashboardAPI | Reply:
        """The API over the project's store, built at first use (a 503 if it cannot be)."""
        if self.endpoints is None:
            from ._scheduler import get_scheduler

            url = get_scheduler().backend_url
            try:
                backend = backend_from_url(url)
            except Exception as exc:  # a bad BACKEND: the checks report it too
                return unavailable_reply(url, exc)
            self.endpoints = DashboardAPI(
                backend,
                allow_actions=True,  # gated per user by the views, before this point
                requested_by=f"django-admin@{socket.gethostname()}",
            )
        return self.endpoints

    async def _handle(
        self, request_by: str | None, method: str, path: str, params: Any, body: bytes
    ) -> Reply:
        endpoints = self._endpoints()
        if isinstance(endpoints, Reply):
            return endpoints
        if request_by is None:
            return await endpoints.handle(method, path, params, body)
        # Actions are rare: one at a time, so requested_by names this request's operator.
        async with self.actions_lock:
            endpoints.requested_by = request_by
            return await endpoints.handle(method, path, params, body)

    def close(self) -> None:
        """Close the backend (if a request opened it) and stop the loop; idempotent."""
        if self.thread.usable and self.endpoints is not None:
            try:
                self.thread.call(self.endpoints.close(), 10)
            except Exception:
                logger.exception("closing the admin dashboard's store failed")
        self.thread.close(10)


_lock = threading.Lock()
_host: _LoopHost | None = None


def _get_host() -> _LoopHost:
    global _host
    with _lock:
        if _host is None or not _host.thread.usable:
            _host = _LoopHost()
            atexit.register(_host.close)
        return _host


def store_call(call: Callable[[Backend], Awaitable[T]]) -> T:
    """``call(backend)`` on this process's store (the dashboard's), open."""
    return _get_host().store_call(call)


def close_dashboard() -> None:
    """Close the dashboard's store connection and loop thread (tests, shutdown); the next
    request starts afresh (re-reading ``ANARCHON["BACKEND"]``)."""
    global _host
    with _lock:
        host, _host = _host, None
    if host is not None and host.thread.pid == os.getpid():
        host.close()
        atexit.unregister(host.close)


# -- permissions ------------------------------------------------------------------------


def required_permission(method: str, path: str) -> str | None:
    """The permission a request needs beyond viewing (``None``: a read, or no such API)."""
    if method.upper() in ("GET", "HEAD", "OPTIONS"):
        return None
    parts = [p for p in path.strip("/").split("/") if p]
    route = next((r for r in ROUTES if r.action and r.match(parts) is not None), None)
    return None if route is None else ACTION_PERMISSIONS[route.name]


def may_act(user: Any) -> bool:
    """Whether ``user`` holds any action permission (the page then shows the buttons)."""
    return any(user.has_perm(perm) for perm in set(ACTION_PERMISSIONS.values()))


# -- views (wrapped in admin_site.admin_view by the ModelAdmin) ----------------------------


def _file_response(name: str) -> HttpResponse:
    answer = file_answer(name, headers=_SECURITY_HEADERS)
    if answer.status == 404:
        raise Http404(f"no dashboard file {name!r}")
    return _respond(answer)


@ensure_csrf_cookie
def page_view(request: HttpRequest) -> HttpResponse:
    """The page; sets the ``csrftoken`` cookie that it sends back as ``X-CSRFToken``."""
    return _file_response("index.html")


def asset_view(request: HttpRequest, name: str) -> HttpResponse:
    """``dashboard.css`` and ``dashboard.js`` (relative to the page)."""
    if name == "index.html":
        raise Http404("the page is served at dashboard/")
    return _file_response(name)


def api_view(request: HttpRequest, path: str) -> HttpResponse:
    """``api/<path>``: checks the action permission, then asks the ``DashboardAPI``."""
    method = request.method or "GET"
    needed = required_permission(method, path)
    user: Any = request.user
    request_by: str | None = None
    if needed is not None:
        if not user.has_perm(needed):
            reply = Reply(403, {"error": f"you need the permission {needed!r} for this action"})
            return _json_response(reply)
        refusal = action_refusal(
            request.headers,
            host=request.get_host(),
            trusted_origins=getattr(settings, "CSRF_TRUSTED_ORIGINS", ()),
        )
        if refusal is not None:
            return _json_response(refusal)
        request_by = f"django-admin:{user.get_username()}@{socket.gethostname()}"
        logger.info("%s: %s %s", user.get_username(), method, path)
    params: Mapping[str, str] = request.GET.dict()
    body = _body(request) if method == "POST" else b""
    reply = _get_host().call(request_by, method, path, params, body)
    if reply.status == 200 and path.strip("/") == "jobs" and "actions" in reply.body:
        reply = Reply(200, {**reply.body, "actions": may_act(user)})
    return _json_response(reply)


def _body(request: HttpRequest) -> bytes:
    """The raw body; empty when a form body was parsed already (CSRF reads the form)."""
    try:
        return request.body
    except RawPostDataException:
        return b""


def _json_response(reply: Reply) -> HttpResponse:
    return _respond(json_answer(reply, headers=_SECURITY_HEADERS))


def _respond(answer: HttpAnswer) -> HttpResponse:
    return HttpResponse(answer.body, status=answer.status, headers=answer.headers)
