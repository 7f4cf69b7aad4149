"""Operator actions against a running cluster, taken from another process (the CLI).

Every action is a store decision, so it is shown the way an operator would take it:
``anarchon pause|trigger|cancel|instances`` in its own process while the workers run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anarchon_core import Status

from .cluster import cluster, starts

pytestmark = pytest.mark.slow

HB, LEASE = 100, 300


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "anarchon_core", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"anarchon {args} exited {result.returncode}: {result.stderr}")
    return result


def test_pause_from_another_process_stops_every_instance(lease_url: str, tmp_path: Path) -> None:
    jobs = [{"name": "tick", "every": "200ms", "kind": "async"}]
    with cluster(lease_url, tmp_path, jobs=jobs, heartbeat_ms=HB, jitter_ms=30) as c:
        c.start_all(3)
        c.wait_for(lambda ev: len(starts(ev)) >= 3, 5, "a few runs")
        cli("pause", "tick", "--backend", lease_url)
        paused_at = time.time()
        time.sleep(1.5)
        resumed_at = time.time()  # before the command: it may take effect before it returns
        cli("resume", "tick", "--backend", lease_url)
        c.wait_for(lambda ev: [e for e in starts(ev) if e["t"] > resumed_at], 5, "runs again")
        c.stop_all()
        events = c.events()
        history = c.history("tick")
    during = [e for e in starts(events) if paused_at + 0.25 < e["t"] < resumed_at]
    assert during == [], "a paused job ran"
    paused = [r for r in history if r.status == Status.PAUSED]
    assert len(paused) >= 5
    assert all(r.attempt == 0 for r in paused)
    assert len({r.slot for r in paused}) == len(paused), "a paused slot was recorded twice"


PRESS = """
import asyncio, sys, time
from anarchon_core import backend_from_url, operations

async def press(url: str, at: float) -> int:
    backend = backend_from_url(url)
    await backend.open()
    try:
        time.sleep(max(at - time.time(), 0))
        return await operations.trigger(backend, "report", requested_by="press")
    finally:
        await backend.close()

print(asyncio.run(press(sys.argv[1], float(sys.argv[2]))))
"""


def test_trigger_pressed_three_times_at_once_runs_once(lease_url: str, tmp_path: Path) -> None:
    """Three processes press "run now" at once: one request, run exactly once.

    A first manual run is kept running (until the test creates a file) while the three
    presses land, so the request they make cannot start (one live run per job) and every
    press must find the same pending request, whatever the timing of the sweeps.
    """
    gate = tmp_path / "release"
    jobs = [{"name": "report", "every": "1h", "sleep_s": 0.2, "wait_for_file": str(gate)}]
    with cluster(lease_url, tmp_path, jobs=jobs, heartbeat_ms=HB, jitter_ms=0) as c:
        c.start_all(3)
        time.sleep(2 * HB / 1000)  # every instance has registered
        first = int(
            cli("trigger", "report", "--backend", lease_url).stdout.split("slot ")[1].split()[0]
        )
        c.wait_for(lambda ev: starts(ev, "report"), 5, "the first manual run")
        at = time.time() + 0.8
        presses = [
            subprocess.Popen(
                [sys.executable, "-c", PRESS, lease_url, str(at)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        outputs = [p.communicate(timeout=30) for p in presses]
        assert all(p.returncode == 0 for p in presses), outputs
        requests = {int(out) for out, _ in outputs}
        gate.touch()
        c.wait_for(lambda ev: len([e for e in ev if e["e"] == "end"]) >= 2, 8, "both runs")
        time.sleep(3 * HB / 1000)
        c.stop_all()
        events = c.events()
        history = c.history("report")
    assert len(requests) == 1, f"three presses made {len(requests)} requests"
    (second,) = requests
    assert second != first
    manual = starts(events, "report")
    assert sorted(e["slot"] for e in manual) == sorted([first, second]), "each ran once"
    assert all(e["origin"] == "manual" and e["attempt"] == 1 for e in manual)
    assert sorted((r.slot, r.attempt, r.status) for r in history) == [
        (first, 1, Status.SUCCESS),
        (second, 1, Status.SUCCESS),
    ]


def test_trigger_of_a_job_nobody_has_is_an_error(lease_url: str, tmp_path: Path) -> None:
    jobs = [{"name": "report", "every": "1h"}]
    with cluster(lease_url, tmp_path, jobs=jobs, heartbeat_ms=HB, jitter_ms=0) as c:
        c.start_all(1)
        time.sleep(2 * HB / 1000)
        result = cli("trigger", "nobody.has.this", "--backend", lease_url, check=False)
    assert result.returncode == 1
    assert "no live instance has job 'nobody.has.this'" in result.stderr
    assert "report" in result.stderr


def test_cancel_stops_the_runner_and_nobody_takes_over(lease_url: str, tmp_path: Path) -> None:
    jobs = [{"name": "long", "every": "3s", "sleep_s": 5}]
    with cluster(lease_url, tmp_path, jobs=jobs, heartbeat_ms=HB, lease_ms=LEASE, jitter_ms=0) as c:
        c.start_all(2)
        first = c.wait_for(lambda ev: starts(ev, "long"), 6, "a run")[0]
        cli("cancel", "long", str(first["slot"]), "--backend", lease_url)
        end = c.wait_for(
            lambda ev: [e for e in ev if e["e"] == "end" and e["slot"] == first["slot"]],
            3,
            "the runner to notice",
        )[0]
        time.sleep((LEASE + 3 * HB) / 1000)  # a takeover would have happened by now
        again = cli("cancel", "long", str(first["slot"]), "--backend", lease_url, check=False)
        c.stop_all()
        events = c.events()
        history = [r for r in c.history("long") if r.slot == first["slot"]]
    assert end["cancelled"] and "lease lost" in end["cancelled"]
    assert [(r.attempt, r.status) for r in history] == [(1, Status.CANCELLED)]
    assert [e for e in starts(events) if e["slot"] == first["slot"] and e["attempt"] > 1] == []
    assert again.returncode == 1


def test_instances_lists_live_ones_and_flags_a_different_schedule(
    lease_url: str, tmp_path: Path
) -> None:
    jobs = [{"name": "tick", "every": "1h"}]
    with cluster(lease_url, tmp_path, jobs=jobs, heartbeat_ms=HB, lease_ms=LEASE, jitter_ms=0) as c:
        c.start_all(2)
        c.start("odd", jitter_ms=7)  # one replica with other options: a rolling deploy
        c.wait_for(lambda ev: sum(e["e"] == "ready" for e in ev) >= 3, 10, "odd ready")
        time.sleep(2 * HB / 1000)

        def listed() -> list[dict[str, object]]:
            out = cli("instances", "--json", "--backend", lease_url).stdout
            return [json.loads(line) for line in out.splitlines()]

        assert sorted(str(i["instance_id"]) for i in listed()) == ["odd", "w0", "w1"]
        table = cli("instances", "--backend", lease_url).stdout
        assert "WARNING: instances disagree about tick" in table
        c.signal("w0", signal.SIGKILL)
        time.sleep((LEASE + 2 * HB) / 1000)
        assert sorted(str(i["instance_id"]) for i in listed()) == ["odd", "w1"]
        c.signal("w1", signal.SIGTERM)
        c.procs["w1"].wait(10)
        assert sorted(str(i["instance_id"]) for i in listed()) == ["odd"]
        c.stop_all()
        logs = c.logs()
    assert "live instances disagree about the schedule or options of: tick" in logs
