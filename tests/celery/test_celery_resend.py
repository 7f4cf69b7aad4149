"""A beat that dies between publishing a task and recording its run: the takeover re-sends.

The run's lease outlives the dead beat by at most ``lease_ms``; another beat then takes
the run over (attempt 2) within the entry's horizon (the gap to its next slot, 20 s
here) and publishes it again with the same deterministic task id, so a consumer that
deduplicates by task id sees one task. Celery itself does not deduplicate: the worker
executes both messages, which is why the guide asks for idempotent tasks.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
from celery_cluster import EVERY_TWENTY, celery_cluster, check_exactly_once, wait_until
from services import require_tcp

import anarchon_celery

pytestmark = pytest.mark.slow


def test_a_takeover_resends_with_the_same_task_id(tmp_path: Path) -> None:
    require_tcp("Redis", "127.0.0.1", 6379)
    with celery_cluster(tmp_path, twenty_seconds=True) as c:
        c.worker("worker", "-l", "warning")
        victim = c.beat("victim", env={"ANARCHON_TEST_STALL_AFTER_PUBLISH": EVERY_TWENTY})
        c.wait_started(["victim"])
        stalled = re.compile(r"published (\d+); stalling")
        wait_until(lambda: stalled.search(c.log("victim")) is not None, 30, "the victim's send")
        match = stalled.search(c.log("victim"))
        assert match is not None
        slot = int(match.group(1))
        victim.send_signal(signal.SIGKILL)  # published, never recorded
        c.beat("backup")
        run = (EVERY_TWENTY, slot)
        wait_until(lambda: len([r for r in c.rows() if (r["job"], r["slot"]) == run]) >= 2, 25,
                 "the takeover's re-send")  # fmt: skip
        verdict = check_exactly_once(c.wait_executed({run}), {run})
        backup_sends = c.sends("backup")
    assert verdict.executions == 2 and len(verdict.takeovers) == 1, verdict.summary()
    resent = verdict.takeovers[0]
    assert int(resent["attempt"]) == 2
    assert resent["task_id"] == anarchon_celery.task_id_for(EVERY_TWENTY, slot)
    assert backup_sends[resent["task_id"]] == 1
