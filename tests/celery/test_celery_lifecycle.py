"""The scheduler's life cycle as beat drives it, and what each job's handler sends."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from typing import Any

import pytest
from celery.beat import BeatLazyFunc, Service
from celery_alias_dist import write_alias_dist

import anarchon_celery
from anarchon_celery.scheduler import TICK_SECONDS
from anarchon_core.testing import run_once

SLOT = 1_800_000_000_000


@pytest.fixture
def no_sockets(monkeypatch):
    opened: list[object] = []

    def refuse(self: socket.socket, *args: Any) -> None:
        opened.append(args)
        raise AssertionError(f"socket connect {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return opened


@pytest.mark.parametrize("lazy", [True, False])
def test_construction_does_no_io_and_starts_nothing(make_app, no_sockets, lazy: bool):
    app = make_app(
        {"sync": {"task": "t", "schedule": 5}},
        broker_url="redis://:secret@127.0.0.1:6379/15",
        anarchon_backend="redis://:secret@127.0.0.1:6379/13",
    )
    threads = threading.active_count()
    sched = anarchon_celery.Scheduler(app=app, lazy=lazy)
    info = sched.info
    assert "secret" not in info and "***" in info
    assert "namespace 'proj'" in info and "1 entry" in info
    assert threading.active_count() == threads
    assert not no_sockets
    assert sched._background is None


def test_tick_starts_the_engine_and_close_is_idempotent(make_scheduler):
    sched = make_scheduler({"sync": {"task": "t", "schedule": 5}})
    assert sched._background is None
    assert 0 < sched.tick() <= TICK_SECONDS
    assert sched._background is not None and sched._background.running
    assert sched._core is not None and sched._core.running
    assert 0 < sched.tick() <= TICK_SECONDS
    sched.close()
    sched.close()
    assert sched._background is None and not sched._core.running
    # beat may resume a closed scheduler: the next tick starts it again
    assert sched.tick() <= TICK_SECONDS and sched._core.running
    sched.close()
    assert not sched._core.running


def test_close_without_tick_and_on_lazy_instances(make_scheduler, make_app):
    make_scheduler({"sync": {"task": "t", "schedule": 5}}).close()
    anarchon_celery.Scheduler(app=make_app(), lazy=True).close()


def test_tick_raises_on_a_fatal_engine_error(make_scheduler):
    sched = make_scheduler({"sync": {"task": "t", "schedule": 5}})
    sched.tick()
    try:
        assert sched._core is not None and sched._core._engine is not None
        sched._core._engine.failed = PermissionError("store refused")
        with pytest.raises(RuntimeError, match="store refused"):
            sched.tick()
    finally:
        sched.close()


class Sent:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any, dict[str, Any]]] = []

    def __call__(self, name: str, args: Any, kwargs: Any, **options: Any) -> None:
        self.calls.append((name, args, kwargs, options))


def test_handler_sends_the_task_with_headers_and_a_deterministic_id(make_app, monkeypatch):
    evaluated: list[int] = []

    def stamp() -> int:
        evaluated.append(1)
        return 42

    app = make_app(
        {
            "sync it": {
                "task": "proj.sync",
                "schedule": 5,
                "args": (1, BeatLazyFunc(stamp)),
                "kwargs": {"when": BeatLazyFunc(stamp)},
                "options": {"queue": "q1", "priority": 3, "expires": 30, "headers": {"h": 1}},
            }
        }
    )
    sent = Sent()
    monkeypatch.setattr(app, "send_task", sent)
    sched = anarchon_celery.Scheduler(app=app)
    assert not evaluated  # lazy arguments are evaluated at send time only
    assert sched._core is not None
    (job,) = sched._core.jobs
    result = run_once(sched._core, job, slot=SLOT, attempt=2)
    ((name, args, kwargs, options),) = sent.calls
    assert (name, args, kwargs) == ("proj.sync", [1, 42], {"when": 42})
    assert options["queue"] == "q1" and options["priority"] == 3 and options["expires"] == 30
    store_name = f"proj:{job}"
    assert options["headers"] == {
        "h": 1,
        "celery_beat_task": True,
        "anarchon_job": store_name,
        "anarchon_slot": SLOT,
        "anarchon_attempt": 2,
    }
    expected = anarchon_celery.task_id_for(store_name, SLOT)
    assert options["task_id"] == expected == result.ctx.meta["task_id"]
    assert uuid.UUID(expected).version == 5
    assert sched.schedule["sync it"].options["headers"] == {"h": 1}  # entry left unchanged
    run_once(sched._core, job, slot=SLOT)
    assert sent.calls[1][3]["task_id"] == expected  # same run, same id
    run_once(sched._core, job, slot=SLOT + 5000)
    assert sent.calls[2][3]["task_id"] != expected


def test_random_task_ids(make_app, monkeypatch):
    app = make_app({"sync": {"task": "t", "schedule": 5}}, anarchon_task_id="random")
    sent = Sent()
    monkeypatch.setattr(app, "send_task", sent)
    sched = anarchon_celery.Scheduler(app=app)
    assert sched._core is not None
    run_once(sched._core, "sync", slot=SLOT)
    run_once(sched._core, "sync", slot=SLOT)
    ids = [call[3]["task_id"] for call in sent.calls]
    assert ids[0] != ids[1] and uuid.UUID(ids[0]).version == 4


def test_a_publish_error_fails_the_attempt(make_app, monkeypatch):
    app = make_app({"sync": {"task": "t", "schedule": 5}})

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(app, "send_task", broken)
    sched = anarchon_celery.Scheduler(app=app)
    assert sched._core is not None
    with pytest.raises(ConnectionError, match="broker down"):
        run_once(sched._core, "sync", slot=SLOT)


def test_the_anarchon_alias_resolves_through_the_entry_point(make_app, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(write_alias_dist(tmp_path)))
    app = make_app({"sync": {"task": "t", "schedule": 5}})
    sched = Service(app, scheduler_cls="anarchon").get_scheduler(lazy=True)
    assert type(sched) is anarchon_celery.Scheduler


def test_an_unreachable_store_does_not_stop_beat(make_scheduler, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    sched = make_scheduler(
        {"sync": {"task": "t", "schedule": 5}},
        anarchon_backend=f"sqlite:///{blocker}/sub/anarchon.sqlite3",
    )
    try:
        for _ in range(3):  # the engine retries the store in the background
            assert 0 < sched.tick() <= TICK_SECONDS
            time.sleep(0.1)
        assert "store unavailable" in caplog.text
    finally:
        sched.close()
        sched.close()


def test_close_is_bounded_by_the_grace_period_with_a_send_in_flight(make_app, monkeypatch):
    app = make_app(
        {"sync": {"task": "t", "schedule": 1}}, anarchon_jitter_ms=0, anarchon_grace_ms=200
    )
    started, release = threading.Event(), threading.Event()

    def slow_send(*args: Any, **kwargs: Any) -> None:
        started.set()
        release.wait(10)

    monkeypatch.setattr(app, "send_task", slow_send)
    sched = anarchon_celery.Scheduler(app=app)
    try:
        sched.tick()
        assert started.wait(3), "no send within 3 s"
        began = time.monotonic()
        sched.close()
        assert time.monotonic() - began < 2.0
        assert sched._core is not None and not sched._core.running
    finally:
        release.set()
        sched.close()
