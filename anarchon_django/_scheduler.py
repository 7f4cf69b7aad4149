"""The project-wide scheduler: a core ``Scheduler`` built from ``settings.ANARCHON``.

Created on first use (``from anarchon_django import scheduler``), never at import of
this package. Its store is built from the ``BACKEND`` URL only when first needed
(starting, or an operation such as ``history()``), so defining jobs in ``jobs.py``
during ``AppConfig.ready()`` neither imports the ORM backend nor opens a connection.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from anarchon_core import Scheduler
from anarchon_core.backend import Backend
from anarchon_core.backends import MemoryBackend, backend_from_url
from anarchon_core.context import RunContext
from anarchon_core.errors import ConfigurationError
from anarchon_core.job import Handler, Job
from anarchon_core.redact import redact_text, redact_url

from ._transactional import store_alias, transactional
from .conf import AnarchonSettings, read_settings
from .tasks import EnqueueableTask, enqueue_handler

__all__ = ["DjangoScheduler", "JobDefinitionError", "get_scheduler", "reset_scheduler"]

H = TypeVar("H", bound=Handler)

#: The system check of each kind of refused job definition (see anarchon_django.checks).
CHECK_IDS = {
    "job name": "anarchon.E011",
    "duration": "anarchon.E012",
    "cron": "anarchon.E013",
    "zone": "anarchon.E014",
    "option": "anarchon.E015",
}
BAD_OPTION, DUPLICATE_JOB = CHECK_IDS["option"], "anarchon.E016"


class JobDefinitionError(ConfigurationError):
    """A job in a ``jobs.py`` is invalid; ``check_id`` is the system check that reports it."""

    def __init__(self, check_id: str, message: str) -> None:
        super().__init__(message)
        self.check_id = check_id


class _MisconfiguredBackend(MemoryBackend):
    """Stands in for a store whose URL is invalid: every use raises the reason."""

    name = "misconfigured"

    def __init__(self, url: str, reason: str) -> None:
        super().__init__()
        self._url, self._reason = url, reason

    async def open(self) -> None:
        raise ConfigurationError(self._reason)

    def describe(self) -> str:
        return redact_url(self._url)


_PLACEHOLDER = MemoryBackend()


class DjangoScheduler(Scheduler):
    """A core :class:`~anarchon_core.Scheduler` that Django projects define jobs on.

    Differences from the core: the store is built from its URL on first use; handlers close
    stale connections around each run (:func:`close_connections`); ``task=`` and
    ``transactional=`` options; definition errors carry a system check id; and it records
    each job's module and the ``cron()`` jobs that took the default zone (for the checks).
    """

    def __init__(self, backend_url: str, **kwargs: Any) -> None:
        #: The URL the store is (or will be) built from.
        self.backend_url = backend_url
        self._backend: Backend | None = None
        super().__init__(_PLACEHOLDER, **kwargs)
        #: names of cron() jobs defined without ``tz`` (evaluated in UTC)
        self.default_zone_jobs: list[str] = []

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            try:
                self._backend = backend_from_url(self.backend_url)
            except ConfigurationError as exc:
                reason = redact_text(str(exc), self.backend_url)
                self._backend = _MisconfiguredBackend(self.backend_url, reason)
        return self._backend

    @backend.setter
    def backend(self, value: Backend) -> None:
        if value is not _PLACEHOLDER:
            self._backend = value

    # -- definitions: the core's hook, Django's options ------------------------------
    adapter_options = frozenset({"task", "task_args", "task_kwargs", "transactional"})

    @property
    def origins(self) -> dict[str, str]:
        """The module that defined each job (the checks name it)."""
        return {name: _module_of(job.handler) for name, job in self.jobs.items()}

    def prepare_handler(
        self, name: str, handler: Handler | None, options: Mapping[str, Any]
    ) -> Handler | None:
        """``task=`` makes the handler; ``transactional=True`` commits it with its
        outcome; every handler closes stale connections around its runs."""
        atomic = options.get("transactional", False)
        if not isinstance(atomic, bool):
            raise JobDefinitionError(
                BAD_OPTION,
                f"job {name!r}: transactional = {atomic!r} is not valid: give True or False",
            )
        if options.keys() & {"task", "task_args", "task_kwargs"}:
            handler = self._task_handler(name, handler, **options)
        if atomic:
            alias = self._transactional_alias(name, handler)
            if handler is not None:  # finished by the store the engine opened
                handler = transactional(handler, alias, lambda: self.backend)
        if handler is None:
            return None
        if name in self.jobs:
            raise JobDefinitionError(
                DUPLICATE_JOB,
                f"job name {name!r} is defined twice: in {_defined_at(self.jobs[name].handler)} "
                f"and in {_defined_at(handler)}; job names must be unique in the project (they "
                f"identify the job in the store)",
            )
        return close_connections(handler)

    def _task_handler(
        self,
        name: str,
        handler: Handler | None,
        task: EnqueueableTask | None = None,
        task_args: Sequence[Any] = (),
        task_kwargs: Mapping[str, Any] | None = None,
        **_: Any,
    ) -> Handler:
        """The handler that enqueues ``task`` (:mod:`anarchon_django.tasks`), its ``__module__``
        the one that defines the job (the caller of ``every()``/``cron()``/``add_job()``)."""
        if handler is not None and task is not None:
            raise JobDefinitionError(
                BAD_OPTION,
                f"job {name!r}: give a handler or task=, not both (handler "
                f"{getattr(handler, '__qualname__', handler)!r}, task="
                f"{getattr(getattr(task, 'func', None), '__qualname__', None) or task!r})",
            )
        if task is None:
            raise JobDefinitionError(
                BAD_OPTION,
                f"job {name!r}: task_args and task_kwargs need task=: give the task they "
                f"are passed to",
            )
        try:
            made = enqueue_handler(task, args=task_args, kwargs=task_kwargs, name=name)
        except ConfigurationError as exc:
            raise JobDefinitionError(BAD_OPTION, str(exc)) from None
        made.__module__ = _caller_module()
        return made

    def _transactional_alias(self, name: str, handler: Handler | None) -> str:
        """The ORM store's alias that ``transactional=True`` commits on (checked now)."""
        if handler is not None and _is_async(handler):
            raise JobDefinitionError(
                BAD_OPTION,
                f"job {name!r}: transactional=True needs a sync handler (def, not async def): "
                f"Django's transaction.atomic does not span await",
            )
        try:
            return store_alias(self.backend_url, name)
        except ConfigurationError as exc:
            raise JobDefinitionError(BAD_OPTION, str(exc)) from None

    if TYPE_CHECKING:  # the core's signatures, plus the forms that take a task

        @overload
        def every(
            self,
            name: str,
            interval: str | dt.timedelta,
            handler: None = None,
            *,
            offset: str | dt.timedelta | None = None,
            task: None = None,
            **options: Any,
        ) -> Callable[[H], H]: ...
        @overload
        def every(
            self,
            name: str,
            interval: str | dt.timedelta,
            handler: H,
            *,
            offset: str | dt.timedelta | None = None,
            **options: Any,
        ) -> Job: ...
        @overload
        def every(
            self,
            name: str,
            interval: str | dt.timedelta,
            handler: None = None,
            *,
            offset: str | dt.timedelta | None = None,
            task: EnqueueableTask,
            task_args: Sequence[Any] = (),
            task_kwargs: Mapping[str, Any] | None = None,
            **options: Any,
        ) -> Job: ...
        def every(self, *args: Any, **kwargs: Any) -> Any: ...

    @overload
    def cron(
        self,
        name: str,
        expression: str,
        handler: None = None,
        *,
        tz: str | None = None,
        day_or: bool = True,
        task: None = None,
        **options: Any,
    ) -> Callable[[H], H]: ...
    @overload
    def cron(
        self,
        name: str,
        expression: str,
        handler: H,
        *,
        tz: str | None = None,
        day_or: bool = True,
        **options: Any,
    ) -> Job: ...
    @overload
    def cron(
        self,
        name: str,
        expression: str,
        handler: None = None,
        *,
        tz: str | None = None,
        day_or: bool = True,
        task: EnqueueableTask,
        task_args: Sequence[Any] = (),
        task_kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Job: ...

    def cron(
        self,
        name: str,
        expression: str,
        handler: Handler | None = None,
        *,
        tz: str | None = None,
        day_or: bool = True,
        **options: Any,
    ) -> Job | Callable[[H], H]:
        """As :meth:`Scheduler.cron`; without ``tz`` the zone is UTC (never ``TIME_ZONE``).

        ``task=`` (a ``django.tasks`` task) defines a job that enqueues it once per slot.
        """
        made = super().cron(name, expression, handler, tz=tz or "UTC", day_or=day_or, **options)
        if tz is None and name not in self.default_zone_jobs:
            self.default_zone_jobs.append(name)
        return made


def check_id(exc: ConfigurationError) -> str | None:
    """The system check that reports a refused job definition, if it is one."""
    if isinstance(exc, JobDefinitionError):
        return exc.check_id
    return CHECK_IDS.get(exc.subject or "")


def _module_of(handler: object) -> str:
    return str(getattr(handler, "__module__", None) or "?")


def _caller_module() -> str:
    """The module of the innermost frame outside anarchon: the one defining the job."""
    frame = sys._getframe(1)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if not module.startswith(("anarchon_core.", "anarchon_django.")):
            return module
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


# -- database connections around each run ------------------------------------------------


def _close_connections(*, stale_only: bool) -> None:
    """Close this thread's connections: before a run the unusable or obsolete ones
    (``close_old_connections()``), after it all of them, since the run's threads end
    with it and a connection left open could never be reused. A connection inside an
    atomic block (a test's ``db`` fixture calling a handler) is left alone."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete() if stale_only else conn.close()


def _is_async(handler: object) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 - async callable objects
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


def close_connections(handler: Handler) -> Handler:
    """Wrap ``handler``: stale connections are closed before a run, its own after it, in
    the thread that runs it (a sync handler's worker thread; for an async handler, the one
    thread its run's ORM calls share, in its own ``ThreadSensitiveContext``)."""
    if _is_async(handler):
        from asgiref.sync import ThreadSensitiveContext, sync_to_async

        @functools.wraps(handler)
        async def run_async(ctx: RunContext) -> Any:
            async with ThreadSensitiveContext():
                close = sync_to_async(_close_connections, thread_sensitive=True)
                await close(stale_only=True)
                try:
                    return await handler(ctx)
                finally:
                    await close(stale_only=False)

        return run_async

    @functools.wraps(handler)
    def run_sync(ctx: RunContext) -> Any:
        _close_connections(stale_only=True)
        try:
            return handler(ctx)
        finally:
            _close_connections(stale_only=False)

    return run_sync


# -- the project's scheduler ------------------------------------------------------------

_lock = threading.Lock()
_current: DjangoScheduler | None = None


def current_settings() -> AnarchonSettings:
    """``settings.ANARCHON`` validated (problems included, never raising)."""
    from django.conf import settings

    return read_settings(getattr(settings, "ANARCHON", None), settings.DATABASES)


def build_scheduler(conf: AnarchonSettings) -> DjangoScheduler:
    """A new scheduler from validated settings (bad values already fell back to defaults)."""
    url = conf.backend
    backend_problems = [p for p in conf.problems if p.id in ("anarchon.E003", "anarchon.E004")]
    scheduler = DjangoScheduler(url, **conf.scheduler_kwargs())
    if backend_problems:
        scheduler.backend = _MisconfiguredBackend(url, backend_problems[0].msg)
    return scheduler


def get_scheduler() -> DjangoScheduler:
    """The project's scheduler, created from the settings on first call."""
    global _current
    with _lock:
        if _current is None:
            _current = build_scheduler(current_settings())
        return _current


def reset_scheduler(new: DjangoScheduler | None = None) -> DjangoScheduler | None:
    """Replace the project's scheduler (tests); returns the previous one."""
    global _current
    with _lock:
        old, _current = _current, new
        return old


def _defined_at(handler: object) -> str:
    """``module (line N)`` of a handler function (``module`` alone for other callables),
    so that a name defined twice in one module names both places."""
    module = _module_of(handler)
    code = getattr(inspect.unwrap(handler), "__code__", None)  # type: ignore[arg-type]
    return f"{module} (line {code.co_firstlineno})" if code is not None else module
