"""An event loop in a daemon thread: how sync hosts run the async core.

Django views, WSGI servers and Celery beat have no event loop of their own to lend;
the core's scheduler and its dashboard API are async. :class:`LoopThread` owns one
loop on one daemon thread (so that a store that never answers cannot keep the process
alive), hands coroutines to it from any thread and waits for them with a bound. It
belongs to the process that made it: after a fork, the child gets a dead thread, so
hosts check :attr:`LoopThread.usable` and make a new one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """One event loop running on a daemon thread named ``name``, started at once."""

    def __init__(self, name: str) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    @property
    def usable(self) -> bool:
        """Whether coroutines can still run here: not closed, same process, thread alive."""
        return not self._closed and self.pid == os.getpid() and self._thread.is_alive()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; the future is for the calling thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop and wait at most ``timeout`` s for its result.

        :raises TimeoutError: it did not end in time (it is cancelled on the loop).
        """
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout:g} s") from None

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop and wait up to ``timeout`` s for the thread; idempotent.

        Callable from the loop's own thread (it then does not wait for itself), and
        a no-op in a forked child, where the thread does not exist.
        """
        if self._closed:
            return
        self._closed = True
        if self.pid != os.getpid():
            return
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()
