"""Stored definitions on a running cluster of real processes, on every lease store.

Three workers register a target; the test adds, changes and removes definitions from
its own process (the API any operator tool uses) and reads what really ran from the
workers' events. The store refuses the claims of a superseded version, so even a
worker that never reads the change (``deaf``) runs no slot of the old schedule.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from anarchon_core import backend_from_url
from anarchon_core.backend import Backend
from anarchon_core.definitions import Definition
from anarchon_core.errors import ConflictError
from anarchon_core.schedules import At, Every
from anarchon_core.stored_jobs import add_definition, remove_definition, update_definition

from .cluster import cluster, starts

pytestmark = pytest.mark.slow

T = TypeVar("T")
HB = 200
#: A worker follows a change within one heartbeat plus a store read; this margin holds
#: on a loaded machine.
FOLLOW_S = 1.0
TARGETS = [{"name": "reports.send", "sleep_s": 0.05}]


def on_store(url: str, use: Callable[[Backend], Awaitable[T]]) -> T:
    async def go() -> T:
        backend = backend_from_url(url)
        await backend.open()
        try:
            return await use(backend)
        finally:
            await backend.close()

    return asyncio.run(go())


def slots_ms(events: list[dict[str, Any]], job: str) -> list[int]:
    return [e["slot"] for e in starts(events, job)]


def test_added_changed_and_removed_without_a_restart(lease_url: str, tmp_path: Path) -> None:
    with cluster(lease_url, tmp_path, jobs=[], targets=TARGETS, heartbeat_ms=HB) as c:
        c.start_all(2)
        report = Definition.create("report", Every("1s"), "reports.send", args=[7])
        added = on_store(lease_url, lambda b: add_definition(b, report, None))
        added_at = time.time()
        c.start("deaf", deaf=True)  # reads the definitions at start only: version 1
        c.wait_for(lambda ev: sum(e["e"] == "ready" for e in ev) >= 3, 20, "three workers")
        c.wait_for(lambda ev: len(starts(ev, "report")) >= 4, 10, "runs every second")
        every2 = Definition.create(
            "report", Every("2s", "500ms"), "reports.send", args=[8], version=added.version
        )
        changed = on_store(lease_url, lambda b: update_definition(b, every2, None))
        changed_at = time.time()
        c.wait_for(
            lambda ev: len([e for e in starts(ev, "report") if e["t"] > changed_at + 2]) >= 2,
            12,
            "runs every 2 s",
        )
        on_store(lease_url, lambda b: remove_definition(b, "report", changed.version, None))
        removed_at = time.time()
        time.sleep(2.5)
        events = c.events()
    runs = starts(events, "report")
    slots = [e["slot"] for e in runs]
    assert len(slots) == len(set(slots)), "a slot ran twice"
    first = min(e["t"] for e in runs)
    assert first - added_at < 1 + FOLLOW_S, "followed within the bound"
    after = [e for e in runs if e["t"] > changed_at]
    assert all(e["slot"] % 2000 == 500 and e["args"] == [8] for e in after), after
    deaf = [e for e in runs if e["instance"] == "deaf" and e["t"] > changed_at]
    assert deaf == [], "the deaf worker plans version 1 still: the store refuses its claims"
    assert "definition changed in the store" in c.log_path("deaf").read_text()
    assert not [e for e in runs if e["t"] > removed_at + 0.2], "ran after its removal"


def test_a_one_off_runs_once_though_its_runner_is_killed(lease_url: str, tmp_path: Path) -> None:
    targets = [{"name": "reports.send", "sleep_s": 2.0}]
    scheduler = {"heartbeat_ms": HB, "lease_ms": 3 * HB}
    with cluster(lease_url, tmp_path, jobs=[], targets=targets, **scheduler) as c:
        c.start_all(3)
        at = (int(time.time() * 1000) // 1000 + 3) * 1000
        once = Definition.create("once", At(at), "reports.send")
        on_store(lease_url, lambda b: add_definition(b, once, None))
        first = c.wait_for(lambda ev: starts(ev, "once"), 10, "the one-off starts")[0]
        c.procs[first["instance"]].send_signal(signal.SIGKILL)  # its runner dies at T
        c.wait_for(
            lambda ev: [e for e in ev if e["e"] == "end" and e["job"] == "once"], 10, "it ends"
        )
        time.sleep(1.5)
        events = c.events()
    runs = starts(events, "once")
    assert [(e["slot"], e["attempt"]) for e in runs] == [(at, 1), (at, 2)]
    assert runs[1]["instance"] != first["instance"], "a backup took it over"
    ends = [e for e in events if e["e"] == "end" and e["job"] == "once"]
    assert len(ends) == 1


EDIT = textwrap.dedent(
    """
    import asyncio, sys, time
    from anarchon_core import backend_from_url
    from anarchon_core.definitions import Definition
    from anarchon_core.errors import ConflictError
    from anarchon_core.schedules import Every
    from anarchon_core.stored_jobs import update_definition

    url, version, every, at = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])

    async def main():
        backend = backend_from_url(url)
        await backend.open()
        try:
            definition = Definition.create("report", Every(every), "reports.send", version=version)
            time.sleep(max(0.0, at - time.time()))
            try:
                await update_definition(backend, definition, None)
                print("saved")
            except ConflictError as exc:
                print("refused", exc)
        finally:
            await backend.close()

    asyncio.run(main())
    """
)


def test_two_concurrent_edits_of_one_version_one_is_refused(lease_url: str) -> None:
    report = Definition.create("report", Every("1h"), "reports.send")
    added = on_store(lease_url, lambda b: add_definition(b, report, None))
    at = time.time() + 2.0  # both processes send their edit at this instant
    editors = [
        subprocess.Popen(
            [sys.executable, "-c", EDIT, lease_url, str(added.version), every, str(at)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for every in ("2h", "3h")
    ]
    outputs = [p.communicate(timeout=30) for p in editors]
    said = Counter(out.split()[0] if out else f"error: {err}" for out, err in outputs)
    assert said == Counter({"saved": 1, "refused": 1}), outputs
    stored = on_store(lease_url, lambda b: b.definitions_since(0))
    assert [d.version for d in stored if d.job == "report"] != [added.version]
    with pytest.raises(ConflictError):
        on_store(
            lease_url, lambda b: update_definition(b, report.with_version(added.version), None)
        )
