"""Jobs and their options, validated when they are defined.

Options exist at two levels: the :class:`~anarchon_core.Scheduler` holds defaults and
each job may override any of :data:`JOB_OPTIONS`. Validation happens here, at
definition time, so that a typo stops the process before it claims anything.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, TypeAlias

from .context import RunContext
from .durations import parse_duration_ms
from .errors import ConfigurationError
from .names import store_name, validate_job_name
from .schedules import Schedule

__all__ = ["JOB_OPTIONS", "Handler", "Job", "JobOptions"]

Handler: TypeAlias = Callable[[RunContext], Awaitable[Any] | Any]

#: The misfire grace (claim horizon) is the gap to the next slot, at most this.
MAX_MISFIRE_GRACE_MS = 3_600_000
#: The longest claim horizon (misfire grace or catch-up window) a job may have.
MAX_HORIZON_MS = 7 * 86_400_000
#: Catch-up never handles more slots than this, whatever the window.
MAX_CATCH_UP_SLOTS = 1000

CATCH_UP_POLICIES = ("none", "latest", "all")
OVERLAP_POLICIES = ("skip", "allow")


@dataclass(frozen=True, slots=True)
class JobOptions:
    """Per-job behaviour; defaults follow SPEC §8."""

    jitter_ms: int = 500
    timeout_ms: int | None = None
    catch_up: str = "none"
    catch_up_window_ms: int = 86_400_000
    max_attempts: int = 3
    retries: int = 0
    retry_backoff_ms: int = 1000
    overlap: str = "skip"
    misfire_grace_ms: int | None = None


#: The option names accepted by ``Scheduler(...)`` and each job definition.
JOB_OPTIONS = frozenset(
    {f.name for f in fields(JobOptions)} - {"catch_up_window_ms"} | {"catch_up_window"}
)


def _validate(key: str, value: Any, owner: str) -> Any:
    where = f"{owner}: option {key}"
    if key in ("jitter_ms", "retries", "retry_backoff_ms"):
        return _int(value, where, minimum=0)
    if key == "max_attempts":  # the fence is slot × 1024 + attempt
        return _int(value, where, minimum=1, maximum=1023)
    if key == "timeout_ms":
        return None if value is None else _int(value, where, minimum=1)
    if key == "misfire_grace_ms":  # run records must outlive it: keep it bounded
        return None if value is None else _int(value, where, minimum=1, maximum=MAX_HORIZON_MS)
    if key == "catch_up":
        return _choice(value, CATCH_UP_POLICIES, where)
    if key == "overlap":
        return _choice(value, OVERLAP_POLICIES, where)
    if key == "catch_up_window":
        window = parse_duration_ms(value, what=where)
        if window > MAX_HORIZON_MS:
            raise ConfigurationError(f"{where} = {value!r} is not valid: at most 7d")
        return window
    accepted = ", ".join(sorted(JOB_OPTIONS))
    raise ConfigurationError(f"{owner}: unknown option {key!r}; accepted options: {accepted}")


def validate_option_keys(options: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """Map public option names to :class:`JobOptions` fields, rejecting unknown ones."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        checked = _validate(key, value, owner)
        out["catch_up_window_ms" if key == "catch_up_window" else key] = checked
    return out


def _int(value: Any, where: str, *, minimum: int, maximum: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ConfigurationError(
            f"{where} = {value!r} is not valid: give an integer {bound} (milliseconds "
            f"for *_ms options)"
        )
    return value


def _choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise ConfigurationError(
            f"{where} = {value!r} is not valid: use one of " + ", ".join(map(repr, choices))
        )
    return str(value)


@dataclass(frozen=True, slots=True)
class Job:
    """A named schedule plus a handler; ``store_name`` is its identity in the store."""

    name: str
    store_name: str
    schedule: Schedule
    handler: Handler
    options: JobOptions
    explicit: frozenset[str]
    """Option names given explicitly (on the job or the scheduler), for capability checks."""
    fingerprint: str
    """A short hash of what replicas must agree on: the schedule and the run options."""

    @classmethod
    def define(
        cls,
        name: str,
        schedule: Schedule,
        handler: Handler,
        *,
        namespace: str | None,
        defaults: JobOptions,
        explicit_defaults: frozenset[str],
        options: Mapping[str, Any],
    ) -> Job:
        validate_job_name(name)
        _check_handler(name, handler)
        owner = f"job {name!r}"
        checked = validate_option_keys(options, owner)
        resolved = replace(defaults, **checked)
        return cls(
            name=name,
            store_name=store_name(namespace, name),
            schedule=schedule,
            handler=handler,
            options=resolved,
            explicit=explicit_defaults | frozenset(checked),
            fingerprint=_fingerprint(schedule, resolved),
        )

    @property
    def is_async(self) -> bool:
        handler = self.handler
        call = getattr(handler, "__call__", None)  # noqa: B004 - async callable objects
        return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)

    def horizon_ms(self, slot: int) -> int:
        """How late a slot may still be claimed: the misfire grace (SPEC §8)."""
        if self.options.misfire_grace_ms is not None:
            return self.options.misfire_grace_ms
        gap = self.schedule.next_slot(slot) - slot
        return min(gap, MAX_MISFIRE_GRACE_MS)

    def jitter_bound_ms(self, slot: int) -> int:
        """Jitter for a slot is uniform in [0, min(jitter_ms, gap to next slot / 4)]."""
        gap = self.schedule.next_slot(slot) - slot
        return min(self.options.jitter_ms, gap // 4)

    def describe(self) -> str:
        return self.schedule.describe()

    def spec(self) -> dict[str, Any]:
        """What the instance registry shows of this job (JSON-serialisable)."""
        options = self.options
        return {
            "name": self.name,
            "schedule": self.schedule.describe(),
            "tz": self.schedule.tz,
            "canonical": self.schedule.canonical(),
            "fingerprint": self.fingerprint,
            "options": {
                "jitter_ms": options.jitter_ms,
                "timeout_ms": options.timeout_ms,
                "catch_up": options.catch_up,
                "max_attempts": options.max_attempts,
                "retries": options.retries,
                "overlap": options.overlap,
            },
        }


def _fingerprint(schedule: Schedule, options: JobOptions) -> str:
    """Computed once per job: claims carry it, so replicas that disagree can be found."""
    data = {
        "schedule": schedule.fingerprint(),
        "options": {f.name: getattr(options, f.name) for f in fields(options)},
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _check_handler(name: str, handler: object) -> None:
    if not callable(handler):
        raise ConfigurationError(
            f"job {name!r}: handler {handler!r} is not callable: give a function taking ctx"
        )
    try:
        inspect.signature(handler).bind(None)
    except TypeError:
        raise ConfigurationError(
            f"job {name!r}: handler {getattr(handler, '__qualname__', handler)!r} must accept "
            f"exactly one positional argument (ctx), e.g. 'def handler(ctx): ...'"
        ) from None
    except ValueError:  # builtins without a signature: accept
        pass
