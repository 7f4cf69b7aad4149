"""``uvicorn --workers N`` and gunicorn with uvicorn workers, for real, on 127.0.0.1.

Every worker is one instance running ``apps/server_app.py``; each handler appends to one
events file, so the tests see what really executed, not only what the store recorded.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi_servers import Server, serve, slots_of

pytestmark = pytest.mark.slow

LONG = {"name": "long", "every": "3s", "sleep_s": 2.5}


def assert_exactly_once(events: list[dict[str, Any]], job: str) -> list[int]:
    """Every slot between the first and the last started exactly once, and ended."""
    starts = [e for e in events if e["e"] == "start" and e["job"] == job]
    counts = Counter(e["slot"] for e in starts)
    assert not [s for s, n in counts.items() if n > 1], f"slots run twice: {counts}"
    slots = sorted(counts)
    assert slots == list(range(slots[0], slots[-1] + 1000, 1000)), (
        f"a slot was lost: {slots}\n{timeline(events)}"
    )
    assert all(e["pool"] for e in starts), "a handler ran while the app's pool was closed"
    return slots


def timeline(events: list[dict[str, Any]]) -> str:
    """The events, one line each, for a failure message."""
    t0 = events[0]["t"] if events else 0
    lines = []
    for e in events:
        what = {k: v for k, v in e.items() if k not in ("t", "pid", "e")}
        lines.append(f"{e['t'] - t0:8.3f} {e['pid']} {e['e']} {what}")
    return "\n".join(lines[-150:])


def assert_clean_shutdown(server: Server, pids: set[int]) -> None:
    events = server.events()
    stopped = {e["pid"]: e for e in events if e["e"] == "stopped"}
    assert pids <= set(stopped), f"no lifespan shutdown in {pids - set(stopped)}"
    for e in stopped.values():
        assert e["running"] is False and e["state"] is False
    closes = [e for e in events if e["e"] == "pool-close"]
    assert closes and all(e["scheduler_running"] is False for e in closes)


#: (server, store) pairs: each server and each store, without the full cross product
#: (each case starts a real server for 7-12 s; the stores' own exactly-once is proven
#: by the multi-process suite).
EXACTLY_ONCE_CASES = [("uvicorn", "sqlite"), ("gunicorn", "postgres"), ("uvicorn", "redis")]


@pytest.mark.parametrize(("kind", "store_url"), EXACTLY_ONCE_CASES, indirect=["store_url"])
def test_each_slot_runs_exactly_once(kind: str, store_url: str, tmp_path: Path) -> None:
    with serve(kind, tmp_path, backend=store_url, jobs=[{"name": "tick", "every": "1s"}]) as srv:
        pids = srv.wait_ready(3)
        srv.wait_for(lambda ev: len(set(slots_of(ev, "tick", "end"))) >= 6, 15, "6 slots")
        assert srv.terminate() == 0
        slots = assert_exactly_once(srv.events(), "tick")
        assert len(slots) >= 6
        assert_clean_shutdown(srv, pids)
        runners = Counter(e["pid"] for e in srv.events() if e["e"] == "start")
        print(f"{kind} {store_url.split(':')[0]}: {len(slots)} slots, runs per worker {runners}")


def test_gunicorn_preload_gives_each_worker_its_own_instance(
    sqlite_url: str, tmp_path: Path
) -> None:
    """``--preload`` builds the scheduler before the fork; its start() renews the id."""
    jobs = [{"name": "tick", "every": "1s"}]
    with serve("gunicorn", tmp_path, backend=sqlite_url, jobs=jobs, extra=["--preload"]) as srv:
        pids = srv.wait_ready(3)
        srv.wait_for(lambda ev: len(set(slots_of(ev, "tick", "end"))) >= 3, 10, "3 slots")
        ids = {e["instance"] for e in srv.events() if e["e"] == "ready"}
        assert len(ids) == 3 and all(f":{pid}:" in " ".join(ids) for pid in pids)
        instances = srv.get("/anarchon/api/instances").json()["instances"]
        assert {i["instance_id"] for i in instances} == ids
        assert srv.terminate() == 0
        assert_exactly_once(srv.events(), "tick")


def test_sigkill_of_the_runner_hands_the_run_to_another_worker(
    store_url: str, tmp_path: Path
) -> None:
    with serve("uvicorn", tmp_path, backend=store_url, jobs=[LONG]) as srv:
        srv.wait_ready(3)
        first = srv.wait_for(
            lambda ev: [e for e in ev if e["e"] == "start" and e["job"] == "long"], 10, "a run"
        )[0]
        os.kill(first["pid"], signal.SIGKILL)  # the worker only; its master restarts it
        takeover = srv.wait_for(
            lambda ev: [
                e
                for e in ev
                if e["e"] == "end" and e["slot"] == first["slot"] and e["attempt"] == 2
            ],
            10,
            "the takeover",
        )[0]
        assert takeover["pid"] != first["pid"] and takeover["cancelled"] is None
        runs = [e for e in srv.events() if e["e"] == "start" and e["slot"] == first["slot"]]
        assert sorted(e["attempt"] for e in runs) == [1, 2]


#: (server, store) pairs: every store and both servers across the two tests below,
#: without the full cross product (each case starts a real server for 10-20 s).
SIGTERM_CASES = [("uvicorn", "sqlite"), ("uvicorn", "postgres"), ("gunicorn", "redis")]
RECYCLE_CASES = [("gunicorn", "sqlite"), ("uvicorn", "postgres"), ("gunicorn", "redis")]
#: Each server's own way to retire a worker after a few requests: uvicorn's, and
#: gunicorn's (with its jitter, so the workers retire at different counts).
RECYCLE_FLAGS = {
    "uvicorn": ["--limit-max-requests", "3"],
    "gunicorn": ["--max-requests", "3", "--max-requests-jitter", "2"],
}


@pytest.mark.parametrize(("kind", "store_url"), SIGTERM_CASES, indirect=["store_url"])
def test_sigterm_hands_over_within_the_grace_period(
    kind: str, store_url: str, tmp_path: Path
) -> None:
    """SIGTERM of one worker: its lifespan shutdown cancels the run after ``grace_ms`` and
    releases the lease, and another worker takes the run over. Then SIGTERM of the
    server: every worker stops within the grace period plus the hand-over."""
    grace_s = 0.5
    jobs = [{**LONG, "kind": "async"}]  # awaited when cancelled: its "end" is always written
    with serve(kind, tmp_path, backend=store_url, jobs=jobs, grace_ms=500) as srv:
        srv.wait_ready(3)
        first = srv.wait_for(
            lambda ev: [e for e in ev if e["e"] == "start" and e["job"] == "long"], 10, "a run"
        )[0]
        signalled = time.time()
        os.kill(first["pid"], signal.SIGTERM)
        ended = srv.wait_for(
            lambda ev: [e for e in ev if e["e"] == "end" and e["pid"] == first["pid"]],
            5,
            "the cancelled end",
        )[0]
        assert ended["cancelled"] is not None and ended["slot"] == first["slot"]
        assert grace_s - 0.1 <= ended["t"] - signalled <= grace_s + 1.5
        stopped = srv.wait_for(
            lambda ev: [e for e in ev if e["e"] == "stopped" and e["pid"] == first["pid"]],
            5,
            "the worker's lifespan shutdown",
        )[0]
        assert stopped["t"] - signalled < grace_s + 3
        takeover = srv.wait_for(
            lambda ev: [
                e
                for e in ev
                if e["e"] == "start" and e["slot"] == first["slot"] and e["attempt"] == 2
            ],
            5,
            "the takeover",
        )[0]
        assert takeover["pid"] != first["pid"]

        # Then the whole server, with a run in flight somewhere.
        srv.wait_for(
            lambda ev: [e for e in ev if e["e"] == "start" and e["t"] > takeover["t"] + 0.5],
            10,
            "another run",
        )
        pids = srv.ready_pids()
        signalled = time.time()
        assert srv.terminate() == 0
        assert time.time() - signalled < grace_s + 5
        assert_clean_shutdown(srv, pids)


@pytest.mark.parametrize(("kind", "store_url"), RECYCLE_CASES, indirect=["store_url"])
def test_recycled_workers_lose_no_slot(kind: str, store_url: str, tmp_path: Path) -> None:
    """``--limit-max-requests`` (uvicorn) or ``--max-requests`` with
    ``--max-requests-jitter`` (gunicorn): workers exit (lifespan shutdown) and are
    replaced while requests keep coming; catch-up recovers any slot that passed while
    none was up."""
    # A generous horizon: on a loaded machine a worker that is starting or stopping may
    # claim a slot more than its 1 s gap late, and a slot abandoned while workers were up
    # is (rightly) not caught up. What this test is about is the time with none up.
    job = {"name": "tick", "every": "1s", "catch_up": "all", "misfire_grace_ms": 5000}
    extra = RECYCLE_FLAGS[kind]
    with serve(kind, tmp_path, backend=store_url, jobs=[job], workers=2, extra=extra) as srv:
        srv.wait_ready(2)
        deadline = time.monotonic() + 7
        answered = 0
        while time.monotonic() < deadline:
            with suppress(httpx.TransportError):  # a retiring worker may drop it
                answered += srv.get("/whoami").status_code == 200
            time.sleep(0.1)
        srv.wait_for(lambda ev: len(srv.ready_pids()) >= 2, 20, "replacement workers")
        time.sleep(2.5)  # at least one full slot with both replacements up
        assert srv.terminate() == 0
        events = srv.events()
        stopped = [e for e in events if e["e"] == "stopped"]
        assert len(stopped) >= 4, "the workers were not recycled"
        slots = assert_exactly_once(events, "tick")
        store = store_url.split(":")[0]
        print(
            f"{kind} {store}: recycled {len(stopped)} workers, {answered} answers, "
            f"{len(slots)} slots"
        )


def test_the_json_api_answers_the_same_from_every_worker(store_url: str, tmp_path: Path) -> None:
    jobs = [{"name": "tick", "every": "1s"}, {"name": "report", "every": "2s"}]
    with serve("uvicorn", tmp_path, backend=store_url, jobs=jobs) as srv:
        pids = srv.wait_ready(3)
        srv.wait_for(lambda ev: len(slots_of(ev, "report", "end")) >= 2, 10, "report runs")
        first_slot = min(slots_of(srv.events(), "tick", "end"))
        served: Counter[str] = Counter()
        runs_answers, job_lists, instance_sets = set(), set(), set()

        def ask(_: int) -> tuple[httpx.Response, ...]:
            return (
                srv.get(f"/anarchon/api/runs?until={first_slot + 1}&limit=5"),
                srv.get("/anarchon/api/jobs"),
                srv.get("/anarchon/api/instances"),
                srv.post("/anarchon/api/jobs/tick/pause"),
            )

        with ThreadPoolExecutor(8) as pool:  # concurrent, so that every worker gets some
            answers = list(pool.map(ask, range(40)))
        for runs, jobs_answer, instances, refused in answers:
            for answer in (runs, jobs_answer, instances, refused):
                served[answer.headers["x-worker-pid"]] += 1
            for answer in (runs, jobs_answer, instances):
                assert answer.status_code == 200, answer.text
            runs_answers.add(runs.text)
            job_lists.add(tuple((j["job"], j["instances"]) for j in jobs_answer.json()["jobs"]))
            instance_sets.add(frozenset(i["pid"] for i in instances.json()["instances"]))
            assert refused.status_code == 403 and "not enabled" in refused.json()["error"]
        assert len(served) >= 2, f"one worker served everything: {served}"
        assert len(runs_answers) == 1  # the same page of history from every worker
        assert job_lists == {(("report", 3), ("tick", 3))}
        assert instance_sets == {frozenset(pids)}
        health = srv.get("/anarchon/api/health").json()
        assert health["status"] == "ok" and health["instances"] == 3
