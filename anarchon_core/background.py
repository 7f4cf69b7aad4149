"""Background-thread mode for sync hosts (Django, Celery beat, WSGI servers).

A thin wrapper with the same method names as :class:`Scheduler`, made synchronous:
it runs the one async engine on an event loop in a daemon thread of its own, so
there is never a second copy of the scheduling logic.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .definitions import Definition
from .errors import SchedulerStateError
from .loop_thread import LoopThread
from .scheduler import Scheduler
from .stored_jobs import SyncReport

__all__ = ["BackgroundScheduler"]

logger = logging.getLogger("anarchon")

T = TypeVar("T")

#: Seconds allowed beyond the grace period for the loop to wind down.
STOP_SLACK_S = 5.0
#: Seconds a call on the store (a definition change) may take.
CALL_TIMEOUT_S = 30.0


class BackgroundScheduler:
    """Run ``scheduler`` in a daemon thread; ``start()`` and ``stop()`` block the caller."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._host: LoopThread | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._host is not None and self._host.usable

    def start(self, timeout: float = 30.0) -> None:
        """Start the scheduler in its thread; raise what its ``start()`` raised.

        :raises SchedulerStateError: already running.
        """
        with self._lock:
            if self.running:
                raise SchedulerStateError("the background scheduler is already running")
            host = self._host = LoopThread("anarchon-scheduler")
            try:
                host.call(self.scheduler.start(), timeout)
            except BaseException:
                host.close(STOP_SLACK_S)
                self._host = None
                raise

    def stop(self, grace_ms: int | None = None) -> None:
        """Stop with hand-over, bounded by the grace period. Idempotent; never raises."""
        with self._lock:
            host, self._host = self._host, None
        if host is None:
            return
        grace = self.scheduler.grace_ms if grace_ms is None else grace_ms
        try:
            host.call(self.scheduler.stop(grace_ms), grace / 1000 + STOP_SLACK_S)
        except Exception:  # bounded shutdown: report, never raise into the host
            logger.exception("background scheduler did not stop cleanly")
        finally:
            host.close(STOP_SLACK_S)

    # -- stored definitions, synchronously -------------------------------------------
    def _call(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run a store call on the engine's loop while running (its connections live
        there), else on a loop of its own."""
        host = self._host
        if host is not None and host.usable:
            return host.call(make(), CALL_TIMEOUT_S)
        return asyncio.run(make())

    def add_definition(self, definition: Definition) -> Definition:
        """:meth:`Scheduler.add_definition`, from synchronous code."""
        return self._call(lambda: self.scheduler.add_definition(definition))

    def update_definition(self, definition: Definition) -> Definition:
        """:meth:`Scheduler.update_definition`, from synchronous code."""
        return self._call(lambda: self.scheduler.update_definition(definition))

    def remove_definition(self, name: str, *, version: int) -> None:
        """:meth:`Scheduler.remove_definition`, from synchronous code."""
        self._call(lambda: self.scheduler.remove_definition(name, version=version))

    def get_definition(self, name: str) -> Definition | None:
        """:meth:`Scheduler.get_definition`, from synchronous code."""
        return self._call(lambda: self.scheduler.get_definition(name))

    def definitions(self) -> list[Definition]:
        """:meth:`Scheduler.definitions`, from synchronous code."""
        return self._call(self.scheduler.definitions)

    def sync_code_jobs(self) -> SyncReport:
        """:meth:`Scheduler.sync_code_jobs`, from synchronous code."""
        return self._call(self.scheduler.sync_code_jobs)
