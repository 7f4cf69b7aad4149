"""Daylight-saving rules of docs/schedules.md, over ten years of transitions in several zones.

Fall back: a fixed-hour entry fires once, at the first occurrence of a repeated wall time;
a ``*``-hour entry fires at every real occurrence.  Spring forward: a fixed-hour wall time
that does not exist fires once, shifted forward by the gap; ``*``-hour entries lose it.
Wall times landing on one instant are one slot.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import pytest

from anarchon_core.schedules import Cron

UTC = dt.UTC
MINUTE = 60_000
HOUR = 60 * MINUTE
YEARS = range(2025, 2035)


def ms(value: dt.datetime) -> int:
    return (value - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(milliseconds=1)


def utc_ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    return ms(dt.datetime(year, month, day, hour, minute, tzinfo=UTC))


def offset_ms(zone: ZoneInfo, instant: int) -> int:
    offset = dt.datetime.fromtimestamp(instant / 1000, UTC).astimezone(zone).utcoffset()
    assert offset is not None
    return offset // dt.timedelta(milliseconds=1)


@dataclass(frozen=True)
class Transition:
    zone: ZoneInfo
    at: int  # the instant (ms) the offset changes
    before: int  # offset before, ms
    after: int  # offset after, ms

    @property
    def spring(self) -> bool:
        return self.after > self.before

    @property
    def wall_before(self) -> dt.datetime:
        """The wall-clock reading the old offset reaches at the transition (02:00 in NY)."""
        return dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=self.at + self.before)

    @property
    def wall_after(self) -> dt.datetime:
        """The wall-clock reading right after the transition (03:00 on NY's spring day)."""
        return dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=self.at + self.after)


def transitions(zone_name: str, years: range) -> list[Transition]:
    """Every offset change in ``years``, found by a daily scan and a bisection."""
    zone = ZoneInfo(zone_name)
    found = []
    t = utc_ms(years.start, 1, 1)
    end = utc_ms(years.stop, 1, 1)
    while t < end:
        nxt = t + 24 * HOUR
        if offset_ms(zone, t) != offset_ms(zone, nxt):
            lo, hi = t, nxt
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset_ms(zone, mid) == offset_ms(zone, t) else (lo, mid)
            found.append(Transition(zone, hi, offset_ms(zone, t), offset_ms(zone, nxt)))
        t = nxt
    return found


def local(zone: ZoneInfo, instant: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(instant / 1000, UTC).astimezone(zone)


def day_slots(cron: Cron, tr: Transition) -> list[int]:
    """The slots whose wall-clock date is the date of the transition."""
    day = tr.wall_before.date()
    around = cron.slots_between(tr.at - 30 * HOUR, tr.at + 30 * HOUR)
    return [s for s in around if local(tr.zone, s).date() == day]


# --------------------------------------------------------------------------- hand-checked table

# These rows are the table in docs/schedules.md.
TABLE = [
    # New York: spring 2025-03-09 02:00 EST -> 03:00 EDT; fall 2025-11-02 02:00 EDT -> 01:00 EST
    ("30 2 * * *", "America/New_York", (2025, 3, 9), [(2025, 3, 9, 7, 30)]),  # 03:30 EDT
    ("0 2,3 * * *", "America/New_York", (2025, 3, 9), [(2025, 3, 9, 7, 0)]),  # 03:00 EDT, once
    ("0 1-3 * * *", "America/New_York", (2025, 3, 9), [(2025, 3, 9, 6, 0), (2025, 3, 9, 7, 0)]),
    ("0 * * * *", "America/New_York", (2025, 3, 9), "23 slots, no 02:00"),
    ("30 1 * * *", "America/New_York", (2025, 11, 2), [(2025, 11, 2, 5, 30)]),  # 01:30 EDT
    (
        "0 * * * *",
        "America/New_York",
        (2025, 11, 2),
        [(2025, 11, 2, 5, 0), (2025, 11, 2, 6, 0)],  # 01:00 EDT and 01:00 EST
    ),
    # Athens: spring 2025-03-30 03:00 EET -> 04:00 EEST; fall 2025-10-26 04:00 EEST -> 03:00 EET
    ("30 3 * * *", "Europe/Athens", (2025, 3, 30), [(2025, 3, 30, 1, 30)]),  # 04:30 EEST
    ("30 3 * * *", "Europe/Athens", (2025, 10, 26), [(2025, 10, 26, 0, 30)]),  # 03:30 EEST
    (
        "0 * * * *",
        "Europe/Athens",
        (2025, 10, 26),
        [(2025, 10, 26, 0, 0), (2025, 10, 26, 1, 0)],  # 03:00 EEST and 03:00 EET
    ),
    # 2026: New York 03-08 and 11-01, Athens 03-29 and 10-25
    ("30 2 * * *", "America/New_York", (2026, 3, 8), [(2026, 3, 8, 7, 30)]),
    ("30 1 * * *", "America/New_York", (2026, 11, 1), [(2026, 11, 1, 5, 30)]),
    ("30 3 * * *", "Europe/Athens", (2026, 3, 29), [(2026, 3, 29, 1, 30)]),
    ("30 3 * * *", "Europe/Athens", (2026, 10, 25), [(2026, 10, 25, 0, 30)]),
]


@pytest.mark.parametrize(("expression", "zone", "day", "expected"), TABLE)
def test_documented_table(
    expression: str, zone: str, day: tuple[int, int, int], expected: str | list[tuple[int, ...]]
) -> None:
    tz = ZoneInfo(zone)
    start = ms(dt.datetime(*day, tzinfo=tz))  # local midnight (never in a transition here)
    slots = Cron(expression, zone).slots_between(start - 1, start + 25 * HOUR)
    slots = [s for s in slots if local(tz, s).date() == dt.date(*day)]
    if isinstance(expected, str):  # the spring day of an hourly entry
        assert len(slots) == 23
        assert 2 not in {local(tz, s).hour for s in slots}
        return
    want = [utc_ms(*row) for row in expected]
    if expression.split()[1] == "*":  # look only at the repeated hour
        slots = [s for s in slots if local(tz, s).hour == local(tz, want[0]).hour]
    assert slots == want


# --------------------------------------------------------------------------- ten years

ZONES = ["America/New_York", "Europe/Athens", "Australia/Sydney"]
ALL = [tr for zone in ZONES for tr in transitions(zone, YEARS)]
SPRING = [tr for tr in ALL if tr.spring]
FALL = [tr for tr in ALL if not tr.spring]


def tr_id(tr: Transition) -> str:
    return f"{tr.zone.key}-{tr.wall_before:%Y-%m-%d}"


def test_the_scan_found_two_transitions_a_year() -> None:
    for zone in ZONES:
        assert len([tr for tr in ALL if tr.zone.key == zone]) == 2 * len(YEARS)
    assert all(abs(tr.after - tr.before) == HOUR for tr in ALL)


@pytest.mark.parametrize("tr", SPRING, ids=tr_id)
def test_spring_forward(tr: Transition) -> None:
    gap_hour = tr.wall_before.hour  # NY 2, Athens 3, Sydney 2: this wall hour does not exist
    # A fixed-hour time in the gap fires once, shifted forward by the gap.
    for minute in (0, 30, 59):
        slots = day_slots(Cron(f"{minute} {gap_hour} * * *", tr.zone.key), tr)
        assert slots == [tr.at + minute * MINUTE]
        wall = local(tr.zone, slots[0])
        assert (wall.hour, wall.minute) == (gap_hour + 1, minute)
    # The gap time and the time it is shifted to are one instant: one slot.
    assert day_slots(Cron(f"15 {gap_hour},{gap_hour + 1} * * *", tr.zone.key), tr) == [
        tr.at + 15 * MINUTE
    ]
    # Fixed hours around the gap keep their own slots.
    around = day_slots(Cron(f"0 {gap_hour - 1}-{gap_hour + 1} * * *", tr.zone.key), tr)
    assert around == [tr.at - HOUR, tr.at]
    # "*"-hour entries simply have one occurrence fewer.
    hourly = day_slots(Cron("0 * * * *", tr.zone.key), tr)
    assert len(hourly) == 23
    assert gap_hour not in {local(tr.zone, s).hour for s in hourly}
    assert all(b - a == HOUR for a, b in itertools.pairwise(hourly))
    quarter = day_slots(Cron("*/15 */1 * * *", tr.zone.key), tr)
    assert len(quarter) == 23 * 4


@pytest.mark.parametrize("tr", FALL, ids=tr_id)
def test_fall_back(tr: Transition) -> None:
    fold_hour = tr.wall_after.hour  # NY 1, Athens 3, Sydney 2: this wall hour happens twice
    first_pass = range(tr.at - HOUR, tr.at)
    # A fixed-hour entry fires once, at the first occurrence.
    for minute in (0, 30, 59):
        slots = day_slots(Cron(f"{minute} {fold_hour} * * *", tr.zone.key), tr)
        assert slots == [tr.at - HOUR + minute * MINUTE]
        assert local(tr.zone, slots[0]).utcoffset() == dt.timedelta(milliseconds=tr.before)
    # Never two slots in one fall-back hour for a fixed-hour entry.
    quarters = day_slots(Cron(f"*/15 {fold_hour} * * *", tr.zone.key), tr)
    assert len(quarters) == 4 and all(s in first_pass for s in quarters)
    spanning = day_slots(Cron(f"0 {fold_hour - 1}-{fold_hour + 1} * * *", tr.zone.key), tr)
    assert spanning == [tr.at - 2 * HOUR, tr.at - HOUR, tr.at + HOUR]
    # A "*"-hour entry fires at every real occurrence: both hours.
    hourly = day_slots(Cron("0 * * * *", tr.zone.key), tr)
    assert len(hourly) == 25
    assert all(b - a == HOUR for a, b in itertools.pairwise(hourly))
    repeated = [s for s in hourly if local(tr.zone, s).hour == fold_hour]
    assert repeated == [tr.at - HOUR, tr.at]
    quarter = day_slots(Cron("*/15 * * * *", tr.zone.key), tr)
    assert len(quarter) == 25 * 4


@pytest.mark.parametrize("tr", FALL, ids=tr_id)
def test_next_slot_inside_the_repeated_hour(tr: Transition) -> None:
    fold_hour = tr.wall_after.hour
    fixed = Cron(f"30 {fold_hour} * * *", tr.zone.key)
    hourly = Cron("0 * * * *", tr.zone.key)
    # From the second pass of the hour, the fixed entry's next slot is the next day's.
    assert local(tr.zone, fixed.next_slot(tr.at + 10 * MINUTE)).date() > tr.wall_after.date()
    assert fixed.next_slot(tr.at - HOUR + 10 * MINUTE) == tr.at - 30 * MINUTE
    assert hourly.next_slot(tr.at - 1) == tr.at
    assert hourly.next_slot(tr.at - HOUR) == tr.at
    assert hourly.next_slot(tr.at - HOUR - 1) == tr.at - HOUR


# --------------------------------------------------------------------------- brute force


def field_values(field: str, low: int, high: int) -> set[int]:
    """Values of a numeric cron field: *, */n, a, a-b, a-b/n and lists of them."""
    values: set[int] = set()
    for part in field.split(","):
        base, _, step = part.partition("/")
        bounds = (low, high) if base == "*" else tuple(int(x) for x in base.split("-"))
        values.update(range(bounds[0], bounds[-1] + 1, int(step or 1)))
    return values


def reference(expression: str, zone: ZoneInfo, first_day: dt.date, days: int) -> list[int]:
    """The rules restated independently: scan the wall-clock minutes, then apply fold=0.

    Fixed hour: every matching wall time fires at ``fold=0`` (PEP 495 gives the first
    occurrence of a repeated time and shifts a skipped one forward).  ``*`` hour: every
    matching wall time that exists fires at each of its real occurrences.
    """
    minute, hour, dom, month, dow = expression.split()
    assert (dom, month, dow) == ("*", "*", "*")
    minutes, hours = field_values(minute, 0, 59), field_values(hour, 0, 23)
    out: set[int] = set()
    for d in range(days):
        date = first_day + dt.timedelta(days=d)
        for h in sorted(hours):
            for m in sorted(minutes):
                wall = dt.datetime(date.year, date.month, date.day, h, m)
                early = wall.replace(tzinfo=zone)
                late = wall.replace(tzinfo=zone, fold=1)
                exists = early.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall
                if not hour.startswith("*"):
                    out.add(ms(early.astimezone(UTC)))
                elif exists:
                    out.update({ms(early.astimezone(UTC)), ms(late.astimezone(UTC))})
    return sorted(out)


EXPRESSIONS = ["30 1 * * *", "*/20 1-3 * * *", "0 * * * *", "15,45 */2 * * *", "5 0,2 * * *"]
SPECIAL = [
    # (zone, a date of a transition): unusual shapes of clock change
    ("Australia/Lord_Howe", dt.date(2025, 4, 6)),  # 30-minute fall back, 02:00 -> 01:30
    ("Australia/Lord_Howe", dt.date(2025, 10, 5)),  # 30-minute spring forward
    ("Pacific/Apia", dt.date(2011, 12, 29)),  # the whole of 30 December 2011 was skipped
    ("America/Santiago", dt.date(2025, 4, 5)),  # fall back at midnight, 00:00 -> 23:00
    ("America/Santiago", dt.date(2025, 9, 6)),  # spring forward at midnight
    ("Europe/Dublin", dt.date(2025, 10, 26)),  # "negative" DST in the tz database
    ("Europe/London", dt.date(2025, 3, 30)),
    ("America/Havana", dt.date(2025, 11, 2)),  # fall back 01:00 -> 00:00
]
CASES = [(tr.zone.key, tr.wall_before.date()) for tr in ALL if tr.zone.key != ZONES[2]]


@pytest.mark.parametrize(("zone_name", "day"), CASES + SPECIAL, ids=lambda v: str(v))
def test_against_a_brute_force_reference(zone_name: str, day: dt.date) -> None:
    zone = ZoneInfo(zone_name)
    lo = ms(dt.datetime(day.year, day.month, day.day, tzinfo=zone)) - 3 * HOUR
    hi = lo + 30 * HOUR
    for expression in EXPRESSIONS:
        cron = Cron(expression, zone_name)
        ref = [
            s for s in reference(expression, zone, day - dt.timedelta(days=3), 7) if lo < s <= hi
        ]
        assert cron.slots_between(lo, hi) == ref, expression
        # next_slot agrees at and just before every slot ...
        assert [cron.next_slot(s - 1) for s in ref] == ref, expression
        assert [cron.next_slot(s) for s in ref[:-1]] == ref[1:], expression
        # ... and from points in between.
        for probe in range(lo, ref[-1], 97 * MINUTE + 1_234):
            assert cron.next_slot(probe) == min(s for s in ref if s > probe), (expression, probe)


# --------------------------------------------------------------------------- machine independence


def slots_fingerprint() -> list[int]:
    out: list[int] = []
    for zone in ("America/New_York", "Europe/Athens", "UTC"):
        for expression in ("30 2 * * *", "30 1 * * *", "0 * * * *", "*/10 3 * * *"):
            cron = Cron(expression, zone)
            out += cron.slots_between(utc_ms(2025, 3, 8), utc_ms(2025, 3, 10, 12))
            out += cron.slots_between(utc_ms(2025, 3, 29), utc_ms(2025, 3, 31))
            out += cron.slots_between(utc_ms(2025, 10, 25), utc_ms(2025, 10, 27))
            out += cron.slots_between(utc_ms(2025, 11, 1), utc_ms(2025, 11, 3))
            out.append(cron.next_slot(utc_ms(2025, 11, 2, 5, 40)))
    return out


def test_results_do_not_depend_on_the_tz_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert hasattr(time, "tzset"), "POSIX only"
    baseline = slots_fingerprint()
    try:
        for tz in (
            "UTC",
            "America/Los_Angeles",
            "Asia/Kolkata",
            "Pacific/Chatham",
            "Europe/Athens",
        ):
            with monkeypatch.context() as patch:
                patch.setenv("TZ", tz)
                time.tzset()
                assert slots_fingerprint() == baseline, tz
    finally:
        time.tzset()  # monkeypatch has restored TZ; make the C library see it again


def test_seconds_field_follows_the_same_rules() -> None:
    spring = Cron("30 2 * * * 15", "America/New_York")  # 02:30:15, seconds last
    assert spring.next_slot(utc_ms(2025, 3, 9)) == utc_ms(2025, 3, 9, 7, 30) + 15_000
    fall = Cron("30 1 * * * 15", "America/New_York")
    assert fall.slots_between(utc_ms(2025, 11, 2), utc_ms(2025, 11, 2, 12)) == [
        utc_ms(2025, 11, 2, 5, 30) + 15_000
    ]
    hourly = Cron("0 * * * * 15", "America/New_York")
    got = hourly.slots_between(utc_ms(2025, 11, 2, 5), utc_ms(2025, 11, 2, 6, 30))
    assert got == [utc_ms(2025, 11, 2, 5) + 15_000, utc_ms(2025, 11, 2, 6) + 15_000]
