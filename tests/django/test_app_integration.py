"""``ready()`` opens nothing; the ASGI lifespan wrapper and the gunicorn hooks start and stop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import pytest
from procs import child_env, manage

from anarchon_core import RunContext
from anarchon_django import _scheduler, asgi, gunicorn
from anarchon_django._scheduler import DjangoScheduler
from anarchon_django.checks import TAG


@pytest.mark.parametrize("engine", ["sqlite", "postgres", "mysql"])
def test_ready_and_checks_never_touch_the_database(engine: str, tmp_path: Path) -> None:
    """``manage.py check`` passes although the database does not exist.

    From Django 6.1 on, Django's own model checks run against every database, and on
    SQLite (a ``JSONField``) and MySQL (the column types) they connect: there, the
    checks of this app alone (``--tag anarchon``) pass without a database.
    """
    name = str(tmp_path / "missing" / "db.sqlite3") if engine == "sqlite" else "anarchon_no_db"
    django_connects = django.VERSION >= (6, 1) and engine != "postgres"
    result = manage(
        "check",
        *(["--tag", TAG] if django_connects else []),
        env={
            "ANARCHON_TEST_DJANGO_DB": engine,
            "ANARCHON_TEST_DJANGO_NAME": name,
            "ANARCHON_TEST_BACKEND": "django://default",
        },
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "missing").exists()


def test_importing_the_package_builds_nothing() -> None:
    code = (
        "import sys, anarchon_django, anarchon_django.apps; "
        "assert 'anarchon_django._scheduler' not in sys.modules or "
        "anarchon_django._scheduler._current is None; "
        "assert 'anarchon_django.backend' not in sys.modules"
    )
    env = child_env()
    env.pop("DJANGO_SETTINGS_MODULE")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


def sqlite_scheduler(tmp_path: Path) -> tuple[DjangoScheduler, list[int]]:
    scheduler = DjangoScheduler(f"sqlite:///{tmp_path / 's.db'}", jitter_ms=0, heartbeat_ms=100)
    ran: list[int] = []

    @scheduler.every("beat", "100ms")
    def beat(ctx: RunContext) -> None:
        ran.append(ctx.slot)

    return scheduler, ran


async def lifespan(app: asgi.ASGIApp, *messages: str) -> list[dict[str, Any]]:
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    sent: list[dict[str, Any]] = []
    for message in messages:
        inbox.put_nowait({"type": message})

    async def send(message: Any) -> None:
        sent.append(dict(message))

    await app({"type": "lifespan"}, inbox.get, send)
    return sent


def test_asgi_lifespan_starts_and_stops_the_scheduler(tmp_path: Path) -> None:
    scheduler, ran = sqlite_scheduler(tmp_path)
    calls: list[str] = []

    async def django_app(scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["type"])

    app = asgi.with_scheduler(django_app, scheduler=scheduler)

    async def main() -> list[dict[str, Any]]:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        sent: list[dict[str, Any]] = []

        async def send(message: Any) -> None:
            sent.append(dict(message))

        task = asyncio.create_task(app({"type": "lifespan"}, inbox.get, send))
        await inbox.put({"type": "lifespan.startup"})
        while not sent:
            await asyncio.sleep(0.01)
        assert scheduler.running
        await app({"type": "http"}, inbox.get, send)
        for _ in range(100):
            if ran:
                break
            await asyncio.sleep(0.05)
        await inbox.put({"type": "lifespan.shutdown"})
        await task
        return sent

    sent = asyncio.run(main())
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert ran and not scheduler.running
    assert calls == ["http"]  # other scopes reach the wrapped application; lifespan does not


def test_asgi_startup_fails_with_the_reason() -> None:
    scheduler = DjangoScheduler("ftp://nowhere")
    app = asgi.with_scheduler(lambda *a: None, scheduler=scheduler)  # type: ignore[arg-type, return-value]
    sent = asyncio.run(lifespan(app, "lifespan.startup"))
    assert sent[0]["type"] == "lifespan.startup.failed"
    assert "ftp" in sent[0]["message"]


@pytest.fixture
def project_scheduler(tmp_path: Path) -> Iterator[tuple[DjangoScheduler, list[int]]]:
    scheduler, ran = sqlite_scheduler(tmp_path)
    old = _scheduler.reset_scheduler(scheduler)
    try:
        yield scheduler, ran
    finally:
        _scheduler.reset_scheduler(old)


def test_gunicorn_hooks(project_scheduler: tuple[DjangoScheduler, list[int]]) -> None:
    import time

    scheduler, ran = project_scheduler
    gunicorn.post_worker_init(object())
    try:
        assert scheduler.running
        deadline = time.monotonic() + 5
        while not ran and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ran
    finally:
        gunicorn.worker_exit(object(), object())
    assert not scheduler.running
