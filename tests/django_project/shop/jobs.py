"""The shop app's jobs: discovered by ``anarchon_django`` because the app is installed.

Without ``$ANARCHON_TEST_JOBS`` it defines two example jobs. The process tests set it
to a JSON list of ``{"name", "every", "sleep_s", "kind", "orm", "transactional"}``
specs (as in ``tests/multiprocess/worker.py``, whose handlers append to
``$ANARCHON_TEST_EVENTS``), and registers the target ``shop.report`` that stored
definitions run. A ``transactional`` job writes an ``auth.Group`` row named
``tx:SLOT:ATTEMPT:PID`` after its handler and emits ``written`` before the commit and
``committed`` once its transaction committed.
"""

from __future__ import annotations

import json
import os
from typing import Any

from anarchon_core import RunContext
from anarchon_django import scheduler

SPECS: list[dict[str, Any]] = json.loads(os.environ.get("ANARCHON_TEST_JOBS", "null") or "null")


def _orm_query() -> int:
    from django.contrib.contenttypes.models import ContentType

    return ContentType.objects.count()


def _define(spec: dict[str, Any]) -> None:
    from multiprocess.worker import make_handler

    inner = make_handler(os.environ["ANARCHON_TEST_EVENTS"], spec)
    if spec.get("transactional"):
        _define_transactional(spec, inner)
        return
    if not spec.get("orm"):
        scheduler.every(spec["name"], spec["every"], inner, **spec.get("options", {}))
        return
    if spec.get("kind") == "async":
        from asgiref.sync import sync_to_async

        async def with_orm_async(ctx: RunContext) -> None:
            await sync_to_async(_orm_query)()
            await inner(ctx)

        scheduler.every(spec["name"], spec["every"], with_orm_async, **spec.get("options", {}))
        return

    def with_orm(ctx: RunContext) -> None:
        _orm_query()
        inner(ctx)

    scheduler.every(spec["name"], spec["every"], with_orm, **spec.get("options", {}))


def _define_transactional(spec: dict[str, Any], inner: Any) -> None:
    from django.contrib.auth.models import Group
    from django.db import transaction
    from multiprocess.worker import emit

    events = os.environ["ANARCHON_TEST_EVENTS"]

    def write(ctx: RunContext) -> None:
        inner(ctx)
        fields = {"job": ctx.job, "slot": ctx.slot, "attempt": ctx.attempt, "pid": os.getpid()}
        Group.objects.create(name=f"tx:{ctx.slot}:{ctx.attempt}:{os.getpid()}")
        emit(events, e="written", **fields)
        transaction.on_commit(lambda: emit(events, e="committed", **fields))

    options = spec.get("options", {})
    scheduler.every(spec["name"], spec["every"], write, transactional=True, **options)


if SPECS is None:

    @scheduler.every("shop.sync", "10m", jitter_ms=2000)
    def sync_orders(ctx: RunContext) -> None:
        """Counts rows through the ORM: the connection is fresh in every run."""
        _orm_query()

    @scheduler.cron("shop.nightly", "0 3 * * *", tz="Europe/Athens", timeout_ms=3_600_000)
    def nightly(ctx: RunContext) -> None:
        pass

else:
    for _spec in SPECS:
        _define(_spec)

    @scheduler.target("shop.report")
    def report(ctx: RunContext, *args: Any, **kwargs: Any) -> None:
        """What stored definitions run in the process tests: queries the ORM, records."""
        from multiprocess.worker import emit

        _orm_query()
        emit(
            os.environ["ANARCHON_TEST_EVENTS"],
            e="start",
            job=ctx.job,
            slot=ctx.slot,
            attempt=ctx.attempt,
            instance=ctx.instance_id,
            args=list(args),
        )
