"""The chaos benchmark, short: under faults no run starts twice at once, none starts late.

Runs ``python -m benchmarks.chaos`` for 30 s per store on SQLite and PostgreSQL (four
worker processes each, SIGSTOP/SIGKILL, clock offsets and, on PostgreSQL, a fault proxy
per worker) and reads its summary table.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from services import POSTGRES_URL, service_unreachable

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
COMMAND = ["-m", "benchmarks.chaos", "--stores", "sqlite,postgres", "--seconds", "30"]


def require_postgres() -> None:
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3):
            pass
    except psycopg.Error as exc:
        service_unreachable("PostgreSQL", f"{POSTGRES_URL} does not answer: {exc}")


def outcome_rows(output: str) -> dict[str, dict[str, str]]:
    """The rows of the printed ``chaos outcomes`` table, by store, by column header."""
    lines = output.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("chaos outcomes"))
    headers = re.split(r"\s{2,}", lines[title + 1].strip())
    rows: dict[str, dict[str, str]] = {}
    for line in lines[title + 3 :]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = dict(zip(headers, cells, strict=True))
    return rows


@pytest.mark.timeout(900)
def test_chaos_benchmark_finds_no_duplicate_and_no_late_start() -> None:
    require_postgres()
    proc = subprocess.run(
        [sys.executable, *COMMAND, "--seed", "1"],
        cwd=ROOT,
        env={**os.environ, "ANARCHON_BENCH_POSTGRES": POSTGRES_URL},
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-8000:]
    rows = outcome_rows(proc.stdout)
    assert set(rows) == {"sqlite", "postgres"}, output[-8000:]
    for store, row in rows.items():
        assert row["concurrent dups"] == "0", f"{store}: {row}\n{output[-8000:]}"
        assert row["late starts"] == "0", f"{store}: {row}\n{output[-8000:]}"
        assert int(row["ran"].replace(",", "")) > 0, f"{store} ran nothing: {row}"
