"""What the SQL backends (SQLite, PostgreSQL) share beyond their dialects."""

from __future__ import annotations

import json
from typing import Any

from ..records import HistoryQuery, Origin, RunRecord, Status

__all__ = ["history_filter", "record_from_row"]


def history_filter(query: HistoryQuery, placeholder: str) -> tuple[str, list[object]]:
    """The ``WHERE`` text (or ``""``) and parameters of a history query.

    ``placeholder`` is the driver's parameter marker (``?`` or ``%s``); every value is a
    parameter, never spliced into the text. The cursor is one row-value comparison
    (SQLite >= 3.15, PostgreSQL): the order is ``(slot, job, attempt)`` descending, so
    "after the cursor" is "less than its key", where a scan of the history index (which
    is in that order) starts.
    """
    until, before = query.until, query.before
    if until is not None and before is not None:
        # The tighter implies the other. Given both, PostgreSQL may start its index scan
        # at the looser (it cannot compare a row with a column bound) and skip the gap.
        until, before = (None, before) if before[0] < until else (until, None)
    where: list[str] = []
    params: list[object] = []
    for column, value in (
        ("job =", query.job),
        ("status =", None if query.status is None else str(query.status)),
        ("slot >=", query.since),
        ("slot <", until),
    ):
        if value is not None:
            where.append(f"{column} {placeholder}")
            params.append(value)
    if before is not None:
        where.append(f"(slot, job, attempt) < ({placeholder}, {placeholder}, {placeholder})")
        params.extend(before)
    return (" WHERE " + " AND ".join(where) if where else ""), params


def record_from_row(row: tuple[Any, ...]) -> RunRecord:
    """A history row (the attempts table's columns in :class:`RunRecord`'s order).

    ``meta`` is JSON text on SQLite and through Django's cursor; psycopg loads ``jsonb``
    as Python values.
    """
    job, slot, attempt, origin, status, instance_id, claimed, started, finished, error, meta = row
    return RunRecord(
        job,
        slot,
        attempt,
        Origin(origin),
        Status(status),
        instance_id,
        claimed,
        started,
        finished,
        error,
        json.loads(meta) if isinstance(meta, str) else meta,
    )
