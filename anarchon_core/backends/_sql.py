"""What the SQL backends (SQLite, PostgreSQL) share beyond their dialects."""

from __future__ import annotations

from ..records import HistoryQuery

__all__ = ["history_filter"]


def history_filter(query: HistoryQuery, placeholder: str) -> tuple[str, list[object]]:
    """The ``WHERE`` text (or ``""``) and parameters of a history query.

    ``placeholder`` is the driver's parameter marker (``?`` or ``%s``); every value is a
    parameter, never spliced into the text.
    """
    where: list[str] = []
    params: list[object] = []
    for column, value in (
        ("job =", query.job),
        ("status =", None if query.status is None else str(query.status)),
        ("slot >=", query.since),
        ("slot <", query.until),
    ):
        if value is not None:
            where.append(f"{column} {placeholder}")
            params.append(value)
    return (" WHERE " + " AND ".join(where) if where else ""), params
