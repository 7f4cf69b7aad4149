"""The backup role: continue runs whose runner died, and retries that are due.

Every instance sweeps the store, in one batched call every one to two heartbeats, for
runs of any of its jobs whose lease expired or whose retry is due (not only slots it
lost), so that runs are taken over even after every original loser restarted.
"""

from __future__ import annotations

import asyncio
import random
import secrets

from ..backend import Backend, Claim, DueRun, Lease, TakeoverRequest
from ..job import MAX_MISFIRE_GRACE_MS, Job
from ..records import Origin, Outcome
from .claims import Claimer, store_now_at_most, won_leases
from .runner import Attempts
from .support import EngineConfig, EngineLog, retry_store

__all__ = ["Backups"]


class Backups:
    """Sweeps for runs to continue and takes them over."""

    def __init__(
        self,
        backend: Backend,
        config: EngineConfig,
        log: EngineLog,
        jobs: dict[str, Job],
        claimer: Claimer,
        attempts: Attempts,
    ) -> None:
        self.backend = backend
        self.config = config
        self.log = log
        self.jobs = jobs
        self.claimer = claimer
        self.attempts = attempts
        self.telemetry = config.telemetry

    async def sweep_loop(self) -> None:
        """Continue runs whose runner died or whose retry is due (any of our jobs)."""
        held = self.attempts.leases.held
        while True:
            await asyncio.sleep(self.config.heartbeat_ms * random.uniform(1, 2) / 1000)
            names = frozenset(self.jobs)  # stored definitions come and go
            try:
                due = await self.backend.due_runs(names)
            except Exception as exc:
                self.telemetry.store_error("sweep")
                self.log.warn("sweep failed: %s", exc)
                continue
            for run in due:
                if (run.job, run.slot) not in held and run.job in self.jobs:
                    await self.take_over(run)

    def _horizon(self, job: Job, run: DueRun) -> int:
        if run.origin == Origin.CATCH_UP:
            return job.options.catch_up_window_ms
        if run.origin == Origin.SCHEDULE:
            return job.horizon_ms(run.slot)
        return MAX_MISFIRE_GRACE_MS

    async def take_over(self, run: DueRun) -> None:
        """Claim the next attempt of ``run``; start it if won."""
        job = self.jobs.get(run.job)
        if job is None:  # its stored definition was removed meanwhile
            return
        horizon = self._horizon(job, run)
        request = TakeoverRequest(
            job=run.job,
            slot=run.slot,
            attempt=run.attempt,
            token=secrets.token_hex(16),
            instance_id=self.config.instance_id,
            lease_ms=self.config.lease_ms,
            horizon_ms=horizon,
            max_attempts=job.options.max_attempts,
            skip_overlap=job.options.overlap == "skip",
        )
        sent = asyncio.get_running_loop().time()  # the first send: self-fencing counts from it
        # Repeated with the same token after an ambiguous failure, it answers WON again
        # while the lease it started is live (LAPSED after).
        answer = await retry_store(
            lambda: self._timed_takeover(request),
            what="takeover",
            config=self.config,
            log=self.log,
            deadline=run.slot + horizon,
            job=job,
            slot=run.slot,
        )
        if answer is not None:
            self._settle(job, run, request, *answer, sent=sent)

    def _settle(
        self,
        job: Job,
        run: DueRun,
        request: TakeoverRequest,
        claim: Claim,
        latency: float,
        *,
        sent: float,
    ) -> None:
        """Act on a takeover's answer: start the attempt won (under the definition the
        takeover was sent with), log why anything else ran nothing."""
        horizon = request.horizon_ms
        self.telemetry.takeover(run.job, claim.outcome)
        if claim.outcome == Outcome.WON:
            what = "running a manual request" if run.reason == "manual" else "took over the run"
            self.log.info(
                what + ("" if run.reason == "manual" else f" ({run.reason})"),
                job=job,
                slot=run.slot,
                attempt=claim.attempt,
            )
            self.attempts.start(
                job,
                Lease(run.job, run.slot, claim.attempt, request.token),
                run.origin,
                0,
                sent=sent,
                horizon_end=run.slot + horizon,
                store_now=store_now_at_most(claim, latency),
            )
        elif claim.outcome == Outcome.LAPSED:
            self.log.warn(
                "not started: the takeover's lease lapsed first",
                job=job,
                slot=run.slot,
                attempt=run.attempt + 1,
            )
        elif claim.outcome in (Outcome.EXHAUSTED, Outcome.EXPIRED):
            why = "max_attempts reached" if claim.outcome == Outcome.EXHAUSTED else "too late"
            self.log.warn(
                "run ended interrupted: %s", why, job=job, slot=run.slot, attempt=run.attempt
            )

    async def _timed_takeover(self, request: TakeoverRequest) -> tuple[Claim, float]:
        """The takeover's answer and its round trip (loop time, seconds)."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        answer = await self.claimer.uncut(
            self.backend.take_over(request), lambda c: won_leases([request], [c])
        )
        return answer, loop.time() - began
