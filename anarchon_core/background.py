"""Background-thread mode for sync hosts (Django, Celery beat, WSGI servers).

A thin wrapper with the same method names as :class:`Scheduler`, made synchronous:
it runs the one async engine on an event loop in a daemon thread of its own, so
there is never a second copy of the scheduling logic.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future
from typing import Any

from .errors import SchedulerStateError
from .scheduler import Scheduler

__all__ = ["BackgroundScheduler"]

logger = logging.getLogger("anarchon")

#: Seconds allowed beyond the grace period for the loop to wind down.
STOP_SLACK_S = 5.0


class BackgroundScheduler:
    """Run ``scheduler`` in a daemon thread; ``start()`` and ``stop()`` block the caller."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 30.0) -> None:
        """Start the scheduler in its thread; raise what its ``start()`` raised.

        :raises SchedulerStateError: already running.
        """
        with self._lock:
            if self.running:
                raise SchedulerStateError("the background scheduler is already running")
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=self._serve, args=(loop,), name="anarchon-scheduler", daemon=True
            )
            self._loop, self._thread = loop, thread
            thread.start()
            try:
                self._submit(self.scheduler.start()).result(timeout)
            except BaseException:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(STOP_SLACK_S)
                self._loop = self._thread = None
                raise

    def stop(self, grace_ms: int | None = None) -> None:
        """Stop with hand-over, bounded by the grace period. Idempotent; never raises."""
        with self._lock:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None:
                return
            self._loop = self._thread = None
        grace = self.scheduler.grace_ms if grace_ms is None else grace_ms
        try:
            self._submit(self.scheduler.stop(grace_ms), loop).result(grace / 1000 + STOP_SLACK_S)
        except Exception:  # bounded shutdown: report, never raise into the host
            logger.exception("background scheduler did not stop cleanly")
        finally:
            if not loop.is_closed():
                loop.call_soon_threadsafe(loop.stop)
            if thread is not threading.current_thread():
                thread.join(STOP_SLACK_S)

    def _submit(self, coro: Any, loop: asyncio.AbstractEventLoop | None = None) -> Future[Any]:
        target = loop or self._loop
        assert target is not None
        return asyncio.run_coroutine_threadsafe(coro, target)

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.close()
