"""In-process tests of the lifespan, the dependency and the router.

``with TestClient(app)`` and asgi-lifespan's ``LifespanManager`` run the real lifespan
protocol; the multi-worker behaviour is in ``test_servers.py``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.testclient import TestClient

from anarchon_core import MemoryBackend, RunContext, Scheduler, SchedulerStateError
from anarchon_core.errors import ConfigurationError
from anarchon_fastapi import SchedulerDep, lifespan, router

JSON = {"Content-Type": "application/json"}


def make_scheduler(backend: Any = None, **kwargs: Any) -> Scheduler:
    kwargs.setdefault("heartbeat_ms", 100)
    kwargs.setdefault("jitter_ms", 0)
    return Scheduler(backend or MemoryBackend(), instance_id="unit:1", **kwargs)


def wait_until(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_lifespan_alone_exposes_and_removes_the_scheduler() -> None:
    scheduler = make_scheduler()
    ran: list[int] = []

    @scheduler.every("tick", "200ms")
    async def tick(ctx: RunContext) -> None:
        ran.append(ctx.slot)

    app = FastAPI(lifespan=lifespan(scheduler))

    @app.get("/who")
    async def who(s: SchedulerDep, request: Request) -> dict[str, Any]:
        assert s is request.app.state.anarchon is request.state.anarchon
        return {"instance": s.instance_id, "running": s.running}

    assert not scheduler.running
    with TestClient(app) as client:
        assert scheduler.running
        assert client.get("/who").json() == {"instance": "unit:1", "running": True}
        wait_until(lambda: len(ran) >= 2)
    assert not scheduler.running
    assert not hasattr(app.state, "anarchon")


def test_composition_starts_after_and_stops_before_the_apps_own_lifespan() -> None:
    scheduler = make_scheduler()
    order: list[str] = []

    class Pool:
        open = False

    @asynccontextmanager
    async def app_lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        assert not scheduler.running
        Pool.open = True
        order.append("pool opened")
        try:
            yield {"pool": Pool}
        finally:
            assert not scheduler.running, "the scheduler must stop before the pool closes"
            Pool.open = False
            order.append("pool closed")

    @scheduler.every("uses.pool", "200ms")
    async def uses_pool(ctx: RunContext) -> None:
        order.append("ran with pool" if Pool.open else "ran WITHOUT pool")

    app = FastAPI(lifespan=lifespan(scheduler, inner=app_lifespan))

    @app.get("/pool")
    async def pool(request: Request) -> dict[str, Any]:
        return {"inner": request.state.pool is Pool, "anarchon": request.state.anarchon.running}

    with TestClient(app) as client:
        assert client.get("/pool").json() == {"inner": True, "anarchon": True}
        wait_until(lambda: "ran with pool" in order)
    assert order[0] == "pool opened" and order[-1] == "pool closed"
    assert "ran WITHOUT pool" not in order


def test_a_failing_app_startup_never_starts_the_scheduler() -> None:
    scheduler = make_scheduler()

    @asynccontextmanager
    async def broken(app: FastAPI) -> AsyncIterator[None]:
        raise RuntimeError("no database")
        yield

    app = FastAPI(lifespan=lifespan(scheduler, inner=broken))
    with pytest.raises(RuntimeError, match="no database"), TestClient(app):
        pass
    assert not scheduler.running


async def test_starting_the_same_scheduler_twice_is_an_error() -> None:
    scheduler = make_scheduler()
    first, second = FastAPI(lifespan=lifespan(scheduler)), FastAPI(lifespan=lifespan(scheduler))
    async with LifespanManager(first):
        with pytest.raises(SchedulerStateError, match="already running"):
            async with LifespanManager(second):
                pass
        assert scheduler.running and first.state.anarchon is scheduler
    assert not scheduler.running


def test_bad_arguments_are_refused_at_definition() -> None:
    with pytest.raises(ConfigurationError, match="Scheduler"):
        lifespan("not a scheduler")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="grace_ms"):
        lifespan(make_scheduler(), grace_ms=-1)
    with pytest.raises(ConfigurationError, match="inner"):
        lifespan(make_scheduler(), inner=42)  # type: ignore[arg-type]


def test_router_lifespan_alternative() -> None:
    """``APIRouter(lifespan=…)``, merged into the app's by ``include_router``."""
    scheduler = make_scheduler()
    order: list[str] = []

    @asynccontextmanager
    async def app_lifespan(app: FastAPI) -> AsyncIterator[None]:
        order.append("app up")
        yield
        order.append(f"app down, scheduler running={scheduler.running}")

    jobs = APIRouter(lifespan=lifespan(scheduler))
    app = FastAPI(lifespan=app_lifespan)
    app.include_router(jobs)
    app.include_router(router(public=True), prefix="/anarchon")

    @app.get("/who")
    async def who(s: SchedulerDep) -> str:
        return s.instance_id

    with TestClient(app) as client:
        assert client.get("/who").json() == "unit:1"
        assert client.get("/anarchon/api/health").json()["status"] == "ok"
    # FastAPI runs the app's own lifespan outside the router's: the app is up first
    # and goes down last, as with inner=.
    assert order == ["app up", "app down, scheduler running=False"]


async def test_shutdown_hands_over_within_the_grace_period() -> None:
    scheduler = make_scheduler(lease_ms=300)
    started = asyncio.Event()
    outcome: list[str] = []

    @scheduler.every("slow", "200ms")
    async def slow(ctx: RunContext) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    app = FastAPI(lifespan=lifespan(scheduler, grace_ms=300))
    async with LifespanManager(app, shutdown_timeout=10):
        await asyncio.wait_for(started.wait(), 5)
        t0 = time.monotonic()
    took = time.monotonic() - t0
    assert outcome == ["cancelled"]
    assert 0.25 <= took < 2.0, took
    [record] = await scheduler.history(job="slow")
    assert (record.attempt, record.status.value, record.error) == (1, "interrupted", "handed over")


# -- the router ----------------------------------------------------------------------------
def api_app(scheduler: Scheduler, **options: Any) -> FastAPI:
    """The scheduler's app with the router: public (read-only) unless ``options`` say."""
    if not options.get("dependencies") and not options.get("insecure_no_auth"):
        options.setdefault("public", True)
    app = FastAPI(lifespan=lifespan(scheduler))
    app.include_router(router(**options), prefix="/anarchon")
    return app


def test_the_json_api_reads_the_schedulers_store() -> None:
    scheduler = make_scheduler()

    @scheduler.every("report", "200ms")
    def report(ctx: RunContext) -> None:
        pass

    with TestClient(api_app(scheduler)) as client:
        wait_until(lambda: client.get("/anarchon/api/runs?job=report").json()["runs"])
        jobs = client.get("/anarchon/api/jobs").json()
        assert [j["job"] for j in jobs["jobs"]] == ["report"] and jobs["actions"] is False
        runs = client.get("/anarchon/api/runs", params={"job": "report", "limit": "1"})
        assert runs.headers["cache-control"] == "no-store"
        assert runs.json()["runs"][0]["job"] == "report"
        instances = client.get("/anarchon/api/instances").json()["instances"]
        assert [i["instance_id"] for i in instances] == ["unit:1"]
        health = client.get("/anarchon/api/health").json()
        assert health["status"] == "ok" and health["instances"] == 1

        bad = client.get("/anarchon/api/runs?limit=many")
        assert bad.status_code == 400 and "limit='many'" in bad.json()["error"]
        bad = client.get("/anarchon/api/runs?status=fine")
        assert bad.status_code == 400 and "fine" in bad.json()["error"]
        missing = client.get("/anarchon/api/nothing")
        assert missing.status_code == 404 and "error" in missing.json()


def test_actions_are_refused_and_undocumented_unless_allowed() -> None:
    scheduler = make_scheduler()
    scheduler.every("report", "1h", lambda ctx: None)
    with TestClient(api_app(scheduler)) as client:
        for path, body in (
            ("jobs/report/pause", {}),
            ("jobs/report/resume", {}),
            ("jobs/report/trigger", {}),
            ("runs/cancel", {"job": "report", "slot": 0}),
            ("definitions", {"name": "x", "schedule": {"every": "1h"}, "target": "t"}),
            ("definitions/x", {"name": "x", "schedule": {"every": "1h"}, "target": "t"}),
            ("definitions/x/remove", {"version": 1}),
        ):
            refused = client.post(f"/anarchon/api/{path}", json=body)
            assert refused.status_code == 403, path
            assert refused.json()["error"].startswith("actions are not enabled on this dashboard")
            assert "router(allow_actions=True" in refused.json()["error"]
        paths = client.get("/openapi.json").json()["paths"]
        assert sorted(paths) == [
            "/anarchon/api/definitions",
            "/anarchon/api/definitions/{job}",
            "/anarchon/api/health",
            "/anarchon/api/instances",
            "/anarchon/api/jobs",
            "/anarchon/api/runs",
        ]
        assert client.get("/anarchon/api/jobs").json()["actions"] is False


def test_actions_when_allowed() -> None:
    scheduler = make_scheduler()
    scheduler.every("report", "1h", lambda ctx: None)
    app = api_app(scheduler, allow_actions=True, insecure_no_auth=True)
    with TestClient(app) as client:
        assert client.get("/anarchon/api/jobs").json()["actions"] is True
        paused = client.post("/anarchon/api/jobs/report/pause", json={})
        assert paused.json() == {"job": "report", "paused": True}
        assert client.get("/anarchon/api/jobs").json()["jobs"][0]["paused"] is True
        assert client.post("/anarchon/api/jobs/report/resume", json={}).json()["paused"] is False
        trigger = client.post("/anarchon/api/jobs/report/trigger", json={}).json()
        assert trigger["job"] == "report" and isinstance(trigger["slot"], int)
        cancel = client.post("/anarchon/api/runs/cancel", json={"job": "report", "slot": 1})
        assert cancel.json() == {"job": "report", "slot": 1, "cancelled": False}
        bad = client.post("/anarchon/api/runs/cancel", content=b"{}", headers=JSON)
        assert bad.status_code == 400 and "cancel body" in bad.json()["error"]
        assert client.get("/anarchon/api/jobs/report/pause").status_code == 405
        paths = client.get("/openapi.json").json()["paths"]
        assert "/anarchon/api/jobs/{job}/trigger" in paths
        for path in ("/anarchon/api/runs/cancel", "/anarchon/api/jobs/{job}/pause"):
            body = paths[path]["post"]["requestBody"]
            assert body["required"] is True and list(body["content"]) == ["application/json"]


def test_the_dashboard_page_and_files() -> None:
    with TestClient(api_app(make_scheduler())) as client:
        moved = client.get("/anarchon", follow_redirects=False)
        assert moved.status_code in (307, 308) and moved.headers["location"].endswith("/anarchon/")
        page = client.get("/anarchon/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert 'href="dashboard.css"' in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert (
            client.get("/anarchon/dashboard.js")
            .headers["content-type"]
            .startswith("text/javascript")
        )
        assert client.get("/anarchon/dashboard.css").status_code == 200
        assert client.get("/anarchon/secrets.txt").status_code == 404
    with TestClient(api_app(make_scheduler(), dashboard=False)) as client:
        assert client.get("/anarchon/").status_code == 404
        assert client.get("/anarchon/api/health").status_code == 200


def test_auth_dependencies_guard_the_api_not_the_page() -> None:
    def bearer(request: Request) -> None:
        if request.headers.get("authorization") != "Bearer s3cret":
            raise HTTPException(401, "give the token")

    app = api_app(make_scheduler(), allow_actions=True, dependencies=[Depends(bearer)])
    with TestClient(app) as client:
        assert client.get("/anarchon/api/jobs").status_code == 401
        assert client.post("/anarchon/api/jobs/x/pause", json={}).status_code == 401
        assert client.get("/anarchon/api/nothing").status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        assert client.get("/anarchon/api/jobs", headers=auth).status_code == 200
        assert client.get("/anarchon/").status_code == 200


def test_without_the_lifespan_the_router_and_dependency_answer_503() -> None:
    app = FastAPI()
    app.include_router(router(public=True), prefix="/anarchon")

    @app.get("/who")
    async def who(s: SchedulerDep) -> str:
        return s.instance_id

    with TestClient(app) as client:
        answer = client.get("/anarchon/api/jobs")
        assert answer.status_code == 503 and "lifespan(scheduler)" in answer.json()["error"]
        assert client.get("/who").status_code == 503


async def test_a_disabled_scheduler_still_serves_the_api(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    worker = make_scheduler(url)
    worker.every("report", "200ms", lambda ctx: None)
    await worker.start()
    try:
        web = make_scheduler(url, enabled=False)
        web.every("report", "200ms", lambda ctx: None)
        app = api_app(web)
        async with LifespanManager(app) as manager:
            transport = httpx.ASGITransport(app=manager.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                # Until the worker has run something and is listed: its registry entry
                # lives one lease (300 ms here), so a loop stalled that long (a loaded
                # machine) finds it briefly expired; read both again until they show.
                deadline = time.monotonic() + 5
                while True:
                    runs = (await client.get("/anarchon/api/runs")).json()["runs"]
                    reply = await client.get("/anarchon/api/instances")
                    instances = [i["instance_id"] for i in reply.json()["instances"]]
                    if runs and instances:
                        break
                    assert time.monotonic() < deadline, (runs, instances)
                    await asyncio.sleep(0.05)
                assert instances == ["unit:1"]  # the worker only: a disabled one never registers
        assert web.backend._conn is None  # type: ignore[attr-defined]  # closed by the lifespan
    finally:
        await worker.stop()


def test_the_package_imports_no_other_adapter() -> None:
    code = (
        "import sys, anarchon_fastapi; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('anarchon_django', 'anarchon_celery', 'django', 'celery')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_example_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANARCHON_BACKEND", f"sqlite:///{tmp_path / 'example.sqlite3'}")
    monkeypatch.setenv("ANARCHON_DASHBOARD_TOKEN", "t0ken")
    path = Path(__file__).parents[2] / "examples" / "fastapi_app" / "app.py"
    spec = importlib.util.spec_from_file_location("anarchon_fastapi_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with TestClient(example.app) as client:
        assert client.get("/").json()["jobs"] == ["cache.refresh", "reports.daily"]
        assert client.get("/anarchon/api/jobs").status_code == 401
        auth = {"Authorization": "Bearer t0ken"}
        jobs = client.get("/anarchon/api/jobs", headers=auth).json()
        assert jobs["actions"] is True
        assert {j["job"] for j in jobs["jobs"]} == {"cache.refresh", "reports.daily"}
        for hostile in ("Bearer t0kén".encode(), b"Bearer \xff\xfe", "Bearer 令牌".encode()):
            refused = client.get("/anarchon/api/jobs", headers={"Authorization": hostile})  # type: ignore[dict-item]
            assert refused.status_code == 401
        paused = client.post("/anarchon/api/jobs/reports.daily/pause", headers=auth, json={})
        assert paused.json() == {"job": "reports.daily", "paused": True}
        assert client.get("/anarchon/").status_code == 200
    assert not example.scheduler.running


# -- hostile requests ----------------------------------------------------------------------
def test_a_router_without_authentication_is_refused_at_construction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(ConfigurationError, match=r"dependencies=\[Depends.*public=True"):
        router()
    with pytest.raises(ConfigurationError, match=r"dependencies=\[Depends.*insecure_no_auth=True"):
        router(allow_actions=True)
    with pytest.raises(ConfigurationError, match="insecure_no_auth=True"):
        router(allow_actions=True, public=True)
    with pytest.raises(ConfigurationError, match="public=True"):
        router(dependencies=[])
    with pytest.raises(ConfigurationError, match="trusted origin 'ops\\.example\\.com'"):
        router(public=True, trusted_origins=["ops.example.com"])
    router(public=True)
    router(dependencies=[Depends(session_cookie)])
    router(allow_actions=True, dependencies=[Depends(session_cookie)])
    assert not caplog.records
    router(allow_actions=True, insecure_no_auth=True)
    assert "without authentication" in caplog.text


def session_cookie(request: Request) -> None:
    """Cookie authentication, which a browser attaches to cross-site requests too."""
    if request.cookies.get("session") != "operator":
        raise HTTPException(401, "log in")


def test_a_cross_site_request_cannot_act_with_a_users_cookie() -> None:
    scheduler = make_scheduler()
    scheduler.every("report", "1h", lambda ctx: None)
    app = api_app(scheduler, allow_actions=True, dependencies=[Depends(session_cookie)])
    cancel = b'{"job": "report", "slot": 0}'
    with TestClient(app, cookies={"session": "operator"}) as client:
        for headers, status in (
            ({"Content-Type": "text/plain", "Origin": "https://evil.example"}, 403),
            ({**JSON, "Origin": "https://evil.example"}, 403),
            ({**JSON, "Origin": "https://testserver.evil.example"}, 403),
            ({**JSON, "Origin": "null"}, 403),
            ({**JSON, "Sec-Fetch-Site": "cross-site"}, 403),
            ({**JSON, "Origin": "http://testserver", "Sec-Fetch-Site": "same-site"}, 403),
            ({"Content-Type": "text/plain"}, 415),
            ({"Content-Type": "multipart/form-data; boundary=x"}, 415),
            ({}, 415),
        ):
            for path in ("jobs/report/pause", "jobs/report/trigger", "runs/cancel"):
                answer = client.post(f"/anarchon/api/{path}", content=cancel, headers=headers)
                assert answer.status_code == status, (path, headers, answer.text)
                assert "error" in answer.json()
        assert client.get("/anarchon/api/jobs").json()["jobs"][0]["paused"] is False
        time.sleep(0.3)  # a trigger would have run within a heartbeat
        assert client.get("/anarchon/api/runs?job=report").json()["runs"] == []

        same = {**JSON, "Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
        answer = client.post("/anarchon/api/jobs/report/pause", content=b"{}", headers=same)
        assert answer.json() == {"job": "report", "paused": True}
        charset = {"Content-Type": "Application/JSON; charset=utf-8"}
        answer = client.post("/anarchon/api/runs/cancel", content=cancel, headers=charset)
        assert answer.json() == {"job": "report", "slot": 0, "cancelled": False}


def test_trusted_origins_pass_the_origin_check() -> None:
    scheduler = make_scheduler()
    scheduler.every("report", "1h", lambda ctx: None)
    app = api_app(
        scheduler,
        allow_actions=True,
        dependencies=[Depends(session_cookie)],
        trusted_origins=["https://ops.example.com"],
    )
    with TestClient(app, cookies={"session": "operator"}) as client:
        trusted = {**JSON, "Origin": "https://ops.example.com"}
        assert client.post("/anarchon/api/jobs/report/pause", json={}, headers=trusted).is_success
        other = {**JSON, "Origin": "https://ops.example.com.evil.example"}
        assert (
            client.post("/anarchon/api/jobs/report/pause", json={}, headers=other).status_code
            == 403
        )
