"""``transactional=True``: the handler's writes and the run's outcome commit as one.

The wrapped handler is called here as the engine calls it (a ``RunContext`` holding a
lease the ORM store granted), on the test database, so that what is asserted is what
the database holds afterwards: the handler's rows and the store's record, together or
neither. The handlers write ``auth.Group`` rows (a migrated table of the project).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group
from processes import starts
from procs import cluster

from anarchon_core.backend import ClaimRequest, Lease, TakeoverRequest
from anarchon_core.context import RunContext
from anarchon_core.records import HistoryQuery, Origin, Outcome, Status
from anarchon_django._scheduler import DjangoScheduler, JobDefinitionError
from anarchon_django._transactional import AttemptFenced, transactional
from anarchon_django.backend import DjangoBackend

JOB = "tx.job"
SLOT = (time.time_ns() // 1_000_000 // 1000) * 1000


def claim(runner: asyncio.Runner, backend: DjangoBackend, *, lease_ms: int = 60_000) -> Lease:
    request = ClaimRequest(
        job=JOB,
        slot=SLOT,
        origin=Origin.SCHEDULE,
        token="first-token",
        instance_id=f"host:{os.getpid()}:aaaaaa",
        lease_ms=lease_ms,
        horizon_ms=600_000,
        skip_overlap=True,
    )
    won = runner.run(backend.claim(request))
    assert won.outcome == Outcome.WON
    return Lease(JOB, SLOT, won.attempt, request.token)


def context(runner: asyncio.Runner, lease: Lease | None) -> RunContext:
    return RunContext(
        job=JOB,
        slot=SLOT,
        attempt=lease.attempt if lease else 1,
        instance_id="test",
        origin=Origin.SCHEDULE,
        loop=runner.get_loop(),
        logger=logging.getLogger("anarchon"),
        lease=lease,
    )


def writing(name: str, *, then: Callable[[], Any] | None = None) -> Callable[[RunContext], str]:
    def handler(ctx: RunContext) -> str:
        Group.objects.create(name=name)
        ctx.meta["wrote"] = name
        if then is not None:
            then()
        return name

    return handler


def records(runner: asyncio.Runner, backend: DjangoBackend) -> dict[int, Status]:
    found = runner.run(backend.history(HistoryQuery(job=JOB)))
    return {r.attempt: r.status for r in found if r.slot == SLOT}


def test_writes_and_outcome_commit_together(runner: asyncio.Runner, backend: DjangoBackend) -> None:
    lease = claim(runner, backend)
    ctx = context(runner, lease)
    assert transactional(writing("committed"), "default", lambda: backend)(ctx) == "committed"
    assert Group.objects.filter(name="committed").exists()
    assert records(runner, backend) == {1: Status.SUCCESS}
    assert ctx.recorded
    # The engine's own finish afterwards repeats the recorded outcome: accepted.
    assert runner.run(backend.finish(lease, Status.SUCCESS, meta=ctx.meta))
    meta = next(r.meta for r in runner.run(backend.history(HistoryQuery(job=JOB))))
    assert meta == {"wrote": "committed"}


def test_a_taken_over_attempt_commits_nothing(
    runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    stale = claim(runner, backend, lease_ms=200)
    time.sleep(0.4)  # the lease expires; a backup takes the run over (attempt 2)
    takeover = TakeoverRequest(
        job=JOB,
        slot=SLOT,
        attempt=1,
        token="backup-token",
        instance_id="backup",
        lease_ms=60_000,
        horizon_ms=600_000,
        max_attempts=3,
        skip_overlap=True,
    )
    taken = runner.run(backend.take_over(takeover))
    assert taken.outcome == Outcome.WON and taken.attempt == 2
    backup = Lease(JOB, SLOT, 2, takeover.token)
    ctx = context(runner, stale)
    with pytest.raises(AttemptFenced, match="rolled back"):
        transactional(writing("stale"), "default", lambda: backend)(ctx)
    assert not Group.objects.filter(name="stale").exists()
    assert not ctx.recorded
    # The backup's own transaction commits, and its record is the run's outcome.
    assert (
        transactional(writing("backup"), "default", lambda: backend)(context(runner, backup))
        == "backup"
    )
    assert Group.objects.filter(name="backup").exists()
    assert records(runner, backend) == {1: Status.INTERRUPTED, 2: Status.SUCCESS}


def test_a_cancelled_run_commits_nothing(runner: asyncio.Runner, backend: DjangoBackend) -> None:
    lease = claim(runner, backend)
    assert runner.run(backend.cancel(JOB, SLOT))
    with pytest.raises(AttemptFenced):
        transactional(writing("cancelled"), "default", lambda: backend)(context(runner, lease))
    assert not Group.objects.filter(name="cancelled").exists()
    assert records(runner, backend) == {1: Status.CANCELLED}


def test_a_handler_that_raises_rolls_back_and_leaves_the_outcome_to_the_engine(
    runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    lease = claim(runner, backend)

    def boom() -> None:
        raise RuntimeError("boom")

    ctx = context(runner, lease)
    with pytest.raises(RuntimeError, match="boom"):
        transactional(writing("raised", then=boom), "default", lambda: backend)(ctx)
    assert not Group.objects.filter(name="raised").exists()
    assert records(runner, backend) == {1: Status.RUNNING} and not ctx.recorded
    assert runner.run(backend.finish(lease, Status.FAILED, error="boom"))


def test_without_a_lease_the_handler_still_runs_in_one_transaction(
    runner: asyncio.Runner, backend: DjangoBackend
) -> None:
    """``run_once`` and other callers without a store: atomic, nothing recorded."""
    ctx = context(runner, None)
    assert transactional(writing("alone"), "default", lambda: backend)(ctx) == "alone"
    assert Group.objects.filter(name="alone").exists() and not ctx.recorded


# -- definitions ---------------------------------------------------------------------------
def test_definitions_accept_transactional_on_the_orm_store() -> None:
    scheduler = DjangoScheduler("django://default")

    @scheduler.every("tx.every", "1m", transactional=True)
    def every(ctx: RunContext) -> None: ...

    scheduler.cron("tx.cron", "0 3 * * *", every, tz="UTC", transactional=True)
    scheduler.every("tx.plain", "1m", every, transactional=False)
    assert set(scheduler.jobs) == {"tx.every", "tx.cron", "tx.plain"}


@pytest.mark.parametrize(
    ("url", "handler", "value", "message"),
    [
        ("redis://127.0.0.1:6379/0", "sync", True, "needs the ORM store"),
        ("sqlite:///x.db", "sync", True, "the store here is sqlite://"),
        ("django://default", "async", True, "needs a sync handler"),
        ("django://default", "sync", "yes", "transactional = 'yes' is not valid: give True"),
    ],
)
def test_bad_transactional_definitions_name_the_problem(
    url: str, handler: str, value: object, message: str
) -> None:
    scheduler = DjangoScheduler(url)

    def sync(ctx: RunContext) -> None: ...

    async def run_async(ctx: RunContext) -> None: ...

    fn = sync if handler == "sync" else run_async
    with pytest.raises(JobDefinitionError, match=message) as decorated:
        scheduler.every("tx.bad", "1m", transactional=value)(fn)
    with pytest.raises(JobDefinitionError, match=message) as direct:
        scheduler.every("tx.bad", "1m", fn, transactional=value)
    assert decorated.value.check_id == direct.value.check_id == "anarchon.E015"


# -- real processes --------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_fenced_runner_process_commits_nothing(tmp_path: Path) -> None:
    """SIGSTOP the runner mid-handler: a backup takes the run over (attempt 2) and commits;
    resumed, the stale runner writes, is refused by the store, and its writes roll back."""
    import signal

    jobs = [{"name": "tx", "every": "4s", "stubborn_s": 1.0, "transactional": True}]
    with cluster(tmp_path, "django://default", jobs, LEASE_MS=600, HEARTBEAT_MS=200) as c:
        c.start_all(3)
        started = time.time()
        first = c.wait_for(
            lambda ev: [e for e in starts(ev, "tx") if e["t"] > started + 1], 12, "a run"
        )[0]  # not the first slot: the instances' start-up writes are over by then
        frozen = c.instance_of(first["pid"])
        c.freeze(frozen, "tx", first["slot"])
        c.wait_for(
            lambda ev: [e for e in starts(ev, "tx") if e["slot"] == first["slot"]][1:],
            8,
            "the takeover",
        )
        c.wait_for(
            lambda ev: [e for e in ev if e["e"] == "committed" and e["slot"] == first["slot"]],
            8,
            "the backup's commit",
        )
        c.signal(frozen, signal.SIGCONT)
        c.wait_for(
            lambda ev: [e for e in ev if e["e"] == "written" and e["pid"] == first["pid"]],
            8,
            "the stale runner's write",
        )
        time.sleep(1.0)  # its finish is refused and the transaction rolls back
        stale_log = c.log_path(frozen).read_text()
        c.stop_all()
        events = c.events()
    committed = [e for e in events if e["e"] == "committed"]
    assert [e["attempt"] for e in committed if e["slot"] == first["slot"]] == [2]
    assert not [e for e in committed if e["pid"] == first["pid"] and e["slot"] == first["slot"]]
    assert "Traceback" not in stale_log
    rows = Group.objects.filter(name__startswith=f"tx:{first['slot']}:")
    names = list(rows.values_list("name", flat=True))
    assert len(names) == 1 and names[0].split(":")[2] == "2", names
    assert names[0].split(":")[3] != str(first["pid"])
    # Every run that committed wrote exactly one row, and every row is a committed run's.
    written = sorted(Group.objects.filter(name__startswith="tx:").values_list("name", flat=True))
    assert written == sorted(f"tx:{e['slot']}:{e['attempt']}:{e['pid']}" for e in committed)
