"""Prometheus counters of real processes add up to the history they wrote.

Three workers share one SQLite store and run a 1 s job (``tick``) and a 3 s job
(``long``, 1.5 s per run). The runner of the first ``long`` run is SIGKILLed, so a
backup takes the run over as attempt 2. The survivors stop gracefully and dump their
``anarchon_*`` samples and ``Scheduler.stats``; the killed worker dumps nothing, so
every comparison is between the survivors' summed counters and the history records
that name a survivor as their instance (all attempt-2 records do).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from anarchon_core import Origin, Status

from .cluster import cluster, starts

pytestmark = pytest.mark.slow

HB, LEASE = 100, 300
LABELS = {"job_name", "outcome", "status", "kind", "operation", "le"}


def total(dumps: list[dict[str, Any]], name: str, **labels: str) -> float:
    """The sum over the dumps of the samples ``name`` whose labels include ``labels``."""
    return sum(
        s["value"]
        for d in dumps
        for s in d["samples"]
        if s["name"] == name and labels.items() <= s["labels"].items()
    )


def test_survivors_counters_match_their_history(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    jobs = [
        {"name": "tick", "every": "1s", "sleep_s": 0.05},
        {"name": "long", "every": "3s", "sleep_s": 1.5},
    ]
    with cluster(
        url, tmp_path, jobs=jobs, dump_metrics=True, heartbeat_ms=HB, lease_ms=LEASE, jitter_ms=50
    ) as c:
        c.start_all(3)
        first = c.wait_for(lambda ev: starts(ev, "long"), 8, "the first long run")[0]
        victim = c.instance_of(first["pid"])
        c.signal(victim, signal.SIGKILL)
        c.procs[victim].wait(5)
        c.wait_for(
            lambda ev: [
                e
                for e in ev
                if e["e"] == "end" and e["slot"] == first["slot"] and e["attempt"] == 2
            ],
            6,
            "the takeover to end",
        )
        ticks = len([e for e in c.events() if e["e"] == "end" and e["job"] == "tick"])
        c.wait_for(
            lambda ev: len([e for e in ev if e["e"] == "end" and e["job"] == "tick"]) >= ticks + 2,
            5,
            "two more ticks",
        )
        # Stop between slots (tick at :00.000–:00.050 + jitter), so that no claim is
        # cut off between the store's answer and its count.
        time.sleep((1.3 - time.time() % 1) % 1)
        c.stop_all()
        survivors = [name for name in c.procs if name != victim]
        dumps = {name: c.metrics(name) for name in c.procs}
        history = c.history()
        logs = c.logs()
    assert dumps[victim] is None
    survived = [d for name, d in dumps.items() if name != victim and d is not None]
    assert len(survived) == 2, logs
    assert "Traceback" not in logs

    ours = [r for r in history if r.instance_id in survivors]
    # The killed runner's attempt is interrupted; its backup, a survivor, succeeded.
    attempts = {r.attempt: r for r in history if r.job == "long" and r.slot == first["slot"]}
    assert attempts[1].instance_id == victim and attempts[1].status == Status.INTERRUPTED
    assert attempts[2].instance_id in survivors and attempts[2].status == Status.SUCCESS
    assert all(r.instance_id in survivors for r in history if r.attempt >= 2)

    for job in ("tick", "long"):
        mine = [r for r in ours if r.job == job]
        statuses = Counter(r.status for r in mine)
        won = sum(r.attempt == 1 and r.origin == Origin.SCHEDULE for r in mine)
        taken_over = sum(r.attempt >= 2 for r in mine)
        for status in (Status.SUCCESS, Status.FAILED):
            assert (
                total(survived, "anarchon_runs_total", job_name=job, status=status)
                == (statuses[status])
            ), (job, status)
        assert total(survived, "anarchon_claims_total", job_name=job, outcome="won") == won, job
        assert (
            total(survived, "anarchon_claims_total", job_name=job, outcome="skipped")
            == (statuses[Status.SKIPPED])
        )
        assert total(survived, "anarchon_takeovers_total", job_name=job, outcome="won") == (
            taken_over
        )
        assert total(survived, "anarchon_lateness_seconds_count", job_name=job) == won + taken_over
        assert total(survived, "anarchon_run_duration_seconds_count", job_name=job) == (
            statuses[Status.SUCCESS] + statuses[Status.FAILED]
        )
    assert total(survived, "anarchon_takeovers_total", job_name="long", outcome="won") == 1
    assert total(survived, "anarchon_runs_total", job_name="tick", status="success") >= 3
    assert not total(survived, "anarchon_fenced_total")
    assert not total(survived, "anarchon_lost_leases_total")

    # Each survivor's stats count the same events as its metrics.
    for dump in survived:
        stats = Counter(dump["stats"])
        for outcome in ("won", "taken", "skipped"):
            assert stats[f"claim_{outcome}"] == total(
                [dump], "anarchon_claims_total", outcome=outcome
            )
        assert stats["takeover_won"] == total([dump], "anarchon_takeovers_total", outcome="won")
        assert stats["run_success"] == total([dump], "anarchon_runs_total", status="success")
        # Bounded cardinality: only the documented labels, never a slot or an instance.
        for sample in dump["samples"]:
            assert set(sample["labels"]) <= LABELS, sample
            assert not set(c.procs) & set(sample["labels"].values()), sample
