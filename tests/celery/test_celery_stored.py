"""Real processes: four ``celery beat -S anarchon`` follow a definition kept in the store.

A definition added through the store API (``stored_jobs.add_definition``) names the
``record`` task as its target, with ``target_options`` {queue, headers, priority}: every
slot is executed once, from the definition's queue, with its header and priority and
the deterministic task id; one beat SIGKILLed in the middle loses nothing. An update
(every 1 s -> every 2 s, new kwargs) changes what the beats send without a restart. The
``beat_schedule`` entries, synced into the store as code-owned definitions at start,
are still sent once per slot (by the entry, never by their stored copy).
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery_cluster import (
    EVERY_SECOND,
    NAMESPACE,
    celery_cluster,
    check_exactly_once,
    grid,
    in_window,
    next_second,
    now_ms,
    sleep_until,
    task_ids,
)
from registry import LEASE_URLS, load_store_modules
from services import require_tcp

from anarchon_core import stored_jobs
from anarchon_core.backends import backend_from_url
from anarchon_core.definitions import Definition

load_store_modules()

pytestmark = pytest.mark.slow

NAME = "stored-record"
STORED = f"{NAMESPACE}:{NAME}"
TASK = "celery_beat_app.record"


@pytest.fixture(params=["redis", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    require_tcp("Redis", "127.0.0.1", 6379)  # the broker and the records
    with LEASE_URLS[request.param](tmp_path) as url:
        yield url


def definition(every: str, version: int, queue: str, run: int) -> Definition:
    return Definition.create(
        NAME,
        {"every": every},
        TASK,
        kwargs={"run": run},
        target_options={"queue": queue, "headers": {"tenant": "t1"}, "priority": 5},
        version=version,
    )


def write(store: str, new: Definition) -> Definition:
    """Add ``new`` (version 0) or update the stored one to it, through the store API."""

    async def call() -> Definition:
        backend = backend_from_url(store)
        await backend.open()
        try:
            if new.version == 0:
                return await stored_jobs.add_definition(backend, new, NAMESPACE)
            return await stored_jobs.update_definition(backend, new, NAMESPACE)
        finally:
            await backend.close()

    return asyncio.run(call())


def test_four_beats_send_a_stored_definition_and_follow_its_update(
    tmp_path: Path, store: str
) -> None:
    with celery_cluster(tmp_path, store=store) as c:
        queue = f"{c.queue}-stored"
        c.worker("worker", "-l", "warning", queues=(queue,))
        names = [f"beat{i}" for i in range(4)]
        beats = [c.beat(name) for name in names]
        c.wait_started(names)
        added = write(store, definition("1s", 0, queue, run=1))
        # Every beat follows within milliseconds (a notification) or a heartbeat (2 s).
        start = next_second(lead_ms=3000)
        end = start + 6000
        sleep_until(start + 3600)  # mid-second: between sends, never during one
        beats[0].send_signal(signal.SIGKILL)
        sleep_until(end + 300)
        current = write(store, definition("2s", added.version, queue, run=2))
        updated_at = now_ms()
        start2 = next_second(lead_ms=3000)
        start2 += start2 % 2000  # an even second: a slot of the 2-s grid
        end2 = start2 + 6000
        sleep_until(end2 + 1500)
        first = grid(STORED, start, end, 1000)
        second = grid(STORED, start2, end2, 2000)
        entries = grid(EVERY_SECOND, start, end2, 1000)
        wanted = first | second | entries
        rows = c.wait_executed(wanted, timeout=20)
        verdict = check_exactly_once(rows, wanted)
        sent = in_window(c.sends(), wanted)
        killed = beats[0].wait(5)
        logs = "".join(c.log(name) for name in names[1:])
    assert killed == -signal.SIGKILL
    assert "Traceback" not in logs
    assert current.version > added.version
    # Every slot sent once: 1-s slots are past their horizon (1 s) before a dead beat's
    # lease (6 s) expires, so no run is taken over and re-sent.
    assert not verdict.takeovers and verdict.once == verdict.runs == verdict.executions
    assert sent == Counter(dict.fromkeys(task_ids(wanted), 1)), sent
    stored_rows = [row for row in rows if row["job"] == STORED]
    for row in stored_rows:  # the send options of target_options, and the version's kwargs
        assert (row["routing_key"], row["priority"], row["tenant"]) == (queue, 5, "t1"), row
        assert row["args"] == [] and row["kwargs"] in ({"run": 1}, {"run": 2}), row
    by_slot = {int(row["slot"]): row["kwargs"]["run"] for row in stored_rows}
    assert all(by_slot[slot] == 1 for _, slot in first)
    assert all(by_slot[slot] == 2 for _, slot in second)
    # After the update committed, no slot of the old schedule was sent: odd seconds.
    late_odd = sorted(s for s in by_slot if s > updated_at + 1000 and s % 2000)
    assert not late_odd, f"1-s slots sent after the update: {late_odd}"
    per_beat = [sum(in_window(c.sends(name), first | second).values()) for name in names]
    print(
        f"four beats, a stored definition ({store.split(':')[0]}): {verdict.summary()}; "
        f"stored slots sent per beat {per_beat}"
    )
