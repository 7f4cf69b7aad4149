"""Running one handler call: async on the loop, sync in a daemon worker thread.

Sync handlers get a thread of their own rather than the loop's default executor
because that executor's threads are joined at interpreter exit: a handler that
ignores its cancellation signal would then keep a stopping process alive past its
grace period. Daemon threads are abandoned instead; their later writes are fenced.

Either way the handler runs in a copy of the caller's :mod:`contextvars` context (as
``asyncio`` tasks and ``asyncio.to_thread`` do), so the run's tracing span is current
in a sync handler too.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import traceback
from typing import Any

from ..context import RunContext
from ..job import Job

__all__ = ["describe_exception", "start_handler"]


def start_handler(job: Job, ctx: RunContext) -> asyncio.Future[Any]:
    """Start ``job.handler(ctx)`` and return a future of its result on the running loop."""
    if job.is_async:
        return asyncio.ensure_future(job.handler(ctx))
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def deliver(result: Any, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result, exc = context.run(job.handler, ctx), None
        except BaseException as caught:  # delivered to the runner, which records it
            result, exc = None, caught
        with contextlib.suppress(RuntimeError):  # a closed loop: abandoned at stop
            loop.call_soon_threadsafe(deliver, result, exc)

    thread = threading.Thread(target=target, name=f"anarchon:{job.name}", daemon=True)
    thread.start()
    return future


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` plus the innermost frames: enough to act on, bounded later."""
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3)
    return "".join(frames).strip()
