"""What the engine's parts share: configuration, telemetry, logging and store retries."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypedDict, TypeVar

from ..backend import wall_clock_ms
from ..errors import SchemaVersionError
from ..job import Job
from ..telemetry import Telemetry

__all__ = ["Coalescer", "EngineConfig", "EngineLog", "Where", "retry_store"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class EngineConfig:
    instance_id: str
    heartbeat_ms: int
    lease_ms: int
    history_retention_ms: int
    logger: logging.Logger
    clock: Callable[[], int] = wall_clock_ms
    telemetry: Telemetry = field(default_factory=Telemetry)
    #: Instances that claim each run (``None``: every instance); see :mod:`.candidates`.
    candidates: int | None = None
    #: The targets this instance holds (stored definitions name one), for the registry.
    targets: frozenset[str] = frozenset()


class Where(TypedDict, total=False):
    """The run a log record concerns, as :class:`EngineLog`'s keywords."""

    job: Job | None
    slot: int | None
    attempt: int | None


class EngineLog:
    """Log records that carry job, slot, attempt and instance as ``extra`` fields.

    ``log.warn("claim failed: %s", exc, job=job, slot=slot)``: the message first, the
    run it concerns by keyword (each optional).
    """

    def __init__(self, logger: logging.Logger, instance_id: str) -> None:
        self.logger = logger
        self.instance_id = instance_id

    def info(
        self,
        msg: str,
        *args: Any,
        job: Job | None = None,
        slot: int | None = None,
        attempt: int | None = None,
    ) -> None:
        self._log(logging.INFO, msg, args, job, slot, attempt)

    def warn(
        self,
        msg: str,
        *args: Any,
        job: Job | None = None,
        slot: int | None = None,
        attempt: int | None = None,
    ) -> None:
        self._log(logging.WARNING, msg, args, job, slot, attempt)

    def error(
        self,
        msg: str,
        *args: Any,
        job: Job | None = None,
        slot: int | None = None,
        attempt: int | None = None,
        exc_info: BaseException | None = None,
    ) -> None:
        self._log(logging.ERROR, msg, args, job, slot, attempt, exc_info)

    def _log(
        self,
        level: int,
        msg: str,
        args: tuple[Any, ...],
        job: Job | None,
        slot: int | None,
        attempt: int | None,
        exc_info: BaseException | None = None,
    ) -> None:
        if not self.logger.isEnabledFor(level):
            return
        extra = {
            "job": job.name if job else None,
            "slot": slot,
            "attempt": attempt,
            "instance": self.instance_id,
        }
        self.logger.log(
            level, _prefix(job, slot, attempt) + msg, *args, extra=extra, exc_info=exc_info
        )


def _prefix(job: Job | None, slot: int | None, attempt: int | None) -> str:
    if job is None:
        return ""
    where = job.name if slot is None else f"{job.name}@{slot}"
    return f"[{where}#{attempt}] " if attempt else f"[{where}] "


async def retry_store(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    config: EngineConfig,
    log: EngineLog,
    deadline: int | None = None,
    max_delay_s: float = 5.0,
    operation: str | None = None,
    job: Job | None = None,
    slot: int | None = None,
    attempt: int | None = None,
) -> T | None:
    """Call the store until it answers; ``None`` once ``deadline`` (epoch ms) has passed.

    A store outage must never crash a scheduler: every failure is logged, counted and
    retried with capped exponential backoff. Only a newer schema is final.
    ``operation`` (default ``what``) labels the metrics; ``job``, ``slot`` and
    ``attempt`` (where known) the log records and metrics.
    """
    operation = operation or what
    job_name = job.store_name if job is not None else None
    delay = 0.05
    while True:
        try:
            return await call()
        except SchemaVersionError:
            raise
        except Exception as exc:
            config.telemetry.store_error(operation, job_name)
            wait = delay
            if deadline is not None:
                left = (deadline - config.clock()) / 1000
                if left <= 0:
                    log.warn(
                        "%s gave up, store unavailable: %s",
                        what,
                        exc,
                        job=job,
                        slot=slot,
                        attempt=attempt,
                    )
                    return None
                wait = min(delay, left)  # one last try at the deadline, not seconds past it
            log.warn(
                "%s failed, retrying in %.2fs: %s",
                what,
                wait,
                exc,
                job=job,
                slot=slot,
                attempt=attempt,
            )
            config.telemetry.store_retry(operation)
            await asyncio.sleep(wait)
            delay = min(delay * 2, max_delay_s)


class Coalescer(Generic[R, T]):
    """Sends the single calls made in one event-loop iteration as one batch call.

    A hundred runs that end together (their slot was the same) would otherwise make a
    hundred store round trips; their finishes go as one ``finish_many`` instead. A
    batch that fails fails every call in it, and each caller retries on its own: the
    retries of one iteration form a batch again.
    """

    def __init__(
        self,
        single: Callable[[R], Awaitable[T]],
        batch: Callable[[list[R]], Awaitable[list[T]]],
        limit: int,
    ) -> None:
        self._single = single
        self._batch = batch
        self._limit = limit
        self._queue: list[tuple[R, asyncio.Future[T]]] = []
        self._flush_soon: asyncio.Handle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def call(self, item: R) -> T:
        """``item``'s answer, sent with whatever else is called in this iteration."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.append((item, future))
        if self._flush_soon is None:
            self._flush_soon = loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        self._flush_soon = None
        queue, self._queue = self._queue, []
        for start in range(0, len(queue), self._limit):
            task = asyncio.ensure_future(self._send(queue[start : start + self._limit]))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, calls: list[tuple[R, asyncio.Future[T]]]) -> None:
        try:
            if len(calls) == 1:
                answers = [await self._single(calls[0][0])]
            else:
                answers = await self._batch([item for item, _ in calls])
        except BaseException as exc:
            for _, future in calls:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), answer in zip(calls, answers, strict=True):
            if not future.done():  # else its caller was cancelled
                future.set_result(answer)
