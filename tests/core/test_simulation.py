"""The protocol under seeded random faults, on virtual time (see ``tests/simulation.py``).

Each run checks 300 seeds: the fixed seeds 0–199, and 100 more that change every day
(the day's window of seeds 1,000–100,999), so the suite keeps exploring new fault
orders while a failure always names its seed. ``ANARCHON_SIM_SEEDS=N`` runs seeds
0..N-1 instead (a soak: 10,000 take about 20 minutes); a failing seed replays alone
with ``ANARCHON_SIM_SEED=S``.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from simulation import Report, simulate

ONE = os.environ.get("ANARCHON_SIM_SEED")
COUNT = os.environ.get("ANARCHON_SIM_SEEDS")


def todays_seeds(fixed: int = 200, rotating: int = 100) -> list[int]:
    """The fixed seeds, then the day's window of ``rotating`` seeds from 1,000 on."""
    day = int(time.time() // 86_400)
    start = 1_000 + (day * rotating) % 100_000
    return list(range(fixed)) + list(range(start, start + rotating))


SEEDS = [int(ONE)] if ONE else list(range(int(COUNT))) if COUNT else todays_seeds()


@pytest.fixture(autouse=True)
def quiet() -> Iterator[None]:
    """Thousands of expected store failures: keep their warnings out of the report."""
    engine = logging.getLogger("anarchon")
    level = engine.level
    engine.setLevel(logging.CRITICAL)
    yield
    engine.setLevel(level)


@pytest.mark.timeout(600)
def test_no_two_runners_no_late_start_no_missed_slot_true_history() -> None:
    reports = [simulate(seed) for seed in SEEDS]
    broken = [report for report in reports if report.broken]
    assert not broken, f"{len(broken)} of {len(SEEDS)} seeds broke the protocol:\n" + "\n".join(
        report.explain() for report in broken[:5]
    )
    if ONE:
        return
    # The faults really happened, and the protocol really was exercised by them.
    faults = sum((report.faults for report in reports), Counter[str]())
    assert all(faults[f"claim:{what}"] > 0 for what in ("delayed", "lost", "failed", "cut"))
    assert sum(report.takeovers for report in reports) > len(SEEDS)
    assert sum(report.ignored_fence for report in reports) > 0
    assert sum(report.executions for report in reports) > 40 * len(SEEDS)


def test_a_seed_replays_the_same_run() -> None:
    def ran(report: Report) -> list[tuple[str, int, int, str]]:
        return sorted((r.job, r.slot, r.attempt, r.instance) for r in report.runs)

    first, again = simulate(7), simulate(7)
    assert ran(first) == ran(again)
    assert first.faults == again.faults
