"""Durations: the accepted forms, every rejection, and the canonical display."""

from __future__ import annotations

import datetime as dt

import pytest

from anarchon_core.durations import (
    MAX_DURATION_MS,
    format_duration_ms,
    parse_duration_ms,
    validate_ms,
)
from anarchon_core.errors import ConfigurationError


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("1ms", 1),
        ("10s", 10_000),
        ("5m", 300_000),
        ("1h", 3_600_000),
        ("1h30m", 5_400_000),
        ("1d", 86_400_000),
        ("2h15m30s500ms", 8_130_500),
        ("1d1h1m1s1ms", 90_061_001),
        ("1m5ms", 60_005),
        ("90s", 90_000),
        ("0d10s", 10_000),
        ("007s", 7_000),
    ],
)
def test_parses_strings(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (dt.timedelta(seconds=10), 10_000),
        (dt.timedelta(milliseconds=1), 1),
        (dt.timedelta(days=2, hours=3), 183_600_000),
        (dt.timedelta(microseconds=5_000), 5),
    ],
)
def test_parses_timedeltas(value: dt.timedelta, ms: int) -> None:
    assert parse_duration_ms(value) == ms


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (10, "bare number"),
        (10.0, "bare number"),
        (1.5, "bare number"),
        (True, "bare number"),
        ("10", "bare number"),
        ("1.5", "bare number"),
        ("1e3", "bare number"),
        ("-10s", "negative"),
        ("+10s", "<number><unit>"),
        ("0s", "longer than zero"),
        ("0ms", "longer than zero"),
        ("0h0m", "longer than zero"),
        ("", "empty"),
        ("10x", "<number><unit>"),
        ("10sec", "<number><unit>"),
        ("10S", "<number><unit>"),
        ("1w", "<number><unit>"),
        ("s", "<number><unit>"),
        ("1.5s", "fractions"),
        ("10 s", "spaces"),
        (" 10s", "spaces"),
        ("1h 30m", "spaces"),
        ("5m1h", "largest to smallest"),
        ("10ms1s", "largest to smallest"),
        ("30s1m", "largest to smallest"),
        ("1h1h", "more than once"),
        ("5m5m", "more than once"),
        ("1\u0663s", "<number><unit>"),  # a non-ASCII digit
        (None, "NoneType"),
        ([10], "list"),
        (dt.timedelta(0), "longer than zero"),
        (dt.timedelta(seconds=-1), "negative"),
        (dt.timedelta(microseconds=1500), "whole number of milliseconds"),
        (dt.timedelta(microseconds=1), "whole number of milliseconds"),
    ],
)
def test_rejections_name_the_value_and_the_accepted_forms(value: object, reason: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_duration_ms(value)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith(f"interval {value!r} is not valid: ")
    assert reason in message
    assert '"500ms", "10s", "5m", "1h30m", "1d"' in message
    assert "datetime.timedelta" in message


def test_bare_number_message_matches_the_documented_example() -> None:
    with pytest.raises(ConfigurationError, match=r"^interval 10 is not valid: .*give a string"):
        parse_duration_ms(10)  # type: ignore[arg-type]


def test_configuration_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_duration_ms("soon")


def test_what_names_the_setting() -> None:
    with pytest.raises(ConfigurationError, match=r"^job 'sync': option catch_up_window '1'"):
        parse_duration_ms("1", what="job 'sync': option catch_up_window")


def test_allow_zero_admits_zero_but_not_negative() -> None:
    assert parse_duration_ms("0s", what="offset", allow_zero=True) == 0
    assert parse_duration_ms(dt.timedelta(0), what="offset", allow_zero=True) == 0
    with pytest.raises(ConfigurationError, match=r"^offset '-1s'"):
        parse_duration_ms("-1s", what="offset", allow_zero=True)
    with pytest.raises(ConfigurationError, match="bare number"):
        parse_duration_ms(0, what="offset", allow_zero=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (1, "1ms"),
        (500, "500ms"),
        (10_000, "10s"),
        (300_000, "5m"),
        (5_400_000, "1h30m"),
        (86_400_000, "1d"),
        (90_061_001, "1d1h1m1s1ms"),
        (8_130_500, "2h15m30s500ms"),
        (172_800_000, "2d"),
        (3_600_001, "1h1ms"),
    ],
)
def test_format_is_canonical(ms: int, text: str) -> None:
    assert format_duration_ms(ms) == text


@pytest.mark.parametrize("ms", [1, 999, 1000, 59_999, 61_001, 3_599_999, 86_399_999, 10**11 + 7])
def test_format_round_trips(ms: int) -> None:
    assert parse_duration_ms(format_duration_ms(ms)) == ms


def test_format_rejects_negative_and_non_integers() -> None:
    with pytest.raises(ConfigurationError, match="negative"):
        format_duration_ms(-1)
    with pytest.raises(TypeError):
        format_duration_ms(1.5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- bounds


def test_the_maximum_is_ten_years_and_is_accepted() -> None:
    assert format_duration_ms(MAX_DURATION_MS) == "3650d"
    assert parse_duration_ms("3650d") == MAX_DURATION_MS
    assert parse_duration_ms(dt.timedelta(days=3650)) == MAX_DURATION_MS


@pytest.mark.parametrize(
    "value",
    [
        "3650d1ms",
        "99999999999999999999d",
        "9" * 60 + "ms",
        dt.timedelta(days=3651),
        dt.timedelta.max - dt.timedelta(microseconds=dt.timedelta.max.microseconds),
    ],
)
def test_longer_than_the_maximum_is_refused_naming_the_bound(value: object) -> None:
    with pytest.raises(ConfigurationError, match=r"too long: at most 3650d"):
        parse_duration_ms(value)  # type: ignore[arg-type]


def test_a_tighter_maximum_is_named() -> None:
    assert parse_duration_ms("7d", maximum=7 * 86_400_000) == 7 * 86_400_000
    with pytest.raises(ConfigurationError, match="too long: at most 7d"):
        parse_duration_ms("7d1ms", maximum=7 * 86_400_000)


@pytest.mark.parametrize("value", ["1" * 10_000 + "s", "5m" * 5000, " " * 10_000, "x" * 10**6])
def test_huge_strings_are_refused_quickly_and_quoted_briefly(value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_duration_ms(value)
    message = str(info.value)
    assert f"({len(value)} characters)" in message
    assert len(message) < 400


def test_a_huge_bare_integer_is_quoted_briefly() -> None:
    with pytest.raises(ConfigurationError, match="bare number") as info:
        parse_duration_ms(10**5000)  # type: ignore[arg-type]
    assert len(str(info.value)) < 400


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (0, True),
        (MAX_DURATION_MS, True),
        (-1, False),
        (MAX_DURATION_MS + 1, False),
        (10**19, False),
        (True, False),
        (1.0, False),
        ("1000", False),
        (None, False),
    ],
)
def test_validate_ms_names_the_setting_and_both_bounds(value: object, ok: bool) -> None:
    if ok:
        assert validate_ms(value, "grace_ms") == value
        return
    with pytest.raises(ConfigurationError) as info:
        validate_ms(value, "grace_ms")
    assert str(info.value).startswith("grace_ms = ")
    assert f"from 0 to {MAX_DURATION_MS} (3650d)" in str(info.value)
