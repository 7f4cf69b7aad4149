"""Plain-text tables and durations for the command line and the demo."""

from __future__ import annotations

import argparse
import datetime as dt
import re
from collections.abc import Sequence

from ..durations import format_duration_ms
from ..records import RunRecord, error_summary, iso_utc

__all__ = ["excerpt", "format_ms", "format_table", "history_table", "parse_instant_ms"]

#: Epoch-millisecond integers below this (1973) are almost surely seconds given by mistake.
MIN_EPOCH_MS = 10**11
#: No slot lies past the year 9899 (see :mod:`anarchon_core.schedules`).
MAX_EPOCH_MS = 250_246_627_200_000

#: Tables aim to fit this many columns.
TABLE_WIDTH = 120


def format_ms(ms: int | None) -> str:
    """A short human duration: ``85ms``, ``3.02s``, ``2m05s``."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f}s"
    return format_duration_ms(ms - ms % 1000)


def excerpt(error: str | None, width: int = 60) -> str:
    """An error's summary (``ValueError: boom`` of a traceback), shortened."""
    return _fit(error_summary(error), width)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def format_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    max_widths: Sequence[int | None] | None = None,
) -> list[str]:
    """Left-aligned columns two spaces apart; cells beyond ``max_widths`` are shortened."""
    limits = list(max_widths or [None] * len(headers))
    cells = [[_fit(c, lim) if lim else c for c, lim in zip(r, limits, strict=True)] for r in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = []
    for row in [list(headers), ["-" * w for w in widths], *cells]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return lines


def history_table(records: Sequence[RunRecord], width: int = TABLE_WIDTH) -> list[str]:
    """The readable history: one line per record, the error's last line last."""
    headers = ["JOB", "SCHEDULED (UTC)", "ATT", "STATUS", "INSTANCE", "DURATION", "ORIGIN"]
    rows = [
        [
            r.job,
            iso_utc(r.slot).replace("T", " ").rstrip("Z"),
            str(r.attempt),
            str(r.status),
            r.instance_id or "-",
            format_ms(r.duration_ms),
            str(r.origin),
        ]
        for r in records
    ]
    limits: list[int | None] = [40, None, None, None, 32, None, None]
    lines = format_table(headers, rows, max_widths=limits)
    used = max(len(line) for line in lines)
    room = max(width - used - 2, 20)
    if not any(r.error for r in records):
        return lines
    out = []
    for i, line in enumerate(lines):
        pad = line.ljust(used)
        if i == 0:
            out.append(f"{pad}  ERROR")
        elif i == 1:
            out.append(f"{pad}  {'-' * 5}")
        else:
            out.append(f"{pad}  {excerpt(records[i - 2].error, room)}".rstrip())
    return out


def parse_instant_ms(text: str, *, other_forms: str = "") -> int:
    """An ISO-8601 time (UTC if it has no offset) or epoch ms, as epoch ms: the two forms
    the history shows a slot in, accepted wherever a time or a slot is given.
    ``other_forms`` (", or …") names what else the caller accepts, for the refusal.

    :raises argparse.ArgumentTypeError: naming the value and the accepted forms.
    """
    text = text.strip()
    if re.fullmatch(r"[0-9]+", text):
        value = int(text)
        if 0 < value < MIN_EPOCH_MS:
            raise argparse.ArgumentTypeError(
                f"{text!r} looks like epoch seconds: give epoch milliseconds "
                f"({value * 1000}) or an ISO-8601 time"
            )
        if value >= MAX_EPOCH_MS:
            raise argparse.ArgumentTypeError(
                f"{text[:30]!r} is past the year 9899: give epoch milliseconds below "
                f"{MAX_EPOCH_MS} or an ISO-8601 time"
            )
        return value
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is not a time: give ISO-8601 (2026-12-03T08:00:00Z) or epoch "
            f"milliseconds{other_forms}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)
