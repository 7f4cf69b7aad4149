"""Our ``Cron`` (``day_or=False``) computes the same run times as Celery's ``crontab``.

Celery's own next-run computation is ``crontab.remaining_delta(last_run_at)``: it returns
``(last_run_at, delta, now)`` where ``last_run_at + delta`` is the next run strictly after
``last_run_at`` (``remaining_estimate`` subtracts "now" from that). Stepping it from each
run time gives Celery's sequence; the mapping must give the same slots, in UTC and in a
zone without daylight saving.
"""

from __future__ import annotations

import datetime as dt
import random
import zoneinfo

import pytest
from celery import Celery
from celery.schedules import crontab

from anarchon_celery import cron_expression
from anarchon_core.schedules import Cron

SPECS = 1000
SLOTS = 50
_FIELDS = {  # name: (low, high)
    "minute": (0, 59),
    "hour": (0, 23),
    "day_of_week": (0, 6),
    "day_of_month": (1, 31),
    "month_of_year": (1, 12),
}


def _field(rng: random.Random, low: int, high: int, star_weight: float) -> str:
    if rng.random() < star_weight:
        return "*"
    kind = rng.randrange(5)
    if kind == 0:
        return str(rng.randint(low, high))
    if kind == 1:
        return f"*/{rng.randint(2, max(2, (high - low) // 2))}"
    a = rng.randint(low, high)
    b = rng.randint(a, high)
    if kind == 2:
        return f"{a}-{b}"
    if kind == 3:
        return f"{a}-{b}/{rng.randint(1, 3)}"
    return ",".join(str(v) for v in sorted(rng.sample(range(low, high + 1), rng.randint(2, 4))))


def _random_specs(seed: int) -> list[crontab]:
    rng = random.Random(seed)
    weights = {"minute": 0.2, "hour": 0.3, "day_of_week": 0.6, "day_of_month": 0.7}
    specs: list[crontab] = []
    while len(specs) < SPECS:
        fields = {
            name: _field(rng, low, high, weights.get(name, 0.8))
            for name, (low, high) in _FIELDS.items()
        }
        try:
            specs.append(crontab(**fields))
        except ValueError:  # a date that never exists (Feb 30): Celery refuses it too
            continue
    return specs


def _celery_runs(spec: crontab, start: dt.datetime, count: int) -> list[int]:
    runs: list[int] = []
    last = start
    for _ in range(count):
        base, delta, _now = spec.remaining_delta(last)
        last = base + delta
        runs.append(int(last.timestamp() * 1000))
    return runs


@pytest.mark.parametrize("zone", ["UTC", "Asia/Tokyo"])
def test_next_50_slots_equal_celerys_for_1000_random_specs(zone: str):
    app = Celery("parity", set_as_current=False)
    app.conf.update(timezone=zone, enable_utc=True)
    tz = zoneinfo.ZoneInfo(zone)
    rng = random.Random(zone)
    mismatches = []
    for number, spec in enumerate(_random_specs(seed=8)):
        spec.app = app  # Celery evaluates a crontab in its app's timezone
        start = dt.datetime(2024, 1, 1, tzinfo=tz) + dt.timedelta(
            minutes=rng.randrange(3 * 366 * 24 * 60)
        )
        celery_runs = _celery_runs(spec, start, SLOTS)
        ours = Cron(cron_expression(spec), zone, day_or=False)
        mine: list[int] = []
        after = int(start.timestamp() * 1000)
        for _ in range(SLOTS):
            after = ours.next_slot(after)
            mine.append(after)
        if mine != celery_runs:
            mismatches.append((number, spec, start, cron_expression(spec)))
    assert not mismatches, f"{len(mismatches)} of {SPECS} differ, e.g. {mismatches[:3]}"
