"""Cluster-wide actions over a backend: pause, resume, trigger, cancel, instances.

Plain functions of an open :class:`~anarchon_core.backend.Backend`, so that the
``Scheduler`` methods, the command line and the dashboard share one implementation,
and every action goes through the store decision that gives one winner per run
(never a side door such as calling a handler directly). Job names here are store
names (namespace included), since an operator may act on jobs this process does not
define.
"""

from __future__ import annotations

import difflib

from .backend import Backend, InstanceInfo
from .errors import AnarchonError, CapabilityError, ConfigurationError
from .names import validate_job_name
from .records import HistoryQuery

__all__ = [
    "NoLiveInstanceError",
    "UnknownJobError",
    "cancel",
    "instances",
    "pause",
    "resume",
    "trigger",
]


class NoLiveInstanceError(AnarchonError, LookupError):
    """A manual run was asked for a job that no live instance has: nobody would run it."""


class UnknownJobError(NoLiveInstanceError):
    """An action named a job the store knows nothing of: no live instance has it, it has
    no history and it is not paused (a typo, most often). ``force`` acts anyway, for a
    job about to be deployed."""


async def pause(backend: Backend, job: str, *, force: bool = False) -> None:
    """Pause ``job`` on every instance from its next slot (recorded ``paused``).

    :raises UnknownJobError: the store knows nothing of ``job`` and ``force`` is not set.
    """
    validate_job_name(job)
    if not force:
        await _check_known(backend, job)
    await backend.set_paused(job, True)


async def resume(backend: Backend, job: str, *, force: bool = False) -> None:
    """Resume ``job`` from its next slot; paused slots are not replayed.

    :raises UnknownJobError: the store knows nothing of ``job`` and ``force`` is not set.
    """
    validate_job_name(job)
    if not force:
        await _check_known(backend, job)
    await backend.set_paused(job, False)


async def _check_known(backend: Backend, job: str) -> None:
    """Refuse a job that no live instance has, with no history and not paused."""
    try:
        live = await backend.instances()
    except CapabilityError:  # no registry (claim-only): the store cannot say
        return
    names = {name for info in live for name in info.jobs}
    if job in names:
        return
    paused = await backend.paused_jobs()
    if job in paused or await backend.history(HistoryQuery(job=job, limit=1)):
        return
    recent = {record.job for record in await backend.history(HistoryQuery(limit=1000))}
    close = difflib.get_close_matches(job, sorted(names | paused | recent), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UnknownJobError(
        f"job {job!r} is unknown: no live instance has it, it has no history and it is not "
        f"paused; {hint}to act on a job that is not deployed yet, pass force (--force on "
        'the command line, {"force": true} in the API)'
    )


async def trigger(backend: Backend, job: str, *, requested_by: str) -> int:
    """Ask for one manual run of ``job`` now; returns its slot.

    :raises NoLiveInstanceError: no live instance has the job, so nobody would run it.
    """
    validate_job_name(job)
    live = await backend.instances()
    if not any(job in info.jobs for info in live):
        have = sorted({name for info in live for name in info.jobs})
        raise NoLiveInstanceError(
            f"no live instance has job {job!r}, so nobody would run it; live instances "
            f"have: {', '.join(have) if have else 'none'}"
        )
    return await backend.trigger(job, requested_by)


async def cancel(backend: Backend, job: str, slot: int) -> bool:
    """Cancel a pending, running or waiting run; ``False`` if it does not exist or ended."""
    if isinstance(slot, bool) or not isinstance(slot, int):
        raise ConfigurationError(f"slot {slot!r} is not valid: give the run's slot in epoch ms")
    return await backend.cancel(validate_job_name(job), slot)


async def instances(backend: Backend) -> list[InstanceInfo]:
    """The live instances, each with the digest of its jobs (store name → fingerprint)."""
    return await backend.instances()


def fingerprint_mismatches(live: list[InstanceInfo]) -> dict[str, dict[str, list[str]]]:
    """Jobs whose live instances disagree: job → fingerprint → instance ids.

    The rolling-deploy case: replicas of two versions compute different slots for one
    job until the deploy completes.
    """
    seen: dict[str, dict[str, list[str]]] = {}
    for info in live:
        for job, fingerprint in info.jobs.items():
            seen.setdefault(job, {}).setdefault(fingerprint, []).append(info.instance_id)
    return {job: prints for job, prints in seen.items() if len(prints) > 1}
