"""Every and Cron outside daylight-saving transitions (those are in test_dst.py)."""

from __future__ import annotations

import copy
import datetime as dt
import pickle
import re

import pytest

from anarchon_core.errors import ConfigurationError
from anarchon_core.schedules import (
    At,
    Cron,
    Every,
    Schedule,
    from_canonical,
    parse_instant_ms,
    zoned_slots,
)

UTC = dt.UTC


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:
    """Milliseconds since the epoch of a UTC wall time."""
    return int(dt.datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp() * 1000)


HOUR = 3_600_000
DAY = 24 * HOUR


# --------------------------------------------------------------------------- Every


def test_every_examples_from_the_spec() -> None:
    assert Every("10s").next_slot(1791633605000) == 1791633610000
    assert Every("10s").next_slot(1791633610000) == 1791633620000


@pytest.mark.parametrize(
    ("interval", "after", "expected"),
    [
        ("10s", 0, 10_000),
        ("10s", -1, 0),
        ("10s", -10_000, 0),
        ("10s", -10_001, -10_000),
        ("500ms", 1_250, 1_500),
        ("7m", 0, 420_000),
        ("1d", ms(2026, 12, 3, 13, 0), ms(2026, 12, 4)),
        ("1h30m", ms(2026, 1, 1), ms(2026, 1, 1, 1, 30)),
    ],
)
def test_every_grid_is_counted_from_the_epoch(interval: str, after: int, expected: int) -> None:
    assert Every(interval).next_slot(after) == expected


def test_every_is_independent_of_when_you_ask() -> None:
    every = Every("10s")
    for start in range(1_700_000_000_000, 1_700_000_000_000 + 10_000, 997):
        slot = every.next_slot(start)
        assert slot % 10_000 == 0
        assert start < slot <= start + 10_000


def test_every_offsets() -> None:
    hourly = Every("1h", offset="5m")
    assert hourly.offset_ms == 300_000 and hourly.interval_ms == HOUR
    assert hourly.next_slot(ms(2026, 5, 1, 12, 0)) == ms(2026, 5, 1, 12, 5)
    assert hourly.next_slot(ms(2026, 5, 1, 12, 5)) == ms(2026, 5, 1, 13, 5)
    daily = Every("1d", offset=dt.timedelta(hours=3))
    assert daily.next_slot(ms(2026, 5, 1, 3, 0)) == ms(2026, 5, 2, 3, 0)
    assert Every("10s", offset="0s") == Every("10s") == Every("10s", dt.timedelta(0))


@pytest.mark.parametrize("offset", ["1h", "2h", dt.timedelta(hours=1)])
def test_every_offset_must_be_shorter_than_the_interval(offset: str | dt.timedelta) -> None:
    with pytest.raises(ConfigurationError) as info:
        Every("1h", offset=offset)
    assert f"offset {offset!r}" in str(info.value)
    assert "interval '1h'" in str(info.value)


@pytest.mark.parametrize("bad", [10, "10", 0.5, None, "0s", "-5s"])
def test_every_rejects_bad_intervals(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=rf"^interval {re.escape(repr(bad))} is not valid"):
        Every(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [5, "5", "-5m"])
def test_every_rejects_bad_offsets(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=rf"^offset {re.escape(repr(bad))} is not valid"):
        Every("1h", offset=bad)  # type: ignore[arg-type]


def test_every_slots_between_bounds_and_limit() -> None:
    every = Every("10s")
    assert every.slots_between(0, 30_000) == [10_000, 20_000, 30_000]  # start excluded, end in
    assert every.slots_between(1, 29_999) == [10_000, 20_000]
    assert every.slots_between(0, 30_000, limit=2) == [10_000, 20_000]
    assert every.slots_between(0, 30_000, limit=0) == []
    assert every.slots_between(0, 9_999) == []
    assert every.slots_between(30_000, 0) == []
    assert every.slots_between(-20_000, 0) == [-10_000, 0]
    assert Every("1h", offset="5m").slots_between(0, 3 * HOUR) == [
        300_000,
        HOUR + 300_000,
        2 * HOUR + 300_000,
    ]
    with pytest.raises(ConfigurationError, match="limit -1"):
        every.slots_between(0, 1, limit=-1)


def test_every_slots_between_agrees_with_next_slot() -> None:
    every = Every("1h30m", offset="7m")
    start, end = ms(2026, 1, 1), ms(2026, 1, 9)
    expected = []
    slot = every.next_slot(start)
    while slot <= end:
        expected.append(slot)
        slot = every.next_slot(slot)
    assert every.slots_between(start, end) == expected


def test_every_describe_repr_equality_fingerprint() -> None:
    assert Every("10s").describe() == "every 10s"
    assert Every("90m", offset="5m").describe() == "every 1h30m offset 5m"
    assert repr(Every(dt.timedelta(minutes=90), "5m")) == "Every('1h30m', offset='5m')"
    assert Every("90m") == Every("1h30m") == Every(dt.timedelta(minutes=90))
    assert hash(Every("90m")) == hash(Every("1h30m"))
    assert Every("10s") != Every("10s", offset="1s")
    assert Every("10s").tz == "UTC"
    fp = Every("10s").fingerprint()
    assert re.fullmatch(r"[0-9a-f]{16}", fp)
    assert fp == Every(dt.timedelta(seconds=10)).fingerprint()
    assert fp != Every("10s", offset="1s").fingerprint()
    assert fp != Every("11s").fingerprint()


# --------------------------------------------------------------------------- Cron basics


def test_cron_basics_in_utc() -> None:
    cron = Cron("*/15 * * * *")
    assert cron.tz == "UTC" and cron.expression == "*/15 * * * *" and cron.day_or is True
    assert cron.next_slot(ms(2026, 3, 1, 10, 0)) == ms(2026, 3, 1, 10, 15)
    assert cron.next_slot(ms(2026, 3, 1, 10, 0) - 1) == ms(2026, 3, 1, 10, 0)
    assert cron.next_slot(ms(2026, 3, 1, 10, 7, 30)) == ms(2026, 3, 1, 10, 15)
    assert cron.slots_between(ms(2026, 3, 1, 10, 0), ms(2026, 3, 1, 11, 0)) == [
        ms(2026, 3, 1, 10, 15),
        ms(2026, 3, 1, 10, 30),
        ms(2026, 3, 1, 10, 45),
        ms(2026, 3, 1, 11, 0),
    ]
    assert Cron("0 3 * * *").next_slot(ms(2026, 12, 31, 3, 0)) == ms(2027, 1, 1, 3, 0)


def test_cron_in_a_zone_uses_that_zone() -> None:
    athens = Cron("0 3 * * *", "Europe/Athens")
    assert athens.next_slot(ms(2026, 1, 10)) == ms(2026, 1, 10, 1, 0)  # 03:00 EET = 01:00Z
    assert athens.next_slot(ms(2026, 7, 9, 12)) == ms(2026, 7, 10, 0, 0)  # 03:00 EEST = 00:00Z


def test_cron_next_slot_is_strictly_after() -> None:
    cron = Cron("0 3 * * *", "Europe/Athens")
    slot = cron.next_slot(ms(2026, 1, 10))
    assert cron.next_slot(slot - 1) == slot
    assert cron.next_slot(slot) == slot + DAY
    assert cron.slots_between(slot, slot + DAY) == [slot + DAY]
    assert cron.slots_between(slot - 1, slot) == [slot]


def test_cron_slots_between_limit_and_empty_ranges() -> None:
    cron = Cron("* * * * *")
    start = ms(2026, 6, 1)
    assert len(cron.slots_between(start, start + DAY)) == 1440
    assert cron.slots_between(start, start + DAY, limit=3) == [
        start + 60_000,
        start + 120_000,
        start + 180_000,
    ]
    assert cron.slots_between(start, start + DAY, limit=0) == []
    assert cron.slots_between(start, start) == []
    assert cron.slots_between(start, start - DAY) == []
    with pytest.raises(ConfigurationError, match="limit"):
        cron.slots_between(start, start + DAY, limit=-2)


@pytest.mark.parametrize(
    ("alias", "expanded"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
    ],
)
def test_cron_aliases_equal_their_expansion(alias: str, expanded: str) -> None:
    assert Cron(alias, "Europe/Athens") == Cron(expanded, "Europe/Athens")
    assert Cron(alias).fingerprint() == Cron(expanded).fingerprint()


def test_cron_names_and_numbers_agree() -> None:
    start, end = ms(2026, 1, 1), ms(2026, 3, 1)
    named = Cron("30 8 * jan-feb mon-fri").slots_between(start, end)
    assert named == Cron("30 8 * 1-2 1-5").slots_between(start, end)
    assert len(named) == 42  # the weekdays of January and February 2026


def test_cron_extensions_croniter_supports() -> None:
    last_day = Cron("0 0 L * *").slots_between(ms(2026, 1, 1), ms(2026, 4, 1))
    assert last_day == [ms(2026, 1, 31), ms(2026, 2, 28), ms(2026, 3, 31)]
    second_monday = Cron("0 9 * * 1#2").next_slot(ms(2026, 3, 1))
    assert second_monday == ms(2026, 3, 9, 9, 0)


def test_cron_six_fields_are_seconds_last() -> None:
    """croniter reads a 6th field as seconds, at the END (second_at_beginning=False)."""
    cron = Cron("0 12 * * * */15")
    start = ms(2026, 6, 1, 11, 59, 59)
    assert cron.slots_between(start, ms(2026, 6, 1, 12, 1)) == [
        ms(2026, 6, 1, 12, 0, 0),
        ms(2026, 6, 1, 12, 0, 15),
        ms(2026, 6, 1, 12, 0, 30),
        ms(2026, 6, 1, 12, 0, 45),
    ]
    # A Quartz-style "seconds first" expression is read as seconds last, so it means
    # "every second of minute 0 of every fifth hour": documented, not guessed.
    quartz = Cron("0 */5 * * * *")
    assert quartz.slots_between(ms(2026, 6, 1) - 1, ms(2026, 6, 1, 0, 0, 2)) == [
        ms(2026, 6, 1, 0, 0, 0),
        ms(2026, 6, 1, 0, 0, 1),
        ms(2026, 6, 1, 0, 0, 2),
    ]
    assert Cron("* * * * * 30").next_slot(ms(2026, 6, 1, 0, 0, 30)) == ms(2026, 6, 1, 0, 1, 30)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("", "0 fields"),
        ("* * * *", "4 fields"),
        ("0 0 * * * 0 2030", "7 fields (a year field is not supported)"),
        ("60 * * * *", "out of range"),
        ("0 24 * * *", "out of range"),
        ("0 0 32 * *", "is not valid"),
        ("0 0 * 13 *", "is not valid"),
        ("0 0 * * 8", "is not valid"),
        ("*/0 * * * *", "step"),
        ("a b c d e", "is not valid"),
        ("0 0 * * funday", "is not valid"),
        ("H * * * *", "H (hashed) and R (random)"),
        ("R 3 * * *", "H (hashed) and R (random)"),
        ("0 H(0-5) * * *", "H (hashed) and R (random)"),
        ("0 0 30 2 *", "never matches"),
        ("@reboot", "1 fields"),
    ],
)
def test_cron_rejects_bad_expressions(expression: str, reason: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Cron(expression)
    message = str(info.value)
    assert message.startswith(f"cron expression {expression!r} is not valid")
    assert reason in message
    assert "5 fields: minute hour day-of-month month day-of-week, such as '*/15 * * * *'" in message


def test_cron_rejects_non_strings() -> None:
    with pytest.raises(ConfigurationError, match="cron expression None"):
        Cron(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="day_or 1"):
        Cron("* * * * *", day_or=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "zone", ["Mars/Olympus", "", "utc", "europe/athens", "localtime", "../etc/passwd", "/UTC", 3]
)
def test_cron_rejects_bad_zones(zone: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        Cron("0 3 * * *", zone)  # type: ignore[arg-type]
    assert f"time zone {zone!r} is not valid" in str(info.value)
    assert "an IANA time zone name such as 'Europe/Athens' or 'UTC'" in str(info.value)


def test_cron_accepts_a_zoneinfo_with_a_key() -> None:
    from zoneinfo import ZoneInfo

    assert Cron("0 3 * * *", ZoneInfo("Europe/Athens")) == Cron("0 3 * * *", "Europe/Athens")  # type: ignore[arg-type]


def test_cron_describe_repr_equality_fingerprint() -> None:
    athens = Cron("0  3 * *   *", "Europe/Athens")
    assert athens.expression == "0 3 * * *"
    assert athens.describe() == 'cron "0 3 * * *" (Europe/Athens)'
    assert repr(athens) == "Cron('0 3 * * *', tz='Europe/Athens')"
    both = Cron("0 3 1 * MON", day_or=False)
    assert both.describe() == 'cron "0 3 1 * MON" (UTC, day_or=False)'
    assert repr(both) == "Cron('0 3 1 * MON', tz='UTC', day_or=False)"
    assert eval(repr(both)) == both
    assert both == Cron("0 3 1 * mon", day_or=False)  # croniter is case-insensitive
    assert both != Cron("0 3 1 * mon")
    assert athens != Cron("0 3 * * *")
    assert athens != Every("1d")
    assert len({athens, Cron("0 3 * * *", "Europe/Athens"), Cron("0 3 * * *")}) == 2
    fp = athens.fingerprint()
    assert re.fullmatch(r"[0-9a-f]{16}", fp)
    assert fp == Cron("0 3 * * *", "Europe/Athens").fingerprint()
    assert fp != Cron("0 3 * * *", "Europe/Helsinki").fingerprint()
    assert fp != Cron("0 4 * * *", "Europe/Athens").fingerprint()
    assert fp != Every("1d").fingerprint()
    assert isinstance(athens, Schedule)


def test_fingerprints_are_stable_across_releases() -> None:
    """Replicas compare fingerprints: changing them silently would flag every deploy."""
    assert Every("10s").fingerprint() == "36928e247d6a3135"
    assert Cron("0 3 * * *", "Europe/Athens").fingerprint() == "6e05208b00460364"


@pytest.mark.parametrize(
    "schedule", [Every("1h", offset="5m"), Cron("0 3 * * 1-5", "Europe/Athens")]
)
def test_schedules_pickle_and_copy(schedule: Schedule) -> None:
    for clone in (pickle.loads(pickle.dumps(schedule)), copy.deepcopy(schedule)):
        assert clone == schedule
        assert clone.next_slot(ms(2026, 2, 2)) == schedule.next_slot(ms(2026, 2, 2))


def test_schedule_is_abstract() -> None:
    with pytest.raises(TypeError):
        Schedule()  # type: ignore[abstract]


def test_cron_rejects_out_of_range_instants() -> None:
    with pytest.raises(ConfigurationError, match="after_ms"):
        Cron("0 3 * * *").next_slot(10**18)
    with pytest.raises(TypeError):
        Cron("0 3 * * *").next_slot(1.5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- day_or


def field_values(field: str, low: int, high: int) -> set[int]:
    """A tiny independent cron field parser: *, */n, a, a-b, a-b/n and lists of them."""
    values: set[int] = set()
    for part in field.split(","):
        base, _, step = part.partition("/")
        bounds = (low, high) if base == "*" else tuple(int(x) for x in base.split("-"))
        values.update(range(bounds[0], bounds[-1] + 1, int(step or 1)))
    return values


def brute_force(expression: str, start: dt.datetime, end: dt.datetime, day_or: bool) -> list[int]:
    """Every UTC minute in (start, end] that the expression matches, by a minute scan."""
    minute, hour, dom, month, dow = expression.split()
    minutes, hours = field_values(minute, 0, 59), field_values(hour, 0, 23)
    doms, months, dows = (
        field_values(dom, 1, 31),
        field_values(month, 1, 12),
        field_values(dow, 0, 6),
    )
    out = []
    t = start + dt.timedelta(minutes=1)
    while t <= end:
        day_ok, week_ok = t.day in doms, (t.weekday() + 1) % 7 in dows
        if dom == "*" or dow == "*":  # only a bare "*" leaves a day field unrestricted
            days = day_ok and week_ok
        else:
            days = (day_ok or week_ok) if day_or else (day_ok and week_ok)
        if days and t.month in months and t.hour in hours and t.minute in minutes:
            out.append(int(t.timestamp() * 1000))
        t += dt.timedelta(minutes=1)
    return out


@pytest.mark.parametrize("day_or", [True, False])
@pytest.mark.parametrize(
    "expression",
    [
        "0 12 13 * 5",  # the 13th or/and a Friday
        "*/30 9-10 1,16 * 1-5",
        "0 0 1-7 * 1",  # first week or/and Monday
        "15 6 */10 2-3 0,6",  # "*/10" is a restriction: OR applies
        "0 18 * * 5",  # only one day field restricted: day_or is irrelevant
        "5 4 29 * *",
    ],
)
def test_day_matching_against_a_brute_force_minute_scan(expression: str, day_or: bool) -> None:
    start = dt.datetime(2026, 1, 25, tzinfo=UTC)
    end = dt.datetime(2026, 3, 20, tzinfo=UTC)
    expected = brute_force(expression, start, end, day_or)
    cron = Cron(expression, day_or=day_or)
    start_ms, end_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    assert cron.slots_between(start_ms, end_ms) == expected
    assert expected, "the window should contain slots"
    assert [cron.next_slot(s - 1) for s in expected] == expected


def test_day_or_examples() -> None:
    either = Cron("0 12 13 * 5")
    both = Cron("0 12 13 * 5", day_or=False)
    start = ms(2026, 1, 1)
    # The next Friday 13th after 2026-01-01 is 2026-02-13.
    assert both.next_slot(start) == ms(2026, 2, 13, 12, 0)
    assert either.next_slot(start) == ms(2026, 1, 2, 12, 0)  # a Friday
    assert either.slots_between(start, ms(2026, 1, 31)) == [
        ms(2026, 1, d, 12, 0) for d in (2, 9, 13, 16, 23, 30)
    ]


def test_rare_schedules_are_found_far_ahead() -> None:
    leap_monday = Cron("0 0 29 2 1", day_or=False)  # 29 February falling on a Monday
    assert leap_monday.next_slot(ms(2026, 1, 1)) == ms(2044, 2, 29)


def test_cron_is_safe_to_share_between_threads() -> None:
    from concurrent.futures import ThreadPoolExecutor

    cron = Cron("*/5 * * * *", "America/New_York")
    starts = [ms(2025, 11, 1, 22) + i * 61_000 for i in range(400)]
    expected = [Cron("*/5 * * * *", "America/New_York").next_slot(s) for s in starts]
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(cron.next_slot, starts)) == expected


@pytest.mark.parametrize(
    "schedule",
    [
        Every("10s"),
        Every("1h", offset="5m"),
        Every("500ms"),
        Cron("30 2 * * *", "America/New_York"),
        Cron("*/5 * * * * 30"),
        Cron("0 0 1 * mon", day_or=False),
        Cron("@daily", "Europe/Athens"),
    ],
)
def test_the_canonical_text_rebuilds_the_same_schedule(schedule: Schedule) -> None:
    rebuilt = from_canonical(schedule.canonical())
    assert rebuilt == schedule and rebuilt.fingerprint() == schedule.fingerprint()
    start = ms(2026, 3, 1)
    assert rebuilt.slots_between(start, start + 40 * 86_400_000, limit=50) == (
        schedule.slots_between(start, start + 40 * 86_400_000, limit=50)
    )


@pytest.mark.parametrize(
    "text", ["every/v2 interval_ms=1000 offset_ms=0", "every 10s", "cron/v1 * * * * * tz=UTC", ""]
)
def test_text_that_is_not_canonical_is_refused(text: str) -> None:
    with pytest.raises(ConfigurationError, match="not the canonical text"):
        from_canonical(text)


# --------------------------------------------------------------------------- bounds


def test_slots_lie_between_the_years_100_and_9899() -> None:
    """So that a slot plus or minus any duration (at most 3650d) is still a datetime."""
    first, end = ms(100, 1, 1), ms(9900, 1, 1)
    assert Every("1d").next_slot(first) == first + DAY
    for slot in Every("3650d").slots_between(end - 4000 * DAY, end + DAY):  # none raises
        assert end - 4000 * DAY < slot <= end
    for schedule in (Every("1d"), Cron("0 0 * * *")):
        with pytest.raises(ConfigurationError, match="from the year 100 to 9899"):
            schedule.next_slot(first - 1)
        with pytest.raises(ConfigurationError, match="from the year 100 to 9899"):
            schedule.next_slot(end + 1)
        with pytest.raises(ConfigurationError, match=r"no slot after .* before the year 9900"):
            schedule.next_slot(end)
        assert schedule.slots_between(end - 2 * DAY, end + 10 * DAY) == [end - DAY, end]


def test_every_refuses_durations_beyond_ten_years() -> None:
    assert Every("3650d").interval_ms == 3650 * DAY
    with pytest.raises(ConfigurationError, match="interval '3651d' is not valid: it is too long"):
        Every("3651d")
    with pytest.raises(ConfigurationError, match="at most 3650d"):
        Every(dt.timedelta(days=10**6))


@pytest.mark.parametrize(
    "text",
    [
        "every/v1 interval_ms=99999999999999999999999999 offset_ms=0",
        "every/v1 interval_ms=1000 offset_ms=99999999999999999999999999",
        "every/v1 interval_ms=" + "9" * 5000 + " offset_ms=0",
        "every/v1 interval_ms=0 offset_ms=0",
        "cron/v1 " + "* " * 3000 + "tz=UTC day_or=1",
        "cron/v1 * * * * * tz=Nowhere/City day_or=1",
    ],
)
def test_from_canonical_refuses_forged_registry_text_clearly(text: str) -> None:
    """The registry is read from the store: a forged entry must not break the dashboard."""
    with pytest.raises(ConfigurationError) as info:
        from_canonical(text)
    assert len(str(info.value)) < 500


def test_long_cron_expressions_and_zones_are_quoted_briefly() -> None:
    with pytest.raises(ConfigurationError, match=r"longer than 1000 characters") as info:
        Cron("0 " * 4000)
    assert len(str(info.value)) < 500
    with pytest.raises(ConfigurationError, match=r"\(5000 characters\)") as info:
        Cron("0 * * * *", tz="Z" * 5000)
    assert len(str(info.value)) < 300


def test_zoned_slots_mark_daylight_saving_time_and_its_changes() -> None:
    daily = Cron("0 3 * * *", "Europe/Athens")
    after = parse_instant_ms("2026-03-26T12:00:00Z")  # DST starts on Sunday the 29th
    slots = zoned_slots(daily, after, 5)
    assert [z.local.strftime("%d %H:%M %Z") for z in slots] == [
        "27 03:00 EET",
        "28 03:00 EET",
        "29 04:00 EEST",
        "30 03:00 EEST",
        "31 03:00 EEST",
    ]  # 03:00 does not exist on the 29th: cron runs at 04:00
    assert [z.dst for z in slots] == [False, False, True, True, True]
    assert [z.offset_changed for z in slots] == [False, False, True, False, False]
    assert [z.slot for z in slots] == daily.next_slots(after, 5)
    assert zoned_slots(At("2026-03-27T00:00:00Z"), after, 5)[0].local.tzname() == "UTC"


@pytest.mark.parametrize(
    ("zone", "summer"),
    [
        ("Europe/Dublin", "07"),  # tzdata: IST is standard, GMT a negative DST
        ("Australia/Sydney", "01"),  # southern hemisphere
        ("America/New_York", "07"),
        ("Asia/Tokyo", None),  # no DST
    ],
)
def test_zoned_slots_mark_summer_time_in_every_hemisphere(zone: str, summer: str | None) -> None:
    monthly = Cron("0 12 1 * *", zone)
    slots = zoned_slots(monthly, parse_instant_ms("2026-01-15T00:00:00Z"), 12)
    marked = {z.local.strftime("%m") for z in slots if z.dst}
    assert (summer in marked) if summer else not marked
    assert len(marked) in ((0,) if summer is None else range(4, 9))
