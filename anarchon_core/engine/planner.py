"""When this instance acts on a slot, and what it does then: pure, no store, no loop.

The slot loop keeps one heap of :class:`Due` entries. A ``PLAN`` entry comes due at
its slot: the instance then asks its registry view for its :class:`~.candidates.Turn`
and either claims at once, claims later (a ``CLAIM`` entry at the slot plus its delay)
or passes. The delay follows the run's ranking where one exists: the first candidate
claims at the slot, each next one a stagger later, the watcher last, all within
:func:`claim_window_ms` of the slot. Where no ranking exists the delay is a jitter
drawn per (instance, job, slot) and clamped by :func:`jitter_bound_ms`.

After a clock step forward or a freeze, entries come due long after their slot:
:func:`first_claimable` finds the slot the job can still claim and how many were
passed over, so that the loop reports them once instead of replaying them one by one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..job import Job
from ..schedules import Every, Schedule
from .candidates import Role, Turn, stable_hash, unit_interval

__all__ = [
    "HORIZON_MARGIN_MS",
    "RANKED_WINDOW_MS",
    "Due",
    "Skip",
    "Stage",
    "claim_delay_ms",
    "claim_window_ms",
    "first_claimable",
    "jitter_bound_ms",
    "jitter_ms",
]

#: The ranked claims of a run (candidates, then the watcher) leave within this long of
#: the slot, or half the slot's horizon if that is shorter.
RANKED_WINDOW_MS = 500
#: A slot this far past its horizon by the local clock is not even sent to the store
#: (it would come back EXPIRED); the store's clock decides everything closer.
HORIZON_MARGIN_MS = 1000
#: A cron job's skipped slots are counted up to this many (``every`` counts exactly).
SKIP_COUNT_LIMIT = 100_000


class Stage(enum.Enum):
    """What a :class:`Due` entry does when it comes due."""

    PLAN = "plan"
    """The slot has come: decide this instance's turn (and push the job's next slot)."""
    CLAIM = "claim"
    """The turn's delay has passed: claim."""
    DEFERRED = "deferred"
    """Half the horizon of a slot handed to the job's catch-up has passed: claim it now
    unless the catch-up has claimed it already."""


@dataclass(order=True, slots=True)
class Due:
    """One heap entry: ``stage`` of ``job``'s ``slot`` at ``at`` (epoch ms)."""

    at: int
    order: int
    """Ties leave in the order they were pushed."""
    job: Job = field(compare=False)
    slot: int = field(compare=False)
    stage: Stage = field(compare=False)


def claim_window_ms(horizon_ms: int) -> int:
    """How long after its slot a run's last ranked claim (the watcher's) leaves."""
    return max(0, min(horizon_ms // 2, RANKED_WINDOW_MS))


def jitter_bound_ms(job: Job, slot: int) -> int:
    """The largest unranked wait: ``min(jitter_ms, gap / 4, horizon / 2)``.

    A quarter of the gap keeps a claim clear of the next slot; half the horizon leaves
    the claim, and a retry of it, time to land before the store calls it expired.
    """
    gap = job.schedule.next_slot(slot) - slot
    return max(0, min(job.options.jitter_ms, gap // 4, job.horizon_ms(slot) // 2))


def jitter_ms(seed: int, job: Job, slot: int) -> int:
    """This instance's unranked wait for ``(job, slot)``: uniform in ``[0, bound]``,
    fixed by the instance's seed, the job and the slot, so that the runs of one instant
    do not all leave as one burst from every instance."""
    bound = jitter_bound_ms(job, slot)
    if bound <= 0:
        return 0
    return int(unit_interval(seed ^ stable_hash(job.store_name), slot) * (bound + 1))


def claim_delay_ms(turn: Turn, k: int, horizon_ms: int) -> int | None:
    """How long after the slot a ranked turn claims (``None``: it does not claim).

    Rank ``r`` of ``k`` candidates claims at ``r / k`` of the window, the watcher (rank
    ``k``) at its end: the first candidate claims at the slot, and each next one only
    matters if those before it died since the registry was read.
    """
    if turn.role == Role.NONE:
        return None
    window = claim_window_ms(horizon_ms)
    return window * min(turn.rank, k) // max(k, 1)


@dataclass(frozen=True, slots=True)
class Skip:
    """Where a late slot loop resumes a job: ``slot``, after passing over ``count``
    slots (``at_least``: a cron job's count stopped at :data:`SKIP_COUNT_LIMIT`)."""

    slot: int
    count: int
    at_least: bool = False


def first_claimable(job: Job, slot: int, now: int) -> Skip | None:
    """Where a slot loop that wakes at ``now``, long after ``slot``, resumes the job: at
    the newest slot due by ``now`` if it is still within its horizon, else at the next
    one; with the number of slots passed over. ``None`` if ``slot`` itself is still
    claimable (within its horizon plus :data:`HORIZON_MARGIN_MS`, where the store's
    clock decides).

    After a clock step or a freeze of an hour, a job every second would otherwise
    replay 3,600 slots that all come back expired; and of the few a long grace keeps
    claimable, only the newest runs: they would skip each other (``overlap``) or run
    back to back, which a step of the clock does not call for (catch-up does that
    after downtime).
    """
    if now <= slot + job.horizon_ms(slot) + HORIZON_MARGIN_MS:
        return None
    schedule = job.schedule
    found = _newest_due(schedule, slot, now)
    if now > found + job.horizon_ms(found):
        found = schedule.next_slot(found)
    if isinstance(schedule, Every):
        return Skip(found, (found - slot) // schedule.interval_ms)

    count = len(schedule.slots_between(slot - 1, found - 1, limit=SKIP_COUNT_LIMIT))
    return Skip(found, count, at_least=count == SKIP_COUNT_LIMIT)


def _newest_due(schedule: Schedule, slot: int, now: int) -> int:
    """The newest slot in ``[slot, now]`` (``slot`` is one of the schedule's)."""
    if isinstance(schedule, Every):
        return schedule.next_slot(now - schedule.interval_ms)
    gap = max(schedule.next_slot(slot) - slot, 1)
    while True:  # widen a look-back window until it holds a slot
        start = max(slot - 1, now - gap)
        found = schedule.slots_between(start, now)
        if found:
            return found[-1]
        gap *= 4
