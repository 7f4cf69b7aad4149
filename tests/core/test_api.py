"""The read API and the HTTP endpoints over the memory backend, on a settable clock."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from anarchon_core import Scheduler, stored_jobs
from anarchon_core.backend import ClaimRequest, InstanceInfo, Lease, TakeoverRequest
from anarchon_core.backends.memory import MemoryBackend
from anarchon_core.definitions import Definition
from anarchon_core.errors import ConfigurationError
from anarchon_core.job import Job
from anarchon_core.records import HistoryQuery, Origin, Outcome, RunRecord, Status
from anarchon_core.schedules import Every
from anarchon_core.testing import ManualClock
from anarchon_core.web import api
from anarchon_core.web.api import SCHEMAS
from anarchon_core.web.endpoints import ROUTES, DashboardAPI, dashboard_file

T = TypeVar("T")
START = 1_796_284_800_000  # 2026-12-03T08:00:00Z, on every grid used here
MINUTE = 60_000


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Cluster:
    """A memory store with helpers that write what a scheduler would write."""

    def __init__(self) -> None:
        self.clock = ManualClock(START)
        self.backend = MemoryBackend(clock=self.clock)

    async def run(
        self,
        job: str,
        slot: int,
        status: Status = Status.SUCCESS,
        *,
        start_after: int = 20,
        took: int = 100,
        instance: str = "a:1:aaaaaa",
        origin: Origin = Origin.SCHEDULE,
        retry_in_ms: int | None = None,
    ) -> Lease:
        self.clock.set(slot + start_after)
        token = secrets.token_hex(8)
        claim = await self.backend.claim(
            ClaimRequest(
                job=job,
                slot=slot,
                origin=origin,
                token=token,
                instance_id=instance,
                lease_ms=1000,
                horizon_ms=MINUTE,
                skip_overlap=True,
            )
        )
        assert claim.outcome == Outcome.WON, claim
        lease = Lease(job, slot, 1, token)
        if status != Status.RUNNING:
            self.clock.advance(took)
            error = "boom" if status == Status.FAILED else None
            await self.backend.finish(lease, status, error=error, retry_in_ms=retry_in_ms)
        return lease

    async def take_over(self, lease: Lease, *, instance: str = "b:2:bbbbbb") -> Lease:
        self.clock.advance(5000)  # past the lease
        token = secrets.token_hex(8)
        claim = await self.backend.take_over(
            TakeoverRequest(
                job=lease.job,
                slot=lease.slot,
                attempt=lease.attempt,
                token=token,
                instance_id=instance,
                lease_ms=1000,
                horizon_ms=MINUTE,
                max_attempts=3,
                skip_overlap=True,
            )
        )
        assert claim.outcome == Outcome.WON, claim
        return Lease(lease.job, lease.slot, claim.attempt, token)

    async def register(self, instance_id: str, *jobs: Job, started: int = START) -> None:
        """An instance as a starting scheduler makes it: its code jobs stored (where the
        API reads their schedules), its registry entry listing their fingerprints."""
        for each in jobs:
            await store_code_job(self.backend, each)
        info = InstanceInfo(
            instance_id=instance_id,
            host=instance_id.split(":")[0],
            pid=1,
            version="0.1.0",
            started_at=started,
            last_seen=started,
            jobs={each.store_name: each.fingerprint for each in jobs},
        )
        await self.backend.register(info, ttl_ms=10 * MINUTE)


async def store_code_job(backend: MemoryBackend, job: Job) -> None:
    """Store ``job`` as an ``owner='code'`` definition, over whatever the store holds."""
    definition = stored_jobs.code_definition(job)
    assert definition is not None
    current = await stored_jobs.get_definition(backend, job.name, None)
    expected = 0 if current is None else current.version
    await backend.write_definition(job.store_name, definition.body(), expected=expected)


def job(name: str, every: str = "1m") -> Job:
    return Scheduler(MemoryBackend()).add_job(name, Every(every), lambda ctx: None)


# -- runs and the cursor -----------------------------------------------------------------
def test_runs_pages_with_a_cursor_and_no_repeats_or_gaps() -> None:
    async def go() -> None:
        c = Cluster()
        for i in range(7):
            for name in ("a", "b"):
                await c.run(name, START + i * MINUTE)
        everything = (await api.runs(c.backend, limit=1000))["runs"]
        assert len(everything) == 14
        for limit in (1, 3, 5):
            seen: list[dict[str, Any]] = []
            cursor = None
            while True:
                page = await api.runs(c.backend, limit=limit, cursor=cursor)
                seen += page["runs"]
                cursor = page["next_cursor"]
                if cursor is None:
                    break
            assert seen == everything
        await c.run("a", START + 100 * MINUTE)  # recorded while an operator pages
        first = await api.runs(c.backend, job="b", limit=2)
        rest = await api.runs(c.backend, job="b", limit=100, cursor=first["next_cursor"])
        assert [r["slot"] for r in first["runs"] + rest["runs"]] == [
            START + i * MINUTE for i in reversed(range(7))
        ]
        assert rest["next_cursor"] is None

    run(go())


def test_run_json_has_iso_times_and_lateness() -> None:
    async def go() -> dict[str, Any]:
        c = Cluster()
        await c.run("a", START, start_after=250, took=40)
        return (await api.runs(c.backend))["runs"][0]

    record = run(go())
    assert record["slot"] == START and record["scheduled_at"] == "2026-12-03T08:00:00.000Z"
    assert record["started_at"] == "2026-12-03T08:00:00.250Z"
    assert (record["lateness_ms"], record["duration_ms"], record["status"]) == (250, 40, "success")


@pytest.mark.parametrize("cursor", ["", "nope", "WzEsMl0", "W1siYSJdLCJiIiwxXQ"])
def test_a_bad_cursor_is_refused_with_the_accepted_form(cursor: str) -> None:
    with pytest.raises(ConfigurationError, match="next_cursor of the previous page"):
        api.decode_cursor(cursor)


def test_runs_refuses_a_bad_limit_and_status() -> None:
    backend = MemoryBackend()
    with pytest.raises(ConfigurationError, match="from 1 to 1000"):
        run(api.runs(backend, limit=0))
    with pytest.raises(ConfigurationError, match="use one of claimed, running"):
        run(api.runs(backend, status="done"))


# -- jobs --------------------------------------------------------------------------------
def test_jobs_show_schedule_next_slots_paused_and_last_run() -> None:
    async def go() -> dict[str, Any]:
        c = Cluster()
        sync, report = job("sync", "1m"), job("report", "1h")
        await c.register("a:1:aaaaaa", sync, report)
        await c.register("b:2:bbbbbb", sync)
        await c.run("sync", START, took=300)
        await c.backend.set_paused("report", True)
        await c.run("gone", START - MINUTE)  # only history knows this one
        return await api.jobs(c.backend, now_ms=START + 1000)

    data = run(go())
    rows = {row["job"]: row for row in data["jobs"]}
    assert list(rows) == ["gone", "report", "sync"]
    sync = rows["sync"]
    assert (sync["schedule"], sync["tz"], sync["instances"], sync["paused"]) == (
        "every 1m",
        "UTC",
        2,
        False,
    )
    assert [s["slot"] for s in sync["next_slots"]] == [START + i * MINUTE for i in range(1, 6)]
    assert sync["next_slots"][0]["at"] == "2026-12-03T08:01:00.000Z"
    assert sync["last_run"]["status"] == "success" and sync["last_run"]["duration_ms"] == 300
    assert rows["report"]["paused"] is True and rows["report"]["last_run"] is None
    assert (rows["gone"]["schedule"], rows["gone"]["next_slots"]) == (None, [])
    assert data["actions"] is False and data["now_at"] == "2026-12-03T08:00:01.000Z"


def test_jobs_flag_instances_that_disagree_on_a_schedule() -> None:
    async def go() -> dict[str, Any]:
        c = Cluster()
        await c.register("old:1:aaaaaa", job("sync", "1m"), started=START - 10 * MINUTE)
        await c.register("new:1:bbbbbb", job("sync", "2m"))
        return await api.jobs(c.backend, now_ms=START)

    (row,) = run(go())["jobs"]
    assert len(row["fingerprints"]) == 2
    assert row["schedule"] == "every 2m"  # as the newest-started instance stored it


def test_window_stats_tell_takeovers_from_retries() -> None:
    async def go() -> dict[str, Any]:
        c = Cluster()
        await c.run("sync", START, took=100)
        await c.run("sync", START + MINUTE, took=300, start_after=40)
        failed = await c.run("sync", START + 2 * MINUTE, Status.FAILED, retry_in_ms=1000)
        retry = await c.take_over(failed)  # after a failure: a retry
        await c.backend.finish(retry, Status.SUCCESS)
        dead = await c.run("sync", START + 3 * MINUTE, Status.RUNNING)
        backup = await c.take_over(dead)  # the runner died: a takeover
        await c.backend.finish(backup, Status.SUCCESS)
        return await api.jobs(c.backend, now_ms=START + 10 * MINUTE)

    (row,) = run(go())["jobs"]
    stats = row["stats"]
    assert (stats["runs"], stats["success"], stats["failures"], stats["interrupted"]) == (
        4,
        4,
        1,
        1,
    )
    assert (stats["takeovers"], stats["retries"], stats["skips"]) == (1, 1, 0)
    assert stats["lateness_ms"] == {"mean": 25.0, "p95": 40}
    assert stats["duration_ms"]["p95"] == 300 and stats["truncated"] is False


def test_window_stats_of_nothing() -> None:
    stats = api.window_stats([])
    assert stats["runs"] == 0 and stats["duration_ms"] is None and stats["lateness_ms"] is None


def test_a_window_beyond_seven_days_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="from 1ms to 7d"):
        run(api.jobs(MemoryBackend(), window_ms=8 * 24 * 3_600_000))


def test_instances_json_and_mismatches() -> None:
    async def go() -> dict[str, Any]:
        c = Cluster()
        await c.register("a:1:aaaaaa", job("sync", "1m"))
        await c.register("b:1:bbbbbb", job("sync", "5m"))
        return await api.instances(c.backend)

    data = run(go())
    assert [i["instance_id"] for i in data["instances"]] == ["a:1:aaaaaa", "b:1:bbbbbb"]
    assert data["instances"][0]["started_at"] == "2026-12-03T08:00:00.000Z"
    assert sorted(v for ids in data["mismatches"]["sync"].values() for v in ids) == [
        "a:1:aaaaaa",
        "b:1:bbbbbb",
    ]


# -- the endpoints -----------------------------------------------------------------------
def call(
    endpoints: DashboardAPI, method: str, path: str, body: Any = None, **params: str
) -> tuple[int, dict[str, Any]]:
    raw = b"" if body is None else json.dumps(body).encode()
    reply = run(endpoints.handle(method, path, params, raw))
    assert json.loads(reply.json_bytes()) == reply.body
    return reply.status, reply.body


def test_endpoints_answer_the_reads() -> None:
    c = Cluster()
    run(c.run("sync", START))
    endpoints = DashboardAPI(c.backend)
    assert call(endpoints, "GET", "jobs")[1]["jobs"][0]["job"] == "sync"
    assert call(endpoints, "GET", "/runs/", job="sync", limit="1")[1]["next_cursor"] is None
    assert call(endpoints, "GET", "instances")[1]["instances"] == []
    status, health = call(endpoints, "GET", "health")
    assert (status, health["status"], health["backend"]) == (200, "ok", "memory://")
    assert call(endpoints, "GET", "jobs", window="1h")[0] == 200


@pytest.mark.parametrize(
    ("method", "path", "params", "status", "words"),
    [
        ("GET", "nowhere", {}, 404, "no API at 'nowhere'"),
        ("POST", "jobs", {}, 405, "use GET"),
        ("GET", "jobs/sync/pause", {}, 405, "use POST"),
        ("GET", "runs", {"limit": "many"}, 400, "limit='many' is not valid"),
        ("GET", "runs", {"status": "done"}, 400, "status 'done' is not valid"),
        ("GET", "runs", {"cursor": "x"}, 400, "cursor 'x' is not valid"),
        ("GET", "jobs", {"window": "forever"}, 400, "forever"),
        ("GET", "jobs", {"window": "30d"}, 400, "window '30d' is not valid: give a duration"),
        ("POST", "jobs/sync/pause", {}, 403, "actions are not enabled"),
        ("POST", "runs/cancel", {}, 403, "actions are not enabled"),
    ],
)
def test_endpoints_refuse_bad_requests_clearly(
    method: str, path: str, params: dict[str, str], status: int, words: str
) -> None:
    got, body = call(DashboardAPI(MemoryBackend()), method, path, **params)
    assert got == status and words in body["error"]


def test_actions_go_through_the_store() -> None:
    c = Cluster()
    endpoints = DashboardAPI(c.backend, allow_actions=True, requested_by="test")
    status, body = call(endpoints, "POST", "jobs/sync/trigger")
    assert status == 409 and "no live instance has job 'sync'" in body["error"]
    run(c.register("a:1:aaaaaa", job("sync")))
    assert call(endpoints, "POST", "jobs/sync/pause") == (200, {"job": "sync", "paused": True})
    assert run(c.backend.paused_jobs()) == {"sync"}
    assert call(endpoints, "GET", "jobs")[1]["actions"] is True
    assert call(endpoints, "POST", "jobs/sync/resume")[1]["paused"] is False
    assert run(c.backend.paused_jobs()) == set()

    status, body = call(endpoints, "POST", "jobs/sync/trigger")
    assert status == 200 and body["slot"] == c.clock()

    lease = run(c.run("sync", START + MINUTE, Status.RUNNING))
    cancel = {"job": "sync", "slot": lease.slot}
    assert call(endpoints, "POST", "runs/cancel", cancel)[1]["cancelled"] is True
    records: list[RunRecord] = run(c.backend.history(HistoryQuery(job="sync")))
    assert records[0].status == Status.CANCELLED
    assert call(endpoints, "POST", "runs/cancel", cancel)[1]["cancelled"] is False


def test_an_unknown_job_is_refused_with_a_did_you_mean_unless_forced() -> None:
    c = Cluster()
    endpoints = DashboardAPI(c.backend, allow_actions=True, requested_by="test")
    run(c.register("a:1:aaaaaa", job("sync")))
    for action in ("pause", "resume", "trigger"):
        status, body = call(endpoints, "POST", f"jobs/snyc/{action}")
        assert status == 409, action
        assert (
            "did you mean 'sync'" in body["error"] or "live instances have: sync" in body["error"]
        ), body
    assert run(c.backend.paused_jobs()) == set()
    forced = call(endpoints, "POST", "jobs/later/pause", {"force": True})
    assert forced == (200, {"job": "later", "paused": True})
    assert call(endpoints, "POST", "jobs/later/resume")[0] == 200  # paused: known
    run(c.run("ran-once", START))  # a job with history is known, deployed or not
    assert call(endpoints, "POST", "jobs/ran-once/pause")[0] == 200
    status, body = call(endpoints, "POST", "jobs/ran-onse/pause")  # its near miss
    assert status == 409 and "did you mean 'ran-once'" in body["error"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (None, "send JSON"),
        ({"slot": 1}, "send JSON"),
        ({"job": "sync", "slot": "soon"}, "slot 'soon' is not valid"),
        ({"job": "bad name!", "slot": 1}, "bad name!"),
    ],
)
def test_cancel_refuses_a_bad_body(body: Any, words: str) -> None:
    endpoints = DashboardAPI(MemoryBackend(), allow_actions=True)
    status, answer = call(endpoints, "POST", "runs/cancel", body)
    assert status == 400 and words in answer["error"]


def test_a_store_outage_is_a_503_naming_the_store() -> None:
    from anarchon_core.backends import backend_from_url

    backend = backend_from_url("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    status, body = call(DashboardAPI(backend), "GET", "health")
    assert status == 503 and body["status"] == "unavailable" and "127.0.0.1:1" in body["backend"]


def test_the_dashboard_files_are_packaged_and_nothing_else_is_served() -> None:
    page = dashboard_file("index.html")
    assert page is not None and page[1].startswith("text/html")
    assert b'src="dashboard.js"' in page[0] and b"http" not in page[0].split(b"<body")[0]
    assert dashboard_file("../pyproject.toml") is None and dashboard_file("api.py") is None


# -- the route table and its schemas -------------------------------------------------------
def test_every_route_is_dispatched_and_its_answers_match_its_schemas() -> None:
    """Each route of ``ROUTES`` answers with the body its OpenAPI operation describes,
    for success and for every error; the table is what ``DashboardAPI`` routes on."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    c = Cluster()
    run(c.register("a:1:aaaaaa", job("sync")))
    lease = run(c.run("sync", START, Status.RUNNING))
    endpoints = DashboardAPI(c.backend, allow_actions=True, requested_by="test")
    closed = DashboardAPI(c.backend)
    report = Definition.create("report", Every("1m"), "reports.send")
    run(c.backend.write_definition("report", report.body(), expected=0))

    def version() -> int:
        stored = run(c.backend.definitions_since(0))
        return max(d.version for d in stored if d.job == "report")

    bodies: dict[str, Any] = {
        "cancel": lambda: {"job": "sync", "slot": lease.slot},
        "add_definition": lambda: {**report.to_json(), "name": "fresh", "version": 0},
        "update_definition": lambda: {**report.to_json(), "version": version()},
        "remove_definition": lambda: {"version": version()},
    }
    reads = ["jobs", "runs", "instances", "health", "definitions", "definition"]
    actions = ["pause", "resume", "trigger", "cancel"]
    changes = ["add_definition", "update_definition", "remove_definition"]
    assert sorted(r.name for r in ROUTES) == sorted([*reads, *actions, *changes])
    for route in ROUTES:
        name = "report" if "definition" in route.name else "sync"
        path = route.path.format(job=name)
        responses = route.openapi()["responses"]
        body = bodies.get(route.name, dict)()
        answers = [call(endpoints, route.method, path, body)]
        assert answers[0][0] == 200, (route.name, answers[0])
        if route.action:
            answers.append(call(closed, route.method, path, {}))  # 403: actions are off
            answers.append(call(endpoints, route.method, path.replace(name, "bad name!"), {}))
        else:
            answers.append(call(endpoints, "POST", path))  # 405, in the error's shape
        for status, body in answers:
            assert str(status) in responses or status == 405, (route.name, status, body)
            documented = responses.get(str(status))
            schema = documented["content"]["application/json"]["schema"] if documented else None
            jsonschema_rs.validate(schema or SCHEMAS["error"], body)
    bad = call(endpoints, "GET", "runs", limit="many")
    assert bad[0] == 400
    jsonschema_rs.validate(SCHEMAS["error"], bad[1])
    jsonschema_rs.validate(SCHEMAS["cancel_body"], bodies["cancel"]())
    assert not jsonschema_rs.is_valid(SCHEMAS["runs"], {"runs": [{"job": "sync"}]})


def test_the_openapi_operations() -> None:
    by_name = {route.name: route.openapi() for route in ROUTES}
    runs = by_name["runs"]
    assert [p["name"] for p in runs["parameters"]] == [
        "job", "status", "since", "until", "limit", "cursor"
    ]  # fmt: skip
    assert all(p["in"] == "query" and not p["required"] for p in runs["parameters"])
    assert "requestBody" not in runs and sorted(runs["responses"]) == [
        "200", "400", "500", "501", "503"
    ]  # fmt: skip
    pause = by_name["pause"]
    assert pause["parameters"] == [
        {"name": "job", "in": "path", "required": True, "schema": {"type": "string"}}
    ]
    assert pause["requestBody"]["required"] is True
    assert list(pause["requestBody"]["content"]) == ["application/json"]
    assert {"403", "409", "415"} <= set(pause["responses"])
    health = by_name["health"]["responses"]
    assert sorted(health) == ["200", "503"]
    assert health["503"]["content"] == health["200"]["content"]  # unavailable, same shape
    # Each call is a fresh copy: a host may change what it publishes.
    by_name["jobs"]["responses"]["200"]["content"]["application/json"]["schema"]["x"] = 1
    assert "x" not in SCHEMAS["jobs"]
    assert [r for r in ROUTES if r.action] == [r for r in ROUTES if r.method == "POST"]
