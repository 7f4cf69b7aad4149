"""The standalone dashboard app (Starlette) in-process, and ``anarchon dashboard``'s guards."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from anarchon_core.backends import backend_from_url
from anarchon_core.cli import main
from anarchon_core.errors import BackendError, ConfigurationError
from anarchon_core.web import create_app

TOKEN = "s3cret-t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'web.sqlite3'}"


def client(app: Any, host: str = "localhost:8765") -> TestClient:
    """A client whose requests name ``host`` (a loopback name unless told otherwise)."""
    return TestClient(app, base_url=f"http://{host}")


def test_the_page_and_api_work_under_any_prefix(store: str) -> None:
    backend = backend_from_url(store)
    dashboard = create_app(backend)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # A mounted app gets no lifespan events: the host enters the dashboard's own.
        async with dashboard.router.lifespan_context(dashboard):
            yield

    app = Starlette(routes=[Mount("/ops/anarchon", dashboard)], lifespan=lifespan)
    with client(app) as c:
        moved = c.get("/ops/anarchon", follow_redirects=False)
        assert moved.status_code in (307, 308) and moved.headers["location"].endswith(
            "/ops/anarchon/"
        )
        page = c.get("/ops/anarchon/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        script = c.get("/ops/anarchon/dashboard.js")
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
        assert c.get("/ops/anarchon/pyproject.toml").status_code == 404
        jobs = c.get("/ops/anarchon/api/jobs")
        assert jobs.status_code == 200 and jobs.json()["jobs"] == []
        assert jobs.headers["cache-control"] == "no-store"
        health = c.get("/ops/anarchon/api/health").json()
        assert health["status"] == "ok" and health["backend"].startswith("sqlite:///")
        refused = c.post("/ops/anarchon/api/jobs/sync/pause", json={})
        assert refused.status_code == 403
    with pytest.raises(BackendError, match="not open"):  # the host's shutdown closed it
        asyncio.run(backend.paused_jobs())


def test_a_token_guards_the_api_but_not_the_page(store: str) -> None:
    with client(create_app(store, allow_actions=True, token=TOKEN)) as c:
        assert c.get("/").status_code == 200
        assert c.get("/api/jobs").status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert c.post("/api/jobs/sync/pause", headers=wrong, json={}).status_code == 401
        # force: the store has no "sync" yet (this is about the token, not the job)
        paused = c.post("/api/jobs/sync/pause", headers=AUTH, json={"force": True})
        assert paused.json()["paused"] is True
        jobs = c.get("/api/jobs", headers=AUTH).json()
        assert jobs["actions"] is True and [j["job"] for j in jobs["jobs"]] == ["sync"]


@pytest.mark.parametrize(
    "header",
    [
        "Bearer s3cret-t0kén".encode(),  # UTF-8
        "Bearer s3cret-t0kén".encode("latin-1"),
        b"Bearer \xff\xfe\x80",
        "Bearer 令牌".encode(),
        b"bearer",
        b"Basic czNjcmV0",
    ],
)
def test_a_non_ascii_or_malformed_token_is_a_401_never_a_500(store: str, header: bytes) -> None:
    with client(create_app(store, allow_actions=True, token=TOKEN)) as c:
        answer = c.get("/api/jobs", headers={"Authorization": header})  # type: ignore[dict-item]
        assert answer.status_code == 401 and "token" in answer.json()["error"]
        answer = c.post(
            "/api/jobs/sync/pause",
            headers={"Authorization": header, **JSON},  # type: ignore[dict-item]
            content=b"{}",
        )
        assert answer.status_code == 401


def test_a_configured_token_is_printable_ascii(store: str) -> None:
    for bad in ("", "tokén", "two words", "tab\there"):
        with pytest.raises(ConfigurationError, match="token") as raised:
            create_app(store, token=bad)
        if bad:
            assert bad not in str(raised.value)  # a secret is never echoed


def test_actions_need_a_token_unless_explicitly_unauthenticated(store: str) -> None:
    with pytest.raises(ConfigurationError, match=r"token=.*insecure_no_auth=True"):
        create_app(store, allow_actions=True)
    with client(create_app(store, allow_actions=True, insecure_no_auth=True)) as c:
        forced = c.post("/api/jobs/sync/pause", json={"force": True})  # not deployed yet
        assert forced.json() == {"job": "sync", "paused": True}


@pytest.mark.parametrize(
    "host",
    ["rebound.evil.example", "rebound.evil.example:8765", "localhost.evil.example", "10.0.0.9"],
)
def test_a_foreign_host_header_is_refused_dns_rebinding(store: str, host: str) -> None:
    """A page on evil.example whose name now resolves to 127.0.0.1 reads nothing."""
    with client(create_app(store), host=host) as c:
        for path in ("/", "/dashboard.js", "/api/jobs", "/api/runs", "/api/instances"):
            answer = c.get(path)
            assert answer.status_code == 400, path
            assert "--allow-host" in answer.json()["error"]
        assert c.post("/api/jobs/sync/pause", json={}).status_code == 400


@pytest.mark.parametrize("host", ["localhost", "localhost:8765", "127.0.0.1:1", "[::1]:8765"])
def test_loopback_host_names_are_answered(store: str, host: str) -> None:
    with client(create_app(store), host=host) as c:
        assert c.get("/api/health").status_code == 200


def test_allowed_hosts_are_added_by_name_or_domain(store: str) -> None:
    app = create_app(store, allow_hosts=["ops.example.com", ".corp.example"])
    for host, status in (
        ("ops.example.com", 200),
        ("OPS.example.com:443", 200),
        ("corp.example", 200),
        ("dash.corp.example", 200),
        ("example.com", 400),
        ("evilcorp.example", 400),
    ):
        with client(app, host=host) as c:
            assert c.get("/api/health").status_code == status, host


def test_cross_site_and_non_json_actions_are_refused(store: str) -> None:
    """Even with the token, an action must be a same-origin JSON request."""
    with client(create_app(store, allow_actions=True, token=TOKEN)) as c:
        for headers, content, status in (
            ({"Content-Type": "text/plain", "Origin": "https://evil.example"}, b"{}", 403),
            ({**JSON, "Origin": "https://evil.example"}, b"{}", 403),
            ({**JSON, "Origin": "null"}, b"{}", 403),
            ({**JSON, "Sec-Fetch-Site": "cross-site"}, b"{}", 403),
            ({**JSON, "Sec-Fetch-Site": "same-site"}, b"{}", 403),
            ({"Content-Type": "text/plain"}, b'{"job": "sync", "slot": 1}', 415),
            ({"Content-Type": "application/x-www-form-urlencoded"}, b"job=sync", 415),
            ({}, b"", 415),
        ):
            for path in ("jobs/sync/pause", "jobs/sync/trigger", "runs/cancel"):
                answer = c.post(f"/api/{path}", headers={**AUTH, **headers}, content=content)
                assert answer.status_code == status, (path, headers, answer.text)
        assert c.get("/api/jobs", headers=AUTH).json()["jobs"] == []  # nothing was paused
        same = {**AUTH, **JSON, "Origin": "http://localhost:8765", "Sec-Fetch-Site": "same-origin"}
        forced = b'{"force": true}'  # the store has no "sync" yet
        assert c.post("/api/jobs/sync/pause", headers=same, content=forced).status_code == 200


def test_the_dashboard_starts_while_the_store_is_down_and_answers_503() -> None:
    url = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
    with client(create_app(url)) as c:
        assert c.get("/").status_code == 200
        down = c.get("/api/health")
        assert down.status_code == 503 and down.json()["status"] == "unavailable"


# -- anarchon dashboard ----------------------------------------------------------------------
@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """``anarchon dashboard`` builds its app and prints its banner, but serves nothing."""
    apps: list[Any] = []
    monkeypatch.delenv("ANARCHON_DASHBOARD_TOKEN", raising=False)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: apps.append(self.config.app))
    return apps


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--allow-actions"], "--allow-actions needs a token"),
        (["--host", "0.0.0.0"], "not a loopback address"),
        (["--host", "example.org"], "not a loopback address"),
        (["--allow-host", "bad/name"], "is not valid"),
    ],
)
def test_the_dashboard_refuses_unsafe_settings(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str], served: list[Any]
) -> None:
    assert main(["dashboard", "--backend", "memory://", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err
    if "token" in words:
        assert "ANARCHON_DASHBOARD_TOKEN" in err and "--token-file" in err
    assert served == []


def test_a_token_on_the_command_line_is_refused(
    capsys: pytest.CaptureFixture[str], served: list[Any]
) -> None:
    argv = ["dashboard", "--backend", "memory://", "--allow-actions", "--token", TOKEN]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "ps" in err and "ANARCHON_DASHBOARD_TOKEN" in err and "--token-file" in err
    assert TOKEN not in err and served == []


def test_the_token_comes_from_the_environment_and_is_never_printed(
    capsys: pytest.CaptureFixture[str], served: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANARCHON_DASHBOARD_TOKEN", TOKEN)
    assert main(["dashboard", "--backend", "memory://", "--allow-actions"]) == 0
    out = capsys.readouterr().out
    assert "actions enabled" in out and "$ANARCHON_DASHBOARD_TOKEN" in out
    assert TOKEN not in out and TOKEN[:5] not in out
    with client(served[0]) as c:
        assert c.get("/api/jobs").status_code == 401
        answer = c.post("/api/jobs/sync/pause", headers=AUTH, json={"force": True})
        assert answer.status_code == 200


def test_the_token_comes_from_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], served: list[Any]
) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    argv = ["dashboard", "--backend", "memory://", "--host", "0.0.0.0", "--token-file", str(path)]
    assert main([*argv, "--allow-host", "ops.example.com"]) == 0
    out = capsys.readouterr().out
    assert f"--token-file {path}" in out and TOKEN not in out
    assert "0.0.0.0, localhost, 127.0.0.1, [::1], ops.example.com" in out
    for host in ("ops.example.com", "0.0.0.0:8765", "127.0.0.1"):
        with client(served[0], host=host) as c:
            assert c.get("/api/health", headers=AUTH).status_code == 200, host
    with client(served[0], host="evil.example") as c:
        assert c.get("/api/health", headers=AUTH).status_code == 400

    path.write_text("\n")
    assert main(argv) == 2
    assert "is empty" in capsys.readouterr().err
    assert main([*argv[:-1], str(tmp_path / "missing")]) == 2
    assert "cannot read it" in capsys.readouterr().err
