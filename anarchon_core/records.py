"""The words of the run lifecycle and the records a store keeps of it.

These types cross the backend boundary, so they are plain frozen dataclasses of
ints and strings: every backend can build them from its rows, keys or messages.
All timestamps are integer milliseconds since the Unix epoch, read from the
store's clock wherever the store has one.
"""

from __future__ import annotations

import datetime as dt
import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .errors import ConfigurationError

__all__ = [
    "TERMINAL_STATUSES",
    "HistoryKey",
    "HistoryQuery",
    "Origin",
    "Outcome",
    "RunRecord",
    "Status",
    "error_summary",
    "history_key",
    "iso_utc",
    "ms_to_datetime",
    "select_records",
]

#: A record's place in history, ``(slot, job, attempt)``: history is newest first, in
#: descending order of this key.
HistoryKey = tuple[int, str, int]


class Status(StrEnum):
    """The status of one history record (one attempt, or a slot that ran nothing).

    This is the whole set; the CLI, the JSON API and the dashboard use exactly these words.
    """

    CLAIMED = "claimed"  # claim-only stores: won, and the store cannot record more
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"  # the handler raised or timed out; the error says which
    INTERRUPTED = "interrupted"  # the runner died, froze or handed over
    SKIPPED = "skipped"  # a previous run of the job was still live (overlap="skip")
    PAUSED = "paused"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset(
    {
        Status.SUCCESS,
        Status.FAILED,
        Status.INTERRUPTED,
        Status.SKIPPED,
        Status.PAUSED,
        Status.CANCELLED,
        Status.CLAIMED,
    }
)


class Origin(StrEnum):
    """Why a run exists."""

    SCHEDULE = "schedule"
    CATCH_UP = "catch_up"
    MANUAL = "manual"


class Outcome(StrEnum):
    """The store's answer to a claim or a takeover."""

    WON = "won"  # this instance runs the attempt
    TAKEN = "taken"  # another instance holds (or held) it; nothing was written
    SKIPPED = "skipped"  # overlap: recorded once as skipped, nobody runs it
    PAUSED = "paused"  # the job is paused in the store: recorded once as paused
    EXPIRED = "expired"  # past the claim horizon: never run late
    EARLY = "early"  # the store's clock says the slot is not due yet: retry later
    EXHAUSTED = "exhausted"  # takeover refused: max_attempts reached, run ends interrupted
    BLOCKED = "blocked"  # takeover/retry must wait: another run of the job is live
    LAPSED = "lapsed"  # a repeat by the token that won, whose lease has since expired:
    # it runs nothing (a backup takes the run over), and nothing was written
    STALE = "stale"  # the claim named a definition version the store no longer holds (the
    # job was changed, disabled or removed since the replica planned it): nothing written


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One history record, keyed ``(job, slot, attempt)``; attempt 0 ran nothing."""

    job: str
    slot: int
    attempt: int
    origin: Origin
    status: Status
    instance_id: str | None
    claimed_at: int | None
    started_at: int | None
    finished_at: int | None
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_ms(self) -> int | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at

    @property
    def lateness_ms(self) -> int | None:
        """How long after its slot the attempt started (``None`` if it did not)."""
        return None if self.started_at is None else self.started_at - self.slot

    def to_json(self) -> dict[str, Any]:
        """The one JSON shape of a record (CLI ``--json``, API, dashboard)."""
        return {
            "job": self.job,
            "slot": self.slot,
            "scheduled_at": _iso(self.slot),
            "attempt": self.attempt,
            "origin": str(self.origin),
            "status": str(self.status),
            "instance_id": self.instance_id,
            "claimed_at": _iso(self.claimed_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "duration_ms": self.duration_ms,
            "lateness_ms": self.lateness_ms,
            "error": self.error,
            "error_summary": error_summary(self.error) or None,
            "meta": self.meta,
        }


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """A filter over history, newest first: ``(slot, job, attempt)`` descending.

    One direction for all three keys lets a single row comparison page it: ``before``
    is the key of the last record of the previous page, and the next page holds only
    records whose key is strictly less (they follow it in the order). Records added
    meanwhile sort before the cursor (newer slots), so paging never repeats or skips.
    """

    job: str | None = None
    status: Status | None = None
    since: int | None = None  # slot >= since
    until: int | None = None  # slot < until
    limit: int = 100
    before: HistoryKey | None = None  # (slot, job, attempt) < before

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0:
            raise ConfigurationError(
                f"history limit {self.limit!r} is not valid: give an integer >= 0"
            )
        if self.before is not None and not _is_key(self.before):
            raise ConfigurationError(
                f"history cursor before={self.before!r} is not valid: give a tuple "
                f"(slot: int, job: str, attempt: int), the key of the previous page's last record"
            )

    def matches(self, record: RunRecord) -> bool:
        """Whether ``record`` passes every filter (the limit aside)."""
        return (
            (self.job is None or record.job == self.job)
            and (self.status is None or record.status == self.status)
            and (self.since is None or record.slot >= self.since)
            and (self.until is None or record.slot < self.until)
            and (self.before is None or history_key(record) < self.before)
        )


def history_key(record: RunRecord) -> HistoryKey:
    """``(slot, job, attempt)``: the key history is ordered (descending) and paged by."""
    return record.slot, record.job, record.attempt


def select_records(records: Iterable[RunRecord], query: HistoryQuery) -> list[RunRecord]:
    """The page ``query`` asks for out of ``records``: filtered, newest first, limited.

    The one implementation for the backends that cannot filter or order in the store,
    so that they all answer exactly like the SQL ones.
    """
    if query.limit <= 0:
        return []
    matching = (record for record in records if query.matches(record))
    return heapq.nlargest(query.limit, matching, key=history_key)


def _is_key(value: object) -> bool:
    if not isinstance(value, tuple) or len(value) != 3:
        return False
    slot, job, attempt = value
    return _is_int(slot) and isinstance(job, str) and _is_int(attempt)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def ms_to_datetime(ms: int) -> dt.datetime:
    """An aware UTC datetime for an epoch-millisecond integer."""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def iso_utc(ms: int) -> str:
    """``2026-12-03T08:00:00.000Z``: the one way slots and times are printed."""
    return ms_to_datetime(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _iso(ms: int | None) -> str | None:
    return None if ms is None else iso_utc(ms)


def error_summary(error: str | None) -> str:
    """What a failed run's error says in one line: the exception's last line
    (``ValueError: boom`` of a traceback), or the whole of a one-line error ("timed out
    after 500 ms"); empty for none. The dashboard, the admin, the CLI and the API's
    ``error_summary`` all show this; ``error`` keeps the whole (bounded) traceback."""
    lines = [line.strip() for line in (error or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
