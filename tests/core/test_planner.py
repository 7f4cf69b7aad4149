"""The slot planner: turns, stagger, jitter bounds and the clock-step skip, without a
store or a loop."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from anarchon_core import Scheduler
from anarchon_core.engine.candidates import Role, Turn
from anarchon_core.engine.planner import (
    HORIZON_MARGIN_MS,
    RANKED_WINDOW_MS,
    claim_delay_ms,
    claim_window_ms,
    first_claimable,
    jitter_bound_ms,
    jitter_ms,
)
from anarchon_core.job import Job

T0 = 1_800_000_000_000  # a whole minute


def job(schedule: str = "10s", *, cron: bool = False, **options: Any) -> Job:
    scheduler = Scheduler("memory://")
    define = scheduler.cron if cron else scheduler.every
    define("j", schedule, **options)(lambda ctx: None)
    return scheduler.jobs["j"]


def test_ranked_turns_claim_in_order_within_the_window() -> None:
    horizon = 10_000
    delays = [claim_delay_ms(Turn(Role.CANDIDATE, r), 2, horizon) for r in range(2)]
    watcher = claim_delay_ms(Turn(Role.WATCHER, 2), 2, horizon)
    assert delays == [0, RANKED_WINDOW_MS // 2]
    assert watcher == RANKED_WINDOW_MS
    assert claim_delay_ms(Turn(Role.NONE, 3), 2, horizon) is None


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("horizon", [0, 1, 150, 999, 1000, 60_000])
def test_every_ranked_claim_leaves_within_half_the_horizon(k: int, horizon: int) -> None:
    window = claim_window_ms(horizon)
    assert window == min(horizon // 2, RANKED_WINDOW_MS)
    delays = [claim_delay_ms(Turn(Role.CANDIDATE, r), k, horizon) for r in range(k)]
    delays.append(claim_delay_ms(Turn(Role.WATCHER, k), k, horizon))
    assert delays[0] == 0
    assert delays == sorted(delays)
    assert all(d is not None and d <= window for d in delays)


def test_jitter_is_clamped_to_half_a_short_horizon() -> None:
    """misfire_grace_ms=200 with the default 500 ms jitter: a claim drawn past the
    horizon would come back expired, so the bound is 100 ms."""
    short = job("10s", misfire_grace_ms=200)
    assert jitter_bound_ms(short, T0) == 100
    assert jitter_bound_ms(job("10s"), T0) == 500
    assert jitter_bound_ms(job("1s"), T0) == 250  # a quarter of the gap
    assert jitter_bound_ms(job("10s", jitter_ms=0), T0) == 0


def test_jitter_is_drawn_per_instance_job_and_slot_within_its_bound() -> None:
    one, other = job("10s"), job("10s", jitter_ms=400)
    slots = range(T0, T0 + 20_000_000, 10_000)
    draws = [jitter_ms(7, one, s) for s in slots]
    assert all(0 <= d <= 500 for d in draws)
    assert draws == [jitter_ms(7, one, s) for s in slots]  # fixed by its inputs
    assert draws != [jitter_ms(8, one, s) for s in slots]  # another instance
    assert len(Counter(draws)) > 300  # spread, not one burst
    assert all(0 <= jitter_ms(7, other, s) <= 400 for s in slots)


def test_a_slot_within_its_horizon_is_not_skipped() -> None:
    every = job("1s")
    assert first_claimable(every, T0, T0) is None
    assert first_claimable(every, T0, T0 + 1000 + HORIZON_MARGIN_MS) is None


def test_a_forward_step_resumes_at_the_newest_due_slot_with_a_count() -> None:
    every = job("1s")
    hour = 3_600_000
    skip = first_claimable(every, T0, T0 + hour + 10)
    assert skip is not None
    assert skip.slot == T0 + hour  # the newest slot due, within its 1 s horizon
    assert skip.count == hour // 1000
    assert not skip.at_least


def test_past_its_horizon_the_newest_slot_gives_way_to_the_next() -> None:
    graced = job("10s", misfire_grace_ms=200)
    skip = first_claimable(graced, T0, T0 + 3_600_000 + 5_000)
    assert skip is not None
    assert skip.slot == T0 + 3_600_000 + 10_000  # 3_600_000 is 5 s late: past 200 ms
    assert skip.count == 361


def test_a_long_grace_resumes_at_the_newest_slot_not_the_backlog() -> None:
    """Slots a long grace keeps claimable would skip each other (overlap) or run back
    to back: a step of the clock resumes at the newest."""
    graced = job("1s", misfire_grace_ms=60_000)
    skip = first_claimable(graced, T0, T0 + 3_600_000 + 500)
    assert skip is not None and skip.slot == T0 + 3_600_000
    assert skip.count == 3600


def test_a_cron_skip_counts_the_passed_slots() -> None:
    minutely = job("* * * * *", cron=True)
    skip = first_claimable(minutely, T0, T0 + 3 * 3_600_000)
    assert skip is not None
    assert skip.slot == T0 + 3 * 3_600_000  # the newest due, within its minute
    assert skip.count == 180
