"""The types of the command's options: times, durations and bounded integers, each
refused with the form it accepts."""

from __future__ import annotations

import argparse
import re

from ..backend import wall_clock_ms
from ..durations import parse_duration_ms
from ..errors import ConfigurationError
from ._format import parse_instant_ms

__all__ = [
    "TIME_HELP",
    "demo_instances",
    "duration_ms",
    "nonnegative_int",
    "parse_time_ms",
    "positive_int",
]

TIME_HELP = (
    "(ISO-8601, UTC if it has no offset, e.g. 2026-12-03T08:00; epoch ms; "
    "or a duration such as 1h meaning that long ago)"
)


def parse_time_ms(text: str) -> int:
    """``--since``/``--until``: an ISO-8601 time, epoch ms, or a duration ago, as epoch ms."""
    if re.fullmatch(r"(?:[0-9]+(?:ms|d|h|m|s))+", text.strip()):
        return wall_clock_ms() - parse_duration_ms(text.strip(), what="time")
    return parse_instant_ms(text, other_forms=", or a duration ago (1h)")


def duration_ms(text: str) -> int:
    try:
        return parse_duration_ms(text, what="duration")
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def nonnegative_int(text: str) -> int:
    return _int_at_least(text, 0)


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def demo_instances(text: str) -> int:
    return _int_at_least(text, 2, "a takeover needs at least two instances")


def _int_at_least(text: str, minimum: int, why: str = "") -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not valid: give an integer >= {minimum}" + (f" ({why})" if why else "")
        )
    return value
