"""Services that share a store prune only their own history.

Each scheduler's retention (``history_retention``, the horizons) is about its own jobs:
the engine passes them to ``Backend.prune(jobs=...)``, so another service's records
(or this service's records under another namespace) are never deleted by it.
"""

from __future__ import annotations

import asyncio
import secrets

from virtual import run_virtual, store_clock

from anarchon_core import RunContext, Scheduler
from anarchon_core.backend import ClaimRequest, Lease
from anarchon_core.backends.memory import MemoryBackend
from anarchon_core.records import HistoryQuery, Origin, Status

HOUR = 3_600_000


async def nothing(ctx: RunContext) -> None:
    """A handler that is never due during the test."""


async def finished(backend: MemoryBackend, job: str, slot: int) -> None:
    token = secrets.token_hex(4)
    request = ClaimRequest(job, slot, Origin.SCHEDULE, token, "old:1:aaaaaa", 60_000,
                           horizon_ms=10**9, skip_overlap=False)  # fmt: skip
    assert (await backend.claim(request)).outcome == "won"
    assert await backend.finish(Lease(job, slot, 1, token), Status.SUCCESS)


def test_an_instance_prunes_only_its_own_jobs() -> None:
    async def main() -> dict[str, int]:
        backend = MemoryBackend(clock=store_clock())
        now = await backend.now_ms()
        # Old finished history (well past any retention) of three jobs in one store.
        for job in ("billing:report", "shop:report", "billing:gone"):
            for hours in (100, 80, 60):
                await finished(backend, job, now - hours * HOUR)
        billing = Scheduler(
            backend,
            namespace="billing",
            instance_id="billing-1",
            history_retention="1h",  # records are kept 25 h: the catch-up window + 1 h
            clock=store_clock(),
        )
        billing.every("report", "1d", nothing)
        await billing.start()
        await asyncio.sleep(120)  # the first prune comes 10-60 s after start
        await billing.stop()
        counts: dict[str, int] = {}
        for record in await backend.history(HistoryQuery(limit=100)):
            counts[record.job] = counts.get(record.job, 0) + 1
        return counts

    assert run_virtual(main) == {
        "billing:report": 1,  # its own job: pruned down to the latest record
        "billing:gone": 3,  # not a job of this instance (any more): left alone
        "shop:report": 3,  # another service's job: left alone
    }
