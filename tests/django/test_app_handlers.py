"""Handlers get fresh database connections: stale ones are closed before and after a run."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.contenttypes.models import ContentType
from django.db import connection, connections

from anarchon_core import RunContext
from anarchon_core.records import Origin
from anarchon_django._scheduler import DjangoScheduler, close_connections


def make_ctx(loop: asyncio.AbstractEventLoop) -> RunContext:
    return RunContext(
        job="j",
        slot=0,
        attempt=1,
        instance_id="t",
        origin=Origin.MANUAL,
        loop=loop,
        logger=logging.getLogger("anarchon"),
    )


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    new = asyncio.new_event_loop()
    yield new
    new.close()


def in_thread(fn: Any) -> Any:
    result: dict[str, Any] = {}

    def target() -> None:
        result["value"] = fn()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(10)
    return result["value"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("max_age", [0, 60])
def test_sync_handler_closes_stale_connections_in_its_thread(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch, max_age: int
) -> None:
    from django.db import connections

    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", max_age)
    seen: dict[str, Any] = {}

    def handler(ctx: RunContext) -> int:
        seen["at_start"] = connection.connection  # the stale one was closed
        return ContentType.objects.count()

    wrapped = close_connections(handler)
    assert wrapped.__name__ == "handler"

    def worker() -> Any:
        ContentType.objects.count()  # a connection opened before the run, now obsolete
        assert connection.connection is not None
        connection.close_at = 0.0
        value = wrapped(make_ctx(loop))
        return value, connection.connection

    value, after = in_thread(worker)
    assert value >= 0
    assert seen["at_start"] is None
    assert after is None  # closed after the run too, whatever CONN_MAX_AGE says


@pytest.mark.django_db(transaction=True)
def test_async_handler_runs_its_orm_calls_in_its_own_context_thread() -> None:
    seen: dict[str, Any] = {}

    def query() -> int:
        seen.setdefault("threads", set()).add(threading.get_ident())
        seen["wrapper"] = connections["default"]  # this thread's DatabaseWrapper, not the proxy
        return ContentType.objects.count()

    async def handler(ctx: RunContext) -> int:
        await sync_to_async(query)()
        return await sync_to_async(query)()

    wrapped = close_connections(handler)
    assert asyncio.iscoroutinefunction(wrapped)

    async def main() -> int:
        result: int = await wrapped(make_ctx(asyncio.get_running_loop()))
        return result

    assert asyncio.run(main()) >= 0
    assert len(seen["threads"]) == 1  # one thread-sensitive context for the run
    assert seen["threads"] != {threading.get_ident()}
    assert seen["wrapper"].connection is None  # closed after the run


@pytest.mark.django_db
def test_a_handler_called_inside_a_test_transaction_keeps_the_connection(
    loop: asyncio.AbstractEventLoop,
) -> None:
    scheduler = DjangoScheduler("memory://", jitter_ms=0)
    ContentType.objects.create(app_label="x", model="y")

    @scheduler.every("count", "1m")
    def count(ctx: RunContext) -> int:
        return ContentType.objects.filter(app_label="x").count()

    wrapped = scheduler.jobs["count"].handler
    assert wrapped is not count  # the scheduler holds the wrapped handler
    assert wrapped(make_ctx(loop)) == 1
    assert ContentType.objects.filter(app_label="x").count() == 1  # still in the transaction


@pytest.mark.django_db(transaction=True)
def test_a_started_scheduler_runs_orm_handlers(tmp_path: Any) -> None:
    scheduler = DjangoScheduler(f"sqlite:///{tmp_path / 's.db'}", jitter_ms=0, heartbeat_ms=100)
    counts: list[int] = []

    @scheduler.every("sync", "100ms")
    def sync_job(ctx: RunContext) -> None:
        counts.append(ContentType.objects.count())

    @scheduler.every("async", "100ms")
    async def async_job(ctx: RunContext) -> None:
        counts.append(await ContentType.objects.acount())

    async def main() -> None:
        await scheduler.start()
        for _ in range(100):
            if len(counts) >= 4:
                break
            await asyncio.sleep(0.05)
        await scheduler.stop()

    asyncio.run(main())
    assert len(counts) >= 4
    statuses = {r.status.value for r in asyncio.run(scheduler.history())}
    # A slot is skipped when the previous run of its 100-ms job is still live (a slow
    # first ORM query on a loaded machine); no handler may fail.
    assert "success" in statuses and statuses <= {"success", "skipped"}, statuses
