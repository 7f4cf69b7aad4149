"""What the engine's parts share: configuration, counters, logging and store retries."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .backend import wall_clock_ms
from .errors import SchemaVersionError
from .job import Job

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
    stats: Counter[str] = field(default_factory=Counter)


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

    def _log(
        self,
        level: int,
        job: Job | None,
        slot: int | None,
        attempt: int | None,
        msg: str,
        args: tuple[Any, ...],
    ) -> None:
        if not self.logger.isEnabledFor(level):
            return
        extra = {
            "job": job.name if job else None,
            "slot": slot,
            "attempt": attempt,
            "instance": self.instance_id,
        }
        self.logger.log(level, _prefix(job, slot, attempt) + msg, *args, extra=extra)


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
) -> T | None:
    """Call the store until it answers; ``None`` once ``deadline`` (epoch ms) has passed.

    A store outage must never crash a scheduler: every failure is logged, counted and
    retried with capped exponential backoff. Only a newer schema is final.
    """
    delay = 0.05
    while True:
        try:
            return await call()
        except SchemaVersionError:
            raise
        except Exception as exc:
            config.stats["store_errors"] += 1
            if deadline is not None and config.clock() >= deadline:
                log.warn(None, None, None, "%s gave up, store unavailable: %s", what, exc)
                return None
            log.warn(None, None, None, "%s failed, retrying in %.2fs: %s", what, delay, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay_s)
