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
from .durations import MAX_DURATION_MS, format_duration_ms, parse_duration_ms, validate_ms
from .errors import ConfigurationError, refusing
from .names import store_name, validate_job_name
from .redact import brief
from .schedules import Schedule

__all__ = ["JOB_OPTIONS", "Handler", "Job", "JobOptions", "check_retries", "resolve_options"]

Handler: TypeAlias = Callable[[RunContext], Awaitable[Any] | Any]

#: The misfire grace (claim horizon) is the gap to the next slot, at most this.
MAX_MISFIRE_GRACE_MS = 3_600_000
#: The longest claim horizon (misfire grace or catch-up window) a job may have.
MAX_HORIZON_MS = 7 * 86_400_000
#: Catch-up never handles more slots than this, whatever the window.
MAX_CATCH_UP_SLOTS = 1000
#: The fence is ``slot × 1024 + attempt``: attempts must fit in 10 bits.
MAX_ATTEMPTS = 1023
#: A retry after the store's horizon is never claimed, so the backoffs of every retry
#: of a run together may not exceed the longest horizon.
MAX_RETRY_WAIT_MS = MAX_HORIZON_MS

CATCH_UP_POLICIES = ("none", "latest", "all")
OVERLAP_POLICIES = ("skip", "allow")


@dataclass(frozen=True, slots=True)
class JobOptions:
    """Per-job behaviour; defaults are listed in docs/jobs.md."""

    jitter_ms: int = 500
    timeout_ms: int | None = None
    catch_up: str = "latest"
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
    """One option, within its bound: every duration fits the stores' 64-bit ms columns."""
    where = f"{owner}: option {key}"
    if key == "jitter_ms":  # the jitter used is also clamped to a quarter of the gap
        return validate_ms(value, where, maximum=MAX_DURATION_MS)
    if key == "retry_backoff_ms":
        return validate_ms(value, where, maximum=MAX_RETRY_WAIT_MS)
    if key == "retries":  # more than max_attempts - 1 never run
        return _count(value, where, minimum=0, maximum=MAX_ATTEMPTS - 1)
    if key == "max_attempts":
        return _count(value, where, minimum=1, maximum=MAX_ATTEMPTS)
    if key == "timeout_ms":
        return None if value is None else validate_ms(value, where, minimum=1, optional=True)
    if key == "misfire_grace_ms":  # run records must outlive it: keep it bounded
        if value is None:
            return None
        return validate_ms(value, where, minimum=1, maximum=MAX_HORIZON_MS, optional=True)
    if key == "catch_up":
        return _choice(value, CATCH_UP_POLICIES, where)
    if key == "overlap":
        return _choice(value, OVERLAP_POLICIES, where)
    if key == "catch_up_window":
        return parse_duration_ms(value, what=where, maximum=MAX_HORIZON_MS)
    accepted = ", ".join(sorted(JOB_OPTIONS))
    raise ConfigurationError(f"{owner}: unknown option {brief(key)}; accepted options: {accepted}")


def validate_option_keys(options: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """Map public option names to :class:`JobOptions` fields, rejecting unknown ones."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        checked = _validate(key, value, owner)
        out["catch_up_window_ms" if key == "catch_up_window" else key] = checked
    return out


def resolve_options(
    defaults: JobOptions, options: Mapping[str, Any], owner: str
) -> tuple[JobOptions, frozenset[str]]:
    """``defaults`` with ``options`` applied, each option and their combination checked.

    Returns the options and the names given explicitly. Adapters that classify errors
    (the Django checks) call this before defining a job, so that they see every bound.
    """
    checked = validate_option_keys(options, owner)
    resolved = replace(defaults, **checked)
    check_retries(resolved, owner)
    return resolved, frozenset(checked)


def check_retries(options: JobOptions, owner: str) -> JobOptions:
    """Refuse retries whose doubling backoffs add up past the longest claim horizon.

    Retry ``n`` waits ``retry_backoff_ms × 2^(n-1)``; a retry due after the run's
    horizon is never claimed (it ends ``failed``), so a setting that waits longer than
    :data:`MAX_RETRY_WAIT_MS` in all can only be a mistake, and its products would
    outgrow the stores' 64-bit columns.
    """
    retries = min(options.retries, options.max_attempts - 1)
    total = options.retry_backoff_ms * (2**retries - 1)
    if total > MAX_RETRY_WAIT_MS:
        raise ConfigurationError(
            f"{owner}: retries={options.retries} with retry_backoff_ms="
            f"{options.retry_backoff_ms} (doubling, max_attempts={options.max_attempts}) "
            f"waits {format_duration_ms(total)} in all, past the longest claim horizon: "
            f"at most {format_duration_ms(MAX_RETRY_WAIT_MS)}; give fewer retries or a "
            f"shorter retry_backoff_ms"
        )
    return options


def _count(value: Any, where: str, *, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ConfigurationError(
            f"{where} = {brief(value)} is not valid: give an integer between {minimum} "
            f"and {maximum}"
        )
    return value


def _choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigurationError(
            f"{where} = {brief(value)} is not valid: use one of " + ", ".join(map(repr, choices))
        )
    return value


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
    version: int | None = None
    """The stored definition's version this job was built from (``None``: a code job);
    its claims name it, so that the store refuses them once the definition changed."""
    missing_target: str | None = None
    """A stored definition's target that this instance does not hold: it claims the
    job's slots only when no live instance holds the target, to record the failure."""

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
        with refusing("job name"):
            validate_job_name(name)
        with refusing("option"):
            _check_handler(name, handler)
            resolved, given = resolve_options(defaults, options, f"job {name!r}")
        return cls(
            name=name,
            store_name=store_name(namespace, name),
            schedule=schedule,
            handler=handler,
            options=resolved,
            explicit=explicit_defaults | given,
            fingerprint=_fingerprint(schedule, resolved),
        )

    @property
    def is_async(self) -> bool:
        handler = self.handler
        call = getattr(handler, "__call__", None)  # noqa: B004 - async callable objects
        return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)

    def horizon_ms(self, slot: int) -> int:
        """How late a slot may still be claimed: the misfire grace (docs/jobs.md)."""
        if self.options.misfire_grace_ms is not None:
            return self.options.misfire_grace_ms
        gap = self.schedule.next_slot(slot) - slot
        return min(gap, MAX_MISFIRE_GRACE_MS)

    def describe(self) -> str:
        return self.schedule.describe()


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
            f"job {name!r}: handler {brief(handler)} is not callable: give a function taking ctx"
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
