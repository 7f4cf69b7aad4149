"""Durations as users write them (``"500ms"``, ``"1h30m"``, ``timedelta``) and as we show them.

Every duration inside anarchon is an ``int`` of milliseconds, because slots are integer
milliseconds since the epoch and integer arithmetic is exact and identical on every replica.
Users write durations with units so that a value is never ambiguous: a bare ``10`` could mean
seconds (Celery, ``time.sleep``) or milliseconds (JavaScript, our own ``*_ms`` options), and
guessing wrong would make a job run 1000 times too often or too rarely.  So bare numbers are
rejected, and every error names the bad value and shows the accepted forms.

Grammar: one or more ``<digits><unit>`` parts with the units ``d``, ``h``, ``m``, ``s`` and
``ms``, largest first, each at most once, no spaces, no signs and no fractions
(``"2h15m30s500ms"``).  A ``datetime.timedelta`` must be a whole number of milliseconds.

Bounds: every duration is at most :data:`MAX_DURATION_MS` (``3650d``, about ten years),
and every slot lies between the years 100 and 9900 (see :mod:`anarchon_core.schedules`),
so a slot plus or minus any duration is still a valid ``datetime`` and far inside the
signed 64-bit millisecond columns of every store.  Settings with a tighter meaning (the
claim horizon, the retry backoff) have tighter bounds of their own.
"""

from __future__ import annotations

import datetime as dt
import operator
import re

from .errors import ConfigurationError
from .redact import brief

__all__ = ["MAX_DURATION_MS", "format_duration_ms", "parse_duration_ms", "validate_ms"]

#: The longest duration anarchon accepts anywhere: 3650 days, about ten years.
MAX_DURATION_MS = 3650 * 86_400_000
#: Longer duration strings are refused before parsing: the longest canonical text is
#: ``"3650d23h59m59s999ms"``; leading zeros get some room.
_MAX_TEXT = 64

#: Milliseconds per unit, largest first: the order the grammar requires and the display uses.
_UNITS: dict[str, int] = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
_UNIT_RANK = {unit: rank for rank, unit in enumerate(_UNITS)}

# "ms" comes before "m" in the alternation so that "5ms" is never read as "5m" + "s".
_PART = re.compile(r"([0-9]+)(ms|d|h|m|s)", re.ASCII)
_WHOLE = re.compile(r"(?:[0-9]+(?:ms|d|h|m|s))+", re.ASCII)
_BARE_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)

_ACCEPTED = (
    'give a string such as "500ms", "10s", "5m", "1h30m", "1d" (units d, h, m, s, ms, '
    "largest first, each at most once, no spaces) or a datetime.timedelta"
)
_ONE_MS = dt.timedelta(milliseconds=1)


def _invalid(what: str, value: object, reason: str) -> ConfigurationError:
    return ConfigurationError(f"{what} {brief(value)} is not valid: {reason}; {_ACCEPTED}")


def parse_duration_ms(
    value: str | dt.timedelta,
    *,
    what: str = "interval",
    allow_zero: bool = False,
    maximum: int = MAX_DURATION_MS,
) -> int:
    """Return ``value`` as a number of milliseconds, or raise ``ConfigurationError``.

    ``what`` names the setting in the error message (``"interval"``, ``"offset"``,
    ``"job 'sync': option catch_up_window"``) so the user can find the bad line.
    ``allow_zero`` admits ``"0s"`` / ``timedelta(0)``; it exists for offsets, where
    "no offset" is meaningful.  Negative durations are never accepted, nor any longer
    than ``maximum`` (default :data:`MAX_DURATION_MS`), so that every sum of a slot and
    a duration stays a valid instant.
    """
    if isinstance(value, dt.timedelta):
        ms = _from_timedelta(value, what, allow_zero)
    elif isinstance(value, str):
        ms = _from_string(value, what, allow_zero)
    elif isinstance(value, int | float):  # bool is an int: also a bare number here
        raise _invalid(what, value, "a bare number has no unit")
    else:
        raise _invalid(what, value, f"a {type(value).__name__} is not a duration")
    if ms > maximum:
        raise _invalid(what, value, f"it is too long: at most {format_duration_ms(maximum)}")
    return ms


def validate_ms(
    value: object,
    what: str,
    *,
    minimum: int = 0,
    maximum: int = MAX_DURATION_MS,
    optional: bool = False,
) -> int:
    """Return ``value`` if it is an ``int`` of milliseconds within the bounds, else raise.

    For the ``*_ms`` settings (``heartbeat_ms``, ``timeout_ms``, …), which take plain
    integers of milliseconds: the error names the setting and both bounds.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        none = "None or " if optional else ""
        raise ConfigurationError(
            f"{what} = {brief(value)} is not valid: give {none}an int of milliseconds from "
            f"{minimum} to {maximum} ({format_duration_ms(maximum)})"
        )
    return value


def _from_timedelta(value: dt.timedelta, what: str, allow_zero: bool) -> int:
    if value < dt.timedelta(0):
        raise _invalid(what, value, "it is negative")
    if value % _ONE_MS:
        raise _invalid(what, value, "it is not a whole number of milliseconds")
    ms = value // _ONE_MS
    if ms == 0 and not allow_zero:
        raise _invalid(what, value, "it must be longer than zero")
    return ms


def _from_string(value: str, what: str, allow_zero: bool) -> int:
    if not value:
        raise _invalid(what, value, "it is empty")
    if len(value) > _MAX_TEXT:
        raise _invalid(what, value, f"it is longer than {_MAX_TEXT} characters")
    if _BARE_NUMBER.fullmatch(value):
        raise _invalid(what, value, "a bare number has no unit")
    if value.startswith("-"):
        raise _invalid(what, value, "it is negative")
    if not _WHOLE.fullmatch(value):
        if any(ch.isspace() for ch in value):
            reason = "spaces are not allowed"
        elif "." in value:
            reason = "fractions are not allowed (write 1s500ms, not 1.5s)"
        else:
            reason = "it is not a sequence of <number><unit> parts"
        raise _invalid(what, value, reason)
    total = 0
    previous = -1
    for digits, unit in _PART.findall(value):
        rank = _UNIT_RANK[unit]
        if rank == previous:
            raise _invalid(what, value, f"the unit {unit!r} appears more than once")
        if rank < previous:
            raise _invalid(what, value, "units must go from largest to smallest")
        previous = rank
        total += int(digits) * _UNITS[unit]
    if total == 0 and not allow_zero:
        raise _invalid(what, value, "it must be longer than zero")
    return total


def format_duration_ms(ms: int) -> str:
    """Return the canonical text of a duration: ``5400000 -> "1h30m"``, ``0 -> "0s"``.

    The canonical form uses each unit at most once, largest first, and omits zero parts,
    so ``parse_duration_ms(format_duration_ms(n)) == n`` for every ``n > 0``.  It is what
    descriptions, ``repr`` and fingerprints show, so equal durations always print alike.
    """
    remaining = operator.index(ms)
    if remaining < 0:
        raise ConfigurationError(f"duration {brief(ms)} is not valid: it is negative")
    if remaining == 0:
        return "0s"
    parts: list[str] = []
    for unit, size in _UNITS.items():
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
