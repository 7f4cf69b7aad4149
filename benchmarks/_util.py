"""Shared helpers: machine description, percentiles, ratios and compact tables."""

from __future__ import annotations

import math
import os
import platform
import sqlite3
import statistics
import sys
from collections.abc import Sequence

__all__ = [
    "filesystem",
    "machine",
    "percentile",
    "print_table",
    "ratio_summary",
    "rss_kib",
    "summary_ns",
]


def machine() -> str:
    """One line naming the machine a figure was measured on."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 0
    try:
        load = "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "load n/a"
    return (
        f"machine: {usable} usable cores (nproc), {platform.machine()} {platform.system()}, "
        f"Python {platform.python_version()} ({sys.implementation.name}), "
        f"SQLite {sqlite3.sqlite_version}, {load}"
    )


def filesystem(path: str) -> str:
    """The file system type holding ``path`` (from ``/proc/mounts``), e.g. ``ext4``."""
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if (
                    len(fields) >= 3
                    and os.path.realpath(path).startswith(fields[1])
                    and len(fields[1]) > len(best)
                ):
                    best, kind = fields[1], fields[2]
    except OSError:
        pass
    return f"{kind} ({path})"


def percentile(sorted_samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted samples (``pct`` in 0..100)."""
    if not sorted_samples:
        return math.nan
    rank = max(math.ceil(pct / 100 * len(sorted_samples)), 1)
    return sorted_samples[min(rank, len(sorted_samples)) - 1]


def summary_ns(samples_ns: Sequence[int], unit_ns: float) -> tuple[float, float, float]:
    """p50, p99 and max of nanosecond samples, converted to ``unit_ns`` units."""
    ordered = sorted(samples_ns)
    return (
        percentile(ordered, 50) / unit_ns,
        percentile(ordered, 99) / unit_ns,
        (ordered[-1] if ordered else math.nan) / unit_ns,
    )


def ratio_summary(ratios: Sequence[float]) -> str:
    """``median (min–max, n=N)`` of per-repeat ratios: the spread shows the noise."""
    if not ratios:
        return "n/a"
    med = statistics.median(ratios)
    return f"{med:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}, n={len(ratios)})"


def rss_kib() -> int:
    """The current resident set size of this process in KiB (Linux ``/proc``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a compact aligned table: first column left, the others right."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [
        max(len(headers[i]), *(len(row[i]) for row in cells)) if cells else len(headers[i])
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            values[i].ljust(widths[i]) if i == 0 else values[i].rjust(widths[i])
            for i in range(len(values))
        ]
        return "  ".join(parts).rstrip()

    print(f"\n{title}")
    print(line(headers))
    print(line(["-" * w for w in widths]))
    for row in cells:
        print(line(row))
    sys.stdout.flush()


def _cell(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
