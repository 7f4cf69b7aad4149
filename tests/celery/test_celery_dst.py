"""Around DST transitions: Celery beat's run times next to anarchon's slots, as instants.

Celery's side steps a ``crontab`` exactly as beat does: at each tick beat asks
``is_due(last_run_at)`` with the clock at "now"; a due entry is sent and its
``last_run_at`` becomes now; beat then sleeps for the returned seconds (at most
``beat_max_loop_interval``, 300 s by default). A settable clock (``nowfun``) stands in for
the wall clock; the app's ``timezone`` is the zone, as in a real deployment. The result
does not depend on the loop interval (5 s gives the same instants).

anarchon's side is the mapping the adapter uses: ``Cron(cron_expression(spec), zone,
day_or=False)``, stepped with ``next_slot``. The instants below are the table in
``docs/celery.md`` ("Daylight saving"): they differ only for ``hour="*"`` in the
repeated hour, where Celery runs once and anarchon (classic cron) runs at both
occurrences.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab

from anarchon_celery import cron_expression
from anarchon_core.schedules import Cron

UTC = dt.UTC
BERLIN, NEW_YORK = "Europe/Berlin", "America/New_York"
# 2025 transitions, in UTC: Berlin 03-30 01:00 (02:00 CET -> 03:00 CEST) and 10-26 01:00
# (03:00 CEST -> 02:00 CET); New York 03-09 07:00 (02:00 EST -> 03:00 EDT) and 11-02 06:00
# (02:00 EDT -> 01:00 EST).
SPRING = {
    BERLIN: dt.datetime(2025, 3, 30, 1, tzinfo=UTC),
    NEW_YORK: dt.datetime(2025, 3, 9, 7, tzinfo=UTC),
}
FALL = {
    BERLIN: dt.datetime(2025, 10, 26, 1, tzinfo=UTC),
    NEW_YORK: dt.datetime(2025, 11, 2, 6, tzinfo=UTC),
}
DAYS, HOURS = dt.timedelta(days=2), dt.timedelta(hours=3)


def celery_runs(
    zone: str, fields: dict[str, Any], start: dt.datetime, end: dt.datetime, max_interval: float
) -> list[str]:
    """The instants beat sends ``crontab(**fields)`` in ``[start, end)``, as beat steps it."""
    app = Celery("dst", set_as_current=False)
    app.conf.update(timezone=zone, enable_utc=True)
    clock = [start]
    spec = crontab(nowfun=lambda: clock[0], **fields)
    spec.app = app
    last_run_at, runs = start, []
    while clock[0] < end:
        due, next_in = spec.is_due(last_run_at)
        if due:
            runs.append(clock[0])
            last_run_at = clock[0]  # beat's reserve(): last_run_at = now
        step = min(next_in, max_interval) if next_in > 0 else max_interval
        clock[0] += dt.timedelta(seconds=step)
    return [_utc(run) for run in runs if run < end]


def anarchon_runs(
    zone: str, fields: dict[str, Any], start: dt.datetime, end: dt.datetime
) -> list[str]:
    """The slots of the mapped job in ``[start, end)``."""
    cron = Cron(cron_expression(crontab(**fields)), zone, day_or=False)
    slots, after, stop = [], int(start.timestamp() * 1000), end.timestamp() * 1000
    while (after := cron.next_slot(after)) < stop:
        slots.append(_utc(dt.datetime.fromtimestamp(after / 1000, UTC)))
    return slots


def _utc(instant: dt.datetime) -> str:
    return f"{instant.astimezone(UTC):%Y-%m-%d %H:%M}Z"


SAME = None  # anarchon's instants are Celery's
# case -> (zone, crontab fields, window, Celery's instants, anarchon's instants or SAME)
CASES: dict[
    str, tuple[str, dict[str, Any], tuple[dt.datetime, dt.datetime], list[str], list[str] | None]
]
CASES = {
    "berlin 02:30 on spring-forward day (skipped)": (
        BERLIN,
        {"hour": 2, "minute": 30},
        (SPRING[BERLIN] - DAYS, SPRING[BERLIN] + DAYS),
        [
            "2025-03-28 01:30Z",
            "2025-03-29 01:30Z",
            "2025-03-30 01:30Z",  # 03:30 CEST: 02:30 does not exist, shifted by the gap
            "2025-03-31 00:30Z",
            "2025-04-01 00:30Z",
        ],
        SAME,
    ),
    "new york 02:30 on spring-forward day (skipped)": (
        NEW_YORK,
        {"hour": 2, "minute": 30},
        (SPRING[NEW_YORK] - DAYS, SPRING[NEW_YORK] + DAYS),
        [
            "2025-03-07 07:30Z",
            "2025-03-08 07:30Z",
            "2025-03-09 07:30Z",  # 03:30 EDT
            "2025-03-10 06:30Z",
            "2025-03-11 06:30Z",
        ],
        SAME,
    ),
    "berlin 02:30 on fall-back day (repeated)": (
        BERLIN,
        {"hour": 2, "minute": 30},
        (FALL[BERLIN] - DAYS, FALL[BERLIN] + DAYS),
        # once, at the first 02:30 (CEST, 00:30Z); not again at 02:30 CET (01:30Z)
        ["2025-10-25 00:30Z", "2025-10-26 00:30Z", "2025-10-27 01:30Z"],
        SAME,
    ),
    "new york 01:30 on fall-back day (repeated)": (
        NEW_YORK,
        {"hour": 1, "minute": 30},
        (FALL[NEW_YORK] - DAYS, FALL[NEW_YORK] + DAYS),
        # once, at the first 01:30 (EDT, 05:30Z); not again at 01:30 EST (06:30Z)
        ["2025-11-01 05:30Z", "2025-11-02 05:30Z", "2025-11-03 06:30Z"],
        SAME,
    ),
    "berlin hourly :30 across spring forward": (
        BERLIN,
        {"minute": 30},
        (SPRING[BERLIN] - HOURS, SPRING[BERLIN] + HOURS),
        # 23:30, 00:30, 01:30 CET, then 03:30 CEST: no 02:30 that day
        [
            "2025-03-29 22:30Z",
            "2025-03-29 23:30Z",
            "2025-03-30 00:30Z",
            "2025-03-30 01:30Z",
            "2025-03-30 02:30Z",
            "2025-03-30 03:30Z",
        ],
        SAME,
    ),
    "new york hourly :30 across spring forward": (
        NEW_YORK,
        {"minute": 30},
        (SPRING[NEW_YORK] - HOURS, SPRING[NEW_YORK] + HOURS),
        [
            "2025-03-09 04:30Z",
            "2025-03-09 05:30Z",
            "2025-03-09 06:30Z",
            "2025-03-09 07:30Z",
            "2025-03-09 08:30Z",
            "2025-03-09 09:30Z",
        ],
        SAME,
    ),
    "berlin every 2 hours :30 across fall back (mapped to fixed hours)": (
        BERLIN,
        {"hour": "*/2", "minute": 30},
        (FALL[BERLIN] - HOURS, FALL[BERLIN] + HOURS),
        # hour="*/2" maps to the fixed hours 0,2,...,22: 02:30 runs once, at the first
        # occurrence (CEST, 00:30Z), not again at 02:30 CET (01:30Z), as under Celery
        ["2025-10-25 22:30Z", "2025-10-26 00:30Z", "2025-10-26 03:30Z"],
        SAME,
    ),
    "berlin hourly :30 across fall back": (
        BERLIN,
        {"minute": 30},
        (FALL[BERLIN] - HOURS, FALL[BERLIN] + HOURS),
        [  # Celery: 02:30 CEST only, then 03:30 CET (wall-time stepping skips 02:30 CET)
            "2025-10-25 22:30Z",
            "2025-10-25 23:30Z",
            "2025-10-26 00:30Z",
            "2025-10-26 02:30Z",
            "2025-10-26 03:30Z",
        ],
        [  # anarchon: both 02:30s (CEST 00:30Z, CET 01:30Z)
            "2025-10-25 22:30Z",
            "2025-10-25 23:30Z",
            "2025-10-26 00:30Z",
            "2025-10-26 01:30Z",
            "2025-10-26 02:30Z",
            "2025-10-26 03:30Z",
        ],
    ),
    "new york hourly :30 across fall back": (
        NEW_YORK,
        {"minute": 30},
        (FALL[NEW_YORK] - HOURS, FALL[NEW_YORK] + HOURS),
        [  # Celery: 01:30 EDT only, then 02:30 EST
            "2025-11-02 03:30Z",
            "2025-11-02 04:30Z",
            "2025-11-02 05:30Z",
            "2025-11-02 07:30Z",
            "2025-11-02 08:30Z",
        ],
        [  # anarchon: both 01:30s (EDT 05:30Z, EST 06:30Z)
            "2025-11-02 03:30Z",
            "2025-11-02 04:30Z",
            "2025-11-02 05:30Z",
            "2025-11-02 06:30Z",
            "2025-11-02 07:30Z",
            "2025-11-02 08:30Z",
        ],
    ),
    "berlin midnight across spring forward": (
        BERLIN,
        {"hour": 0, "minute": 0},
        (SPRING[BERLIN] - DAYS, SPRING[BERLIN] + DAYS),
        ["2025-03-28 23:00Z", "2025-03-29 23:00Z", "2025-03-30 22:00Z", "2025-03-31 22:00Z"],
        SAME,
    ),
    "berlin midnight across fall back": (
        BERLIN,
        {"hour": 0, "minute": 0},
        (FALL[BERLIN] - DAYS, FALL[BERLIN] + DAYS),
        ["2025-10-24 22:00Z", "2025-10-25 22:00Z", "2025-10-26 23:00Z", "2025-10-27 23:00Z"],
        SAME,
    ),
    "new york midnight across spring forward": (
        NEW_YORK,
        {"hour": 0, "minute": 0},
        (SPRING[NEW_YORK] - DAYS, SPRING[NEW_YORK] + DAYS),
        ["2025-03-08 05:00Z", "2025-03-09 05:00Z", "2025-03-10 04:00Z", "2025-03-11 04:00Z"],
        SAME,
    ),
    "new york midnight across fall back": (
        NEW_YORK,
        {"hour": 0, "minute": 0},
        (FALL[NEW_YORK] - DAYS, FALL[NEW_YORK] + DAYS),
        ["2025-11-01 04:00Z", "2025-11-02 04:00Z", "2025-11-03 05:00Z", "2025-11-04 05:00Z"],
        SAME,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("max_interval", [5.0, 300.0])
def test_celery_beat_run_times_around_dst(case: str, max_interval: float) -> None:
    zone, fields, (start, end), celery, _ = CASES[case]
    assert celery_runs(zone, fields, start, end, max_interval) == celery


@pytest.mark.parametrize("case", sorted(CASES))
def test_anarchon_slots_around_dst(case: str) -> None:
    zone, fields, (start, end), celery, ours = CASES[case]
    assert anarchon_runs(zone, fields, start, end) == (celery if ours is SAME else ours)
