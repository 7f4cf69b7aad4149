"""The standalone dashboard app (Starlette) in-process, and ``anarchon dashboard``'s guards."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from anarchon_core.cli import main
from anarchon_core.web import create_app


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'web.sqlite3'}"


def test_the_page_and_api_work_under_any_prefix(store: str) -> None:
    app = Starlette(routes=[Mount("/ops/anarchon", create_app(store))])
    with TestClient(app) as client:
        moved = client.get("/ops/anarchon", follow_redirects=False)
        assert moved.status_code in (307, 308) and moved.headers["location"].endswith(
            "/ops/anarchon/"
        )
        page = client.get("/ops/anarchon/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        script = client.get("/ops/anarchon/dashboard.js")
        assert script.status_code == 200 and "javascript" in script.headers["content-type"]
        assert client.get("/ops/anarchon/pyproject.toml").status_code == 404
        jobs = client.get("/ops/anarchon/api/jobs")
        assert jobs.status_code == 200 and jobs.json()["jobs"] == []
        assert jobs.headers["cache-control"] == "no-store"
        health = client.get("/ops/anarchon/api/health").json()
        assert health["status"] == "ok" and health["backend"].startswith("sqlite:///")
        refused = client.post("/ops/anarchon/api/jobs/sync/pause")
        assert refused.status_code == 403


def test_a_token_guards_the_api_but_not_the_page(store: str) -> None:
    with TestClient(create_app(store, allow_actions=True, token="s3cret")) as client:
        assert client.get("/").status_code == 200
        assert client.get("/api/jobs").status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert client.post("/api/jobs/sync/pause", headers=wrong).status_code == 401
        right = {"Authorization": "Bearer s3cret"}
        assert client.post("/api/jobs/sync/pause", headers=right).json()["paused"] is True
        jobs = client.get("/api/jobs", headers=right).json()
        assert jobs["actions"] is True and [j["job"] for j in jobs["jobs"]] == ["sync"]


def test_the_dashboard_starts_while_the_store_is_down_and_answers_503() -> None:
    url = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
    with TestClient(create_app(url)) as client:
        assert client.get("/").status_code == 200
        down = client.get("/api/health")
        assert down.status_code == 503 and down.json()["status"] == "unavailable"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--allow-actions"], "--allow-actions needs a token"),
        (["--host", "0.0.0.0"], "not a loopback address"),
        (["--host", "example.org"], "not a loopback address"),
    ],
)
def test_the_dashboard_refuses_unsafe_settings(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANARCHON_DASHBOARD_TOKEN", raising=False)
    assert main(["dashboard", "--backend", "memory://", *argv]) == 2
    assert words in capsys.readouterr().err
