"""What a handler receives: the identity of its run and a cancellation signal."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import logging
import threading
from collections.abc import MutableMapping
from typing import Any

from .backend import Lease
from .errors import RunCancelled
from .records import Origin, ms_to_datetime

__all__ = ["MAX_META_BYTES", "RunContext", "RunLogger", "bounded_meta"]

#: The most bytes of ``ctx.meta`` (as JSON) that a run's record keeps.
MAX_META_BYTES = 1024

#: Orders a sync handler's first :meth:`RunContext.wait` with the loop's ``_cancel()``.
_SIGNALS_LOCK = threading.Lock()


class RunLogger(logging.LoggerAdapter[logging.Logger]):
    """``ctx.logger``: every record carries ``job``, ``slot``, ``attempt`` and ``instance``.

    Unlike a plain :class:`logging.LoggerAdapter` it keeps the ``extra`` given to a
    call, adding the run's fields to it (the call's own keys win).
    """

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


class RunContext:
    """The run a handler executes, and the signal that tells it to stop.

    The signal is set on timeout, on a lost lease (taken over, cancelled, or no
    heartbeat acknowledged in time) and when the scheduler stops. Async handlers
    ``await ctx.wait_cancelled()`` or are cancelled outright; sync handlers, which run
    in worker threads and cannot be interrupted, poll :attr:`cancelled`, call
    :meth:`raise_if_cancelled`, or sleep with :meth:`wait`.
    """

    def __init__(
        self,
        *,
        job: str,
        slot: int,
        attempt: int,
        instance_id: str,
        origin: Origin,
        loop: asyncio.AbstractEventLoop,
        logger: logging.Logger,
        lease: Lease | None = None,
    ) -> None:
        self.job = job
        self.slot = slot
        self.attempt = attempt
        self.instance_id = instance_id
        self.origin = origin
        #: Grows across a job's runs and attempts: guard writes with ``WHERE fence < :fence``.
        self.fence = slot * 1024 + attempt
        #: The lease this attempt holds (None outside a store, as in ``run_once``). An
        #: adapter that records the outcome inside the handler's own transaction (Django's
        #: ``transactional=True``) proves ownership with it; handlers need not touch it.
        self.lease = lease
        #: Set by such an adapter once it committed the outcome: the engine then reports
        #: the run even if a heartbeat sent after that commit was refused.
        self.recorded = False
        #: How long past the slot this instance waited before claiming: its jitter, or the
        #: jitter window plus a margin for a watcher (0 for takeovers).
        self.jitter_ms = 0
        #: A small JSON-serialisable dict (at most 1 KB) kept in the history record.
        self.meta: dict[str, Any] = {}
        #: Logs with the run's ``job``, ``slot``, ``attempt`` and ``instance`` as ``extra``.
        self.logger = RunLogger(
            logger,
            {"job": job, "slot": slot, "attempt": attempt, "instance": instance_id},
        )
        self._loop = loop
        # The waitable signals are made only for handlers that wait on them: most runs
        # never do, and making both costs as much as the rest of a run's context.
        self._cancelled = False
        self._flag: threading.Event | None = None
        self._event: asyncio.Event | None = None
        self._reason: str | None = None

    def __repr__(self) -> str:
        return (
            f"RunContext(job={self.job!r}, slot={self.slot}, attempt={self.attempt}, "
            f"origin={self.origin!s}, instance_id={self.instance_id!r})"
        )

    @functools.cached_property
    def scheduled_at(self) -> dt.datetime:
        """The slot as an aware UTC datetime."""
        return ms_to_datetime(self.slot)

    @property
    def cancelled(self) -> bool:
        """True once the run must stop; safe to read from any thread."""
        return self._cancelled

    @property
    def cancel_reason(self) -> str | None:
        """Why the run must stop: ``"timeout"``, ``"lease lost"``, ``"stopping"``…"""
        return self._reason

    def raise_if_cancelled(self) -> None:
        """Raise :class:`RunCancelled` if the run must stop."""
        if self._cancelled:
            raise RunCancelled(f"run {self.job}@{self.slot} cancelled: {self._reason}")

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds in a sync handler; True if cancelled meanwhile."""
        with _SIGNALS_LOCK:  # made here or set by _cancel(), never missed between
            if self._flag is None:
                self._flag = threading.Event()
                if self._cancelled:
                    self._flag.set()
            flag = self._flag
        return flag.wait(timeout)

    async def wait_cancelled(self) -> None:
        """Return once the run must stop (for async handlers)."""
        if self._event is None:
            self._event = asyncio.Event()
            if self._cancelled:
                self._event.set()
        await self._event.wait()

    def _cancel(self, reason: str) -> None:
        """Set the signal; called on the scheduler's loop thread only."""
        with _SIGNALS_LOCK:
            if self._cancelled:
                return
            self._reason = reason
            self._cancelled = True
            flag = self._flag
        if flag is not None:
            flag.set()
        if self._event is not None:
            self._event.set()


def bounded_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """``ctx.meta`` as a run's record keeps it: JSON-serialisable and at most
    :data:`MAX_META_BYTES`, or a ``meta_error`` that says why not. Public for adapters
    that record a run's outcome themselves (the Django ORM's ``transactional=True``)."""
    if not meta:
        return {}
    try:
        size = len(json.dumps(meta).encode())
    except (TypeError, ValueError) as exc:
        return {"meta_error": f"ctx.meta is not JSON-serialisable: {exc}"}
    if size > MAX_META_BYTES:
        return {"meta_error": f"ctx.meta is {size} bytes; at most {MAX_META_BYTES} are kept"}
    return dict(meta)
