"""Schedules: pure functions from a definition to slots (integer ms since the epoch, UTC).

Every replica computes the slots of a job on its own, with no communication, and the store
then picks one winner per ``(job, slot)``.  That only works if every replica computes exactly
the same integers, so a schedule depends on nothing but its definition: never on the machine's
local time zone, the time the process started, or the ``TZ`` variable.

* :class:`Every` lays slots on a grid counted from 1970-01-01T00:00:00Z, so ``Every("10s")``
  fires at :00, :10, :20 ... whenever each replica happened to start.
* :class:`Cron` evaluates a cron expression (parsed and matched by ``croniter``) in an IANA
  zone, with the daylight-saving rules of classic (Vixie/ISC) cron; see ``docs/schedules.md``.
* :class:`At` has one slot (a one-off), and :class:`Window` bounds another schedule's slots
  to ``[start_at, end_at]``: these two run out, and then answer :data:`NO_SLOT`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import heapq
import operator
import re
import zoneinfo
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from croniter import croniter

from .durations import format_duration_ms, parse_duration_ms
from .errors import ConfigurationError, refusing
from .redact import brief

__all__ = [
    "NO_SLOT",
    "At",
    "Cron",
    "Every",
    "Schedule",
    "Window",
    "ZonedSlot",
    "format_instant_ms",
    "from_canonical",
    "parse_instant_ms",
    "zoned_slots",
]

_UTC = dt.UTC
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_ONE_MS = dt.timedelta(milliseconds=1)
# Slots lie in the years 100 to 9899: a slot plus or minus any duration (at most 3650d,
# see durations.MAX_DURATION_MS) and a day of zone arithmetic is still a datetime.
_FIRST_YEAR, _END_YEAR = 100, 9900
_MIN_MS = (dt.datetime(_FIRST_YEAR, 1, 1, tzinfo=_UTC) - _EPOCH) // _ONE_MS
_MAX_MS = (dt.datetime(_END_YEAR, 1, 1, tzinfo=_UTC) - _EPOCH) // _ONE_MS
#: Bumped if the meaning of a definition ever changes, so that replicas on different
#: versions report different fingerprints instead of silently computing different slots.
_SEMANTICS = "v1"
#: What :meth:`Schedule.next_slot` of a schedule that has run out (:class:`At`,
#: :class:`Window`) returns: later than every slot, so that ``slot < NO_SLOT`` holds for
#: every real one. The unbounded schedules never return it.
NO_SLOT = _MAX_MS + 1


class Schedule(ABC):
    """A deterministic source of slots.  Subclasses must be immutable and pure.

    Equality, hashing and :meth:`fingerprint` all derive from :meth:`canonical`, so two
    schedules that print the same canonical text are interchangeable on every replica.
    """

    __slots__ = ()

    @abstractmethod
    def next_slot(self, after_ms: int) -> int:
        """Return the first slot strictly after ``after_ms``."""

    @abstractmethod
    def slots_between(self, start_ms: int, end_ms: int, *, limit: int | None = None) -> list[int]:
        """Return the slots ``s`` with ``start_ms < s <= end_ms``, ascending, at most ``limit``."""

    @abstractmethod
    def describe(self) -> str:
        """Return a short human description, e.g. ``every 10s``."""

    @property
    @abstractmethod
    def tz(self) -> str:
        """The IANA zone the schedule is evaluated in (``"UTC"`` for grid schedules)."""

    @abstractmethod
    def canonical(self) -> str:
        """Return the normalized definition that equality and the fingerprint are based on."""

    def next_slots(self, after_ms: int, count: int) -> list[int]:
        """The next ``count`` slots after ``after_ms``, fewer where the schedule runs out
        (:data:`NO_SLOT`): what the command line, the API and the dashboard show."""
        slots: list[int] = []
        for _ in range(count):
            after_ms = self.next_slot(after_ms)
            if after_ms >= NO_SLOT:
                break
            slots.append(after_ms)
        return slots

    def fingerprint(self) -> str:
        """A short stable hex hash of :meth:`canonical`.

        Claims carry it so that replicas which disagree about a job's schedule (a rolling
        deploy that changed it) can be noticed; it is identical across processes and
        machines, unlike ``hash()``.
        """
        return hashlib.sha256(self.canonical().encode()).hexdigest()[:16]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return type(self) is type(other) and self.canonical() == other.canonical()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.canonical()))


_MAX_CANONICAL = 2000
_CANONICAL = re.compile(
    r"every/(?P<e>\w+) interval_ms=(?P<interval>\d+) offset_ms=(?P<offset>\d+)"
    r"|cron/(?P<c>\w+) (?P<fields>[^=]+) tz=(?P<tz>\S+) day_or=(?P<day_or>[01])"
    r"|at/(?P<a>\w+) at_ms=(?P<at>-?\d+)"
)
_WINDOW = re.compile(r"(?P<inner>.+) window start_ms=(?P<start>-?\d+|-) end_ms=(?P<end>-?\d+|-)")


def from_canonical(text: str) -> Schedule:
    """The schedule whose :meth:`Schedule.canonical` text is ``text``.

    The instance registry keeps this text, so a tool that has only the store (the
    dashboard, ``anarchon jobs --backend``) computes the same next slots as the replicas.

    :raises ConfigurationError: not the canonical text of a built-in schedule of this
        version's semantics (a custom schedule, or a newer anarchon).
    """
    ok = isinstance(text, str) and len(text) <= _MAX_CANONICAL
    window = _WINDOW.fullmatch(text) if ok else None
    if window is not None:
        start, end = (None if v == "-" else int(v) for v in (window["start"], window["end"]))
        return Window(from_canonical(window["inner"]), start_at=start, end_at=end)
    match = _CANONICAL.fullmatch(text) if ok else None
    if match is None or (match["e"] or match["c"] or match["a"]) != _SEMANTICS:
        raise ConfigurationError(
            f"schedule {brief(text)} is not the canonical text of an Every, Cron, At or "
            f"Window schedule of semantics {_SEMANTICS}"
        )
    if match["e"]:  # as strings: the duration bounds apply before any arithmetic
        offset = match["offset"].lstrip("0")
        return Every(f"{match['interval']}ms", f"{offset}ms" if offset else None)
    if match["a"]:
        return At(int(match["at"]))
    return Cron(match["fields"], match["tz"], day_or=match["day_or"] == "1")


def _check_ms(name: str, value: int) -> int:
    ms = operator.index(value)
    if not _MIN_MS <= ms <= _MAX_MS:
        raise ConfigurationError(
            f"{name} {brief(value)} is not valid: give integer milliseconds since the Unix "
            f"epoch from the year {_FIRST_YEAR} to {_END_YEAR - 1}"
        )
    return ms


def _no_slot(schedule: Schedule, after_ms: int) -> ConfigurationError:
    return ConfigurationError(
        f"{schedule.describe()} has no slot after {brief(after_ms)} before the year {_END_YEAR}"
    )


def _check_limit(limit: int | None) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or operator.index(limit) < 0:
        raise ConfigurationError(f"limit {brief(limit)} is not valid: give None or an integer >= 0")
    return operator.index(limit)


class Every(Schedule):
    """Slots on the epoch grid: ``k * interval_ms + offset_ms`` for every integer ``k``.

    Counting from the epoch (not from start-up) is what makes every replica agree: a
    replica that starts at 12:00:03 and one that starts at 12:00:07 both fire ``Every("10s")``
    at 12:00:10.  ``offset`` shifts the grid, e.g. ``Every("1h", offset="5m")`` fires at
    :05 past every hour (UTC), so that hourly jobs need not all start at :00.
    """

    __slots__ = ("_interval_ms", "_offset_ms")

    def __init__(
        self, interval: str | dt.timedelta, offset: str | dt.timedelta | None = None
    ) -> None:
        with refusing("duration"):
            self._check(interval, offset)

    def _check(self, interval: str | dt.timedelta, offset: str | dt.timedelta | None) -> None:
        self._interval_ms = parse_duration_ms(interval, what="interval")
        if offset is None:
            self._offset_ms = 0
        else:
            self._offset_ms = parse_duration_ms(offset, what="offset", allow_zero=True)
        if self._offset_ms >= self._interval_ms:
            raise ConfigurationError(
                f"offset {brief(offset)} is not valid for interval {brief(interval)}: the offset "
                f"({format_duration_ms(self._offset_ms)}) must be shorter than the interval "
                f"({format_duration_ms(self._interval_ms)}), e.g. Every('1h', offset='5m')"
            )

    @property
    def interval_ms(self) -> int:
        return self._interval_ms

    @property
    def offset_ms(self) -> int:
        return self._offset_ms

    @property
    def tz(self) -> str:
        return "UTC"

    def next_slot(self, after_ms: int) -> int:
        slot = self._first_after(_check_ms("after_ms", after_ms))
        if slot > _MAX_MS:
            raise _no_slot(self, after_ms)
        return slot

    def _first_after(self, after: int) -> int:
        k = (after - self._offset_ms) // self._interval_ms + 1
        return k * self._interval_ms + self._offset_ms

    def slots_between(self, start_ms: int, end_ms: int, *, limit: int | None = None) -> list[int]:
        cap = _check_limit(limit)
        end = min(operator.index(end_ms), _MAX_MS)
        first = self._first_after(_check_ms("start_ms", start_ms))
        if first > end:
            return []
        count = (end - first) // self._interval_ms + 1
        if cap is not None:
            count = min(count, cap)
        return list(range(first, first + count * self._interval_ms, self._interval_ms))

    def describe(self) -> str:
        text = f"every {format_duration_ms(self._interval_ms)}"
        if self._offset_ms:
            text += f" offset {format_duration_ms(self._offset_ms)}"
        return text

    def canonical(self) -> str:
        return f"every/{_SEMANTICS} interval_ms={self._interval_ms} offset_ms={self._offset_ms}"

    def __repr__(self) -> str:
        interval = format_duration_ms(self._interval_ms)
        if self._offset_ms:
            return f"Every({interval!r}, offset={format_duration_ms(self._offset_ms)!r})"
        return f"Every({interval!r})"


# --------------------------------------------------------------------------- cron

_CRON_FORM = (
    "give 5 fields: minute hour day-of-month month day-of-week, such as '*/15 * * * *' "
    "or '0 3 * * mon-fri' (a 6th field, last, is seconds: '* * * * * */10')"
)
_ZONE_FORM = "give an IANA time zone name such as 'Europe/Athens' or 'UTC'"
#: Longer expressions are refused before parsing (every minute listed one by one is 170).
MAX_CRON_LENGTH = 1000
_ALIASES = {
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
# croniter's "H" (hashed) and "R" (random) values would differ between replicas.
_HASH_OR_RANDOM = re.compile(r"[hr](\([0-9]+-[0-9]+\))?(/[0-9]+)?", re.ASCII | re.IGNORECASE)
_FIELDS = re.compile(r"\S+", re.ASCII)  # the field separator croniter itself uses
# Offsets are probed this far on either side of an instant: beyond the largest clock
# change in the tz database (24 h, Pacific/Apia at the end of 2011).
_PROBE = dt.timedelta(hours=26)
_PROBE_MS = _PROBE // _ONE_MS
_BLOCK_MS = 6 * 3_600_000
_MARGIN_MS = 60_000
_POOL_SIZE = 4


@lru_cache(maxsize=1)
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def _load_zone(tz: object) -> zoneinfo.ZoneInfo:
    """Resolve an IANA name; refuse anything whose meaning could differ between machines."""
    name = tz.key if isinstance(tz, zoneinfo.ZoneInfo) else tz
    if not isinstance(name, str):
        raise ConfigurationError(f"time zone {brief(tz)} is not valid: {_ZONE_FORM}")
    # "localtime" is the machine's own zone; the membership test also catches names that
    # only load on case-insensitive file systems ("europe/athens" on macOS).
    if name == "localtime" or name not in _zone_names():
        raise ConfigurationError(f"time zone {brief(name)} is not valid: {_ZONE_FORM}")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ConfigurationError(f"time zone {brief(name)} is not valid: {_ZONE_FORM}") from exc


def _normalize_expression(expression: object) -> tuple[str, list[str]]:
    """Return (expression with single spaces, canonical lower-case fields) or raise."""
    if not isinstance(expression, str):
        raise ConfigurationError(f"cron expression {brief(expression)} is not valid: {_CRON_FORM}")
    if len(expression) > MAX_CRON_LENGTH:
        raise ConfigurationError(
            f"cron expression {brief(expression)} is not valid: it is longer than "
            f"{MAX_CRON_LENGTH} characters; {_CRON_FORM}"
        )
    text = " ".join(_FIELDS.findall(expression))
    fields = _FIELDS.findall(_ALIASES.get(text.lower(), text.lower()))

    def bad(reason: str) -> ConfigurationError:
        return ConfigurationError(
            f"cron expression {brief(expression)} is not valid: {reason}; {_CRON_FORM}"
        )

    if len(fields) not in (5, 6):
        year = " (a year field is not supported)" if len(fields) == 7 else ""
        raise bad(f"it has {len(fields)} fields{year}")
    for field in fields:
        if any(_HASH_OR_RANDOM.fullmatch(part) for part in field.split(",")):
            raise bad("H (hashed) and R (random) values would differ between replicas")
    try:
        croniter.expand(" ".join(fields))
    except (ValueError, TypeError, KeyError, OverflowError) as exc:  # mostly ValueErrors
        raise bad(brief(str(exc), 120) if str(exc) else type(exc).__name__) from exc
    return text, fields


def _naive_ms(wall: dt.datetime) -> int:
    return (wall - _EPOCH_NAIVE) // _ONE_MS


def _utc(ms: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(milliseconds=ms)


def _offset_ms(zone: zoneinfo.ZoneInfo, instant: dt.datetime) -> int:
    offset = instant.astimezone(zone).utcoffset()
    assert offset is not None  # a ZoneInfo always has an offset
    return offset // _ONE_MS


@lru_cache(maxsize=4096)
def _block_change(zone: zoneinfo.ZoneInfo, block: int) -> tuple[int, int] | None:
    """The clock change inside the 6-hour block ``block`` as (instant ms, size ms), if any.

    Found by bisection and cached, because the walk asks about the same few transitions
    over and over.  Assumes at most one change per block: in the tz database from 1970 to
    2100 no two changes of any zone are within 30 hours, and the largest change is 24 hours.
    """
    lo, hi = block * _BLOCK_MS, (block + 1) * _BLOCK_MS
    lo_offset, hi_offset = _offset_ms(zone, _utc(lo)), _offset_ms(zone, _utc(hi))
    if lo_offset == hi_offset:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _offset_ms(zone, _utc(mid)) == lo_offset:
            lo = mid
        else:
            hi = mid
    return hi, abs(hi_offset - lo_offset)


class Cron(Schedule):
    """A cron expression evaluated in an IANA zone (default ``"UTC"``, never the local zone).

    ``day_or=True`` is standard cron day matching: when both day-of-month and day-of-week are
    restricted, a day matching either fires.  ``day_or=False`` requires both (Celery's rule).

    Daylight saving, identical on every replica (classic Vixie/ISC cron):

    * Fall back: if the hour field is fixed (a number, list or range; anything not starting
      with ``*``), a repeated wall time fires once, at its first occurrence.  If the hour
      field starts with ``*`` (``*``, ``*/n``), it fires at every real occurrence.
    * Spring forward: a fixed-hour wall time that does not exist fires once, shifted forward
      by the gap (PEP 495 ``fold=0``: New York 02:30 -> 03:30 EDT); ``*``-hour entries have
      one occurrence fewer.  Wall times that land on one instant are one slot.
    """

    __slots__ = ("_day_or", "_expression", "_fields", "_pool", "_star_hour", "_step", "_zone")

    def __init__(self, expression: str, tz: str = "UTC", *, day_or: bool = True) -> None:
        with refusing("zone"):
            self._zone = _load_zone(tz)
        with refusing("cron"):
            self._parse(expression, day_or)

    def _parse(self, expression: str, day_or: bool) -> None:
        if not isinstance(day_or, bool):
            raise ConfigurationError(f"day_or {brief(day_or)} is not valid: give True or False")
        self._expression, fields = _normalize_expression(expression)
        self._fields = " ".join(fields)
        self._day_or = day_or
        self._star_hour = fields[1].startswith("*")
        self._step = dt.timedelta(seconds=1 if len(fields) == 6 else 60)
        self._pool: list[croniter] = []
        # An expression that never matches (Feb 30) would make next_slot fail at run time.
        trial = self._new_iter()
        try:
            trial.get_next(dt.datetime, start_time=dt.datetime(2000, 1, 1))
        except ValueError as exc:
            raise ConfigurationError(
                f"cron expression {brief(expression)} is not valid: it never matches"
                f"{'' if day_or else ' with day_or=False'}; {_CRON_FORM}"
            ) from exc
        self._pool.append(trial)

    @property
    def expression(self) -> str:
        """The expression as given, with runs of whitespace collapsed to one space."""
        return self._expression

    @property
    def day_or(self) -> bool:
        return self._day_or

    @property
    def tz(self) -> str:
        return self._zone.key

    def describe(self) -> str:
        extra = "" if self._day_or else ", day_or=False"
        return f'cron "{self._expression}" ({self._zone.key}{extra})'

    def canonical(self) -> str:
        return f"cron/{_SEMANTICS} {self._fields} tz={self._zone.key} day_or={int(self._day_or)}"

    def __repr__(self) -> str:
        extra = "" if self._day_or else ", day_or=False"
        return f"Cron({self._expression!r}, tz={self._zone.key!r}{extra})"

    def __reduce__(self) -> tuple[object, tuple[str, str, bool]]:
        return (_make_cron, (self._expression, self._zone.key, self._day_or))

    def next_slot(self, after_ms: int) -> int:
        for slot in self._walk(_check_ms("after_ms", after_ms)):
            if slot > _MAX_MS:
                break
            return slot
        raise _no_slot(self, after_ms)

    def slots_between(self, start_ms: int, end_ms: int, *, limit: int | None = None) -> list[int]:
        cap = _check_limit(limit)
        end = operator.index(end_ms)
        out: list[int] = []
        if cap == 0 or end <= start_ms:
            return out
        for slot in self._walk(_check_ms("start_ms", start_ms)):
            if slot > end or slot > _MAX_MS:
                break
            out.append(slot)
            if len(out) == cap:
                break
        return out

    # -- evaluation ------------------------------------------------------------------

    def _new_iter(self) -> croniter:
        return croniter(self._fields, dt.datetime(2000, 1, 1), day_or=self._day_or)

    def _instants(self, wall: dt.datetime) -> tuple[list[int], int]:
        """Map one matching naive wall time to its slots by the rules in the class doc.

        Also returns the ``fold=0`` reading of the wall time (defined even in a gap), the
        anchor from which :meth:`_walk` bounds where later wall times can land.
        """
        early = wall.replace(tzinfo=self._zone).utcoffset()
        late = wall.replace(tzinfo=self._zone, fold=1).utcoffset()
        assert early is not None and late is not None  # a ZoneInfo always has an offset
        first = _naive_ms(wall) - early // _ONE_MS
        if early == late:  # an ordinary wall time
            return [first], first
        if early > late:  # repeated (fall back): fold=0 is the first occurrence
            if self._star_hour:
                return [first, _naive_ms(wall) - late // _ONE_MS], first
            return [first], first
        # Skipped (spring forward): fold=0 reads it with the earlier offset, i.e. it is
        # shifted forward by the gap.  "*"-hour entries have no occurrence here.
        return ([] if self._star_hour else [first]), first

    def _slack_ms(self, ms: int) -> int:
        """How far slot order may run backwards near ``ms``: the size of a nearby clock change.

        Around a transition of size ``D`` the wall -> instant map is not monotonic (a fall-back
        hour is walked twice, a shifted gap time lands after later wall times), but only for
        instants within ``D`` of the transition.  Away from transitions this is 0, which lets
        the walk below emit each slot as soon as it is found.
        """
        t = _utc(ms)
        here = _offset_ms(self._zone, t)
        if _offset_ms(self._zone, t - _PROBE) == here == _offset_ms(self._zone, t + _PROBE):
            return 0
        slack = 0
        for block in range((ms - _PROBE_MS) // _BLOCK_MS, (ms + _PROBE_MS) // _BLOCK_MS + 1):
            change = _block_change(self._zone, block)
            if change is not None and abs(ms - change[0]) <= change[1] + _MARGIN_MS:
                slack = max(slack, change[1] + _MARGIN_MS)
        return slack

    def _walk(self, after_ms: int) -> Iterator[int]:
        """Yield every slot strictly after ``after_ms`` in increasing order, without duplicates.

        croniter walks matching wall times in a naive (zone-less) calendar, where it is pure
        field matching; each wall time is mapped to 0, 1 or 2 instants by :meth:`_instants`.
        Instants wait in a heap until no later wall time can map before them: every later
        wall time maps at or after ``fold0(wall) - slack``.  The walk starts ``slack`` before
        the wall time of ``after_ms`` so that a second fall-back hour or a shifted gap time
        just before it is not missed.
        """
        wall = _utc(after_ms).astimezone(self._zone).replace(tzinfo=None)
        start = wall - dt.timedelta(milliseconds=self._slack_ms(after_ms)) - self._step
        try:
            it = self._pool.pop()
        except IndexError:
            it = self._new_iter()
        heap: list[int] = []
        last = after_ms
        try:
            it.set_current(start, force=True)
            bound: int | None = 0
            while bound is not None:
                try:
                    match: dt.datetime = it.get_next(dt.datetime)
                    instants, first = self._instants(match)
                    bound = first - self._slack_ms(first)
                except (ValueError, OverflowError):  # past the end of the calendar: drain
                    instants, bound = [], None
                for instant in instants:
                    if instant > last:
                        heapq.heappush(heap, instant)
                while heap and (bound is None or heap[0] <= bound):
                    slot = heapq.heappop(heap)
                    if slot > last:
                        last = slot
                        yield slot
        finally:
            if len(self._pool) < _POOL_SIZE:
                self._pool.append(it)


def _make_cron(expression: str, tz: str, day_or: bool) -> Cron:
    """Unpickle a :class:`Cron` (its croniter pool is rebuilt, not copied)."""
    return Cron(expression, tz, day_or=day_or)


# --------------------------------------------------------------------------- bounded

_INSTANT_FORM = (
    "give an ISO 8601 date and time with its UTC offset, such as '2026-12-24T18:00:00+02:00' "
    "or '2026-12-24T16:00:00Z', a datetime with a tzinfo, or integer epoch milliseconds"
)


def parse_instant_ms(value: object, *, what: str = "instant") -> int:
    """An instant as epoch ms: ISO 8601 text with an offset, an aware datetime, or ms.

    A time without an offset is refused: replicas in different zones would read it as
    different instants.
    """
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ConfigurationError(
                f"{what} {brief(value)} is not valid: {_INSTANT_FORM}"
            ) from None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ConfigurationError(
                f"{what} {brief(str(value))} is not valid: it has no UTC offset; {_INSTANT_FORM}"
            )
        ms = (value - _EPOCH) // _ONE_MS
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        raise ConfigurationError(f"{what} {brief(value)} is not valid: {_INSTANT_FORM}")
    if not _MIN_MS <= ms <= _MAX_MS:
        raise ConfigurationError(
            f"{what} {brief(value)} is not valid: it lies outside the years {_FIRST_YEAR} to "
            f"{_END_YEAR - 1}"
        )
    return ms


def format_instant_ms(ms: int) -> str:
    """Epoch ms as ISO 8601 UTC text to the millisecond (``2026-12-24T16:00:00.000Z``)."""
    t = _utc(ms)
    return f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond // 1000:03d}Z"


class At(Schedule):
    """One slot, at ``instant``: a one-off run (the store's claim makes it run once)."""

    __slots__ = ("_at_ms",)

    def __init__(self, instant: str | dt.datetime | int) -> None:
        with refusing("at"):
            self._at_ms = parse_instant_ms(instant, what="at")

    @property
    def at_ms(self) -> int:
        return self._at_ms

    @property
    def tz(self) -> str:
        return "UTC"

    def next_slot(self, after_ms: int) -> int:
        return self._at_ms if operator.index(after_ms) < self._at_ms else NO_SLOT

    def slots_between(self, start_ms: int, end_ms: int, *, limit: int | None = None) -> list[int]:
        cap = _check_limit(limit)
        if cap == 0 or not operator.index(start_ms) < self._at_ms <= operator.index(end_ms):
            return []
        return [self._at_ms]

    def describe(self) -> str:
        return f"at {format_instant_ms(self._at_ms)}"

    def canonical(self) -> str:
        return f"at/{_SEMANTICS} at_ms={self._at_ms}"

    def __repr__(self) -> str:
        return f"At({format_instant_ms(self._at_ms)!r})"


class Window(Schedule):
    """The slots of ``inner`` from ``start_at`` to ``end_at`` (both included, either open).

    ``start_at`` bounds the first slot: it is not "the first run" (the first run is the
    first slot at or after it). ``end_at`` is the last instant a slot may have.
    """

    __slots__ = ("_end", "_inner", "_start")

    def __init__(
        self,
        inner: Schedule,
        *,
        start_at: str | dt.datetime | int | None = None,
        end_at: str | dt.datetime | int | None = None,
    ) -> None:
        if not isinstance(inner, Schedule) or isinstance(inner, Window):
            raise ConfigurationError(
                f"window schedule {brief(inner)} is not valid: give an Every, Cron or At"
            )
        self._inner = inner
        with refusing("start_at"):
            self._start = None if start_at is None else parse_instant_ms(start_at, what="start_at")
        with refusing("end_at"):
            self._end = None if end_at is None else parse_instant_ms(end_at, what="end_at")
        if self._start is not None and self._end is not None and self._end < self._start:
            raise ConfigurationError(
                f"end_at {format_instant_ms(self._end)} is before start_at "
                f"{format_instant_ms(self._start)}: give an end at or after the start"
            )

    @property
    def inner(self) -> Schedule:
        return self._inner

    @property
    def start_ms(self) -> int | None:
        return self._start

    @property
    def end_ms(self) -> int | None:
        return self._end

    @property
    def tz(self) -> str:
        return self._inner.tz

    def next_slot(self, after_ms: int) -> int:
        after = operator.index(after_ms)
        if self._start is not None:
            after = max(after, self._start - 1)
        if self._end is not None and after >= self._end:
            return NO_SLOT
        try:
            slot = self._inner.next_slot(after)
        except ConfigurationError:  # no slot before the end of the calendar
            return NO_SLOT
        return slot if self._end is None or slot <= self._end else NO_SLOT

    def slots_between(self, start_ms: int, end_ms: int, *, limit: int | None = None) -> list[int]:
        lo = operator.index(start_ms) if self._start is None else max(start_ms, self._start - 1)
        hi = operator.index(end_ms) if self._end is None else min(end_ms, self._end)
        if hi <= lo:
            return []
        return self._inner.slots_between(lo, hi, limit=limit)

    def describe(self) -> str:
        text = self._inner.describe()
        if self._start is not None:
            text += f" from {format_instant_ms(self._start)}"
        if self._end is not None:
            text += f" until {format_instant_ms(self._end)}"
        return text

    def canonical(self) -> str:
        start = "-" if self._start is None else self._start
        end = "-" if self._end is None else self._end
        return f"{self._inner.canonical()} window start_ms={start} end_ms={end}"

    def __repr__(self) -> str:
        return f"Window({self._inner!r}, start_at={self._start!r}, end_at={self._end!r})"


@dataclass(frozen=True, slots=True)
class ZonedSlot:
    """A slot with its wall time in the schedule's zone, as the surfaces show next slots."""

    slot: int
    local: dt.datetime
    dst: bool
    """Whether the slot falls in the zone's daylight-saving time: its UTC offset is the
    higher of the year's two (not ``dst()``, which tzdata makes negative in winter for
    Europe/Dublin)."""
    offset_changed: bool
    """Whether the zone's UTC offset differs from the previous slot's (a DST change lies
    between them: a cron slot may then move, be skipped or repeat; docs/schedules.md)."""


def zoned_slots(schedule: Schedule, after_ms: int, count: int) -> list[ZonedSlot]:
    """The next ``count`` slots of ``schedule`` after ``after_ms``, in its zone."""
    zone = zoneinfo.ZoneInfo(schedule.tz)
    out: list[ZonedSlot] = []
    previous: dt.timedelta | None = None
    for slot in schedule.next_slots(after_ms, count):
        local = (_EPOCH + slot * _ONE_MS).astimezone(zone)
        offset = local.utcoffset()
        changed = previous is not None and offset != previous
        out.append(ZonedSlot(slot, local, _in_summer_time(local, zone), changed))
        previous = offset
    return out


def _in_summer_time(local: dt.datetime, zone: zoneinfo.ZoneInfo) -> bool:
    """Whether ``local``'s offset is the higher of its year's January and July offsets
    (both hemispheres; a zone without DST has the two equal)."""
    january = dt.datetime(local.year, 1, 1, tzinfo=zone).utcoffset()
    july = dt.datetime(local.year, 7, 1, tzinfo=zone).utcoffset()
    offset = local.utcoffset()
    if january is None or july is None or offset is None or january == july:
        return False
    return offset > min(january, july)
