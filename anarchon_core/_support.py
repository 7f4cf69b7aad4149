"""What the engine's parts share: configuration, telemetry, logging and store retries."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .backend import wall_clock_ms
from .errors import SchemaVersionError
from .job import Job
from .telemetry import Telemetry

__all__ = ["EngineConfig", "EngineLog", "retry_store"]

T = TypeVar("T")


@dataclass
class EngineConfig:
    instance_id: str
    heartbeat_ms: int
    lease_ms: int
    history_retention_ms: int
    logger: logging.Logger
    clock: Callable[[], int] = wall_clock_ms
    telemetry: Telemetry = field(default_factory=Telemetry)


class EngineLog:
    """Log records that carry job, slot, attempt and instance as ``extra`` fields."""

    def __init__(self, logger: logging.Logger, instance_id: str) -> None:
        self.logger = logger
        self.instance_id = instance_id

    def info(
        self, job: Job | None, slot: int | None, attempt: int | None, msg: str, *args: Any
    ) -> None:
        self._log(logging.INFO, job, slot, attempt, msg, args)

    def warn(
        self, job: Job | None, slot: int | None, attempt: int | None, msg: str, *args: Any
    ) -> None:
        self._log(logging.WARNING, job, slot, attempt, msg, args)

    def error(
        self,
        job: Job | None,
        slot: int | None,
        attempt: int | None,
        msg: str,
        *args: Any,
        exc_info: BaseException | None = None,
    ) -> None:
        self._log(logging.ERROR, job, slot, attempt, msg, args, exc_info)

    def _log(
        self,
        level: int,
        job: Job | None,
        slot: int | None,
        attempt: int | None,
        msg: str,
        args: tuple[Any, ...],
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
                    log.warn(job, slot, attempt, "%s gave up, store unavailable: %s", what, exc)
                    return None
                wait = min(delay, left)  # one last try at the deadline, not seconds past it
            log.warn(job, slot, attempt, "%s failed, retrying in %.2fs: %s", what, wait, exc)
            config.telemetry.store_retry(operation)
            await asyncio.sleep(wait)
            delay = min(delay * 2, max_delay_s)
