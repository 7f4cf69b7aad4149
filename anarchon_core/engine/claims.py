"""Claims sent in batches, and what their answers start.

The runs due together leave as one ``claim_many`` request (one ``claim`` for a single
run). A lost reply is retried with the same tokens; each attempt's self-fence deadline
counts from its first send, because the store may have started the lease then. A stop
that cuts off a caller does not cut off its request: the answer is read and whatever it
won is given back (:meth:`Claimer.give_back_cut_requests`). The first fast answer of
each request samples the clock skew (store − local).
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..backend import EARLY_TOLERANCE_MS, Backend, Claim, ClaimRequest, Lease, TakeoverRequest
from ..job import Job
from ..records import Origin, Outcome
from .runner import Attempts, BeforeStart
from .support import EngineConfig, EngineLog, retry_store

__all__ = ["Claimer", "PendingClaim", "store_now_at_most", "won_leases"]

T = TypeVar("T")

#: Skew is sampled only from claims answered this fast.
SKEW_SAMPLE_MAX_RTT_MS = 100
#: A change of the measured skew by this much is logged again.
SKEW_LOG_STEP_MS = 1000
#: How long stop() waits for the answers of claims and takeovers in flight, to give
#: back what they won (a request still unanswered then leaves its lease to expire).
STOP_REQUEST_WAIT_S = 2.0


@dataclass(slots=True)
class PendingClaim:
    """A run this instance is about to claim, and the token it claims it with."""

    job: Job
    slot: int
    origin: Origin
    horizon: int
    jitter: int
    """How long after the slot the claim left (``ctx.jitter_ms``)."""
    skip_overlap: bool
    before: BeforeStart | None = None
    """Awaited before the handler starts if won (see :meth:`Attempts.start`)."""
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    sent: float | None = None
    """When (loop time) the current token was first sent: self-fencing counts from it."""

    def request(self, instance_id: str, lease_ms: int) -> ClaimRequest:
        return ClaimRequest(
            job=self.job.store_name,
            slot=self.slot,
            origin=self.origin,
            token=self.token,
            instance_id=instance_id,
            lease_ms=lease_ms,
            horizon_ms=self.horizon,
            skip_overlap=self.skip_overlap,
            fingerprint=self.job.fingerprint,
            version=self.job.version,
        )


class Claimer:
    """Sends claims and starts what they win."""

    def __init__(
        self, backend: Backend, config: EngineConfig, log: EngineLog, attempts: Attempts
    ) -> None:
        self.backend = backend
        self.config = config
        self.log = log
        self.attempts = attempts
        self.telemetry = config.telemetry
        self.skew_ms = 0
        self._logged_skew: int | None = None
        self._lease = backend.capabilities.lease
        #: Claims and takeovers in flight, each with how to read the leases its answer
        #: won: a stop that cuts off their caller gives those leases back.
        self._requests: dict[asyncio.Future[Any], Callable[[Any], list[Lease]]] = {}
        #: Called when a claim is answered ``STALE``: this instance planned with a
        #: definition the store no longer holds, so it reads the changes at once.
        self.on_stale: Callable[[], None] = lambda: None

    async def claim_runs(self, runs: list[PendingClaim]) -> list[asyncio.Task[Any] | None]:
        """Claim runs in one store request; start the won ones. One task (or ``None``)
        per run, in order.

        Once the earliest horizon of the batch has passed, its runs are abandoned and
        the rest retried. On a lease store an answer ``EARLY`` wrote nothing, so a claim
        sent again at the slot is a new one, with a new token (a late copy of the first
        can then never pass for it and its lease). A claim-only store may keep an early
        claim (a stream entry) and recognise the same token at the slot.
        """
        loop = asyncio.get_running_loop()
        tasks: dict[int, asyncio.Task[Any] | None] = {}
        pending = runs
        while pending:
            for run in pending:
                if run.sent is None:
                    run.sent = loop.time()
            answer = await self._send(pending)
            if answer is None:  # the earliest horizon passed: the later ones are retried
                cutoff = max(min(r.slot + r.horizon for r in pending), self.config.clock())
                for run in pending:
                    if run.slot + run.horizon <= cutoff:
                        self.telemetry.claim(run.job.store_name, Outcome.EXPIRED, None)
                        tasks[id(run)] = self._settle(run, Claim(Outcome.EXPIRED), None)
                pending = [r for r in pending if id(r) not in tasks]
                continue
            claims, latency = answer
            early, wait = [], 10
            for run, claim in zip(pending, claims, strict=True):
                self.telemetry.claim(run.job.store_name, claim.outcome, latency)
                if claim.outcome == Outcome.EARLY:
                    early.append(run)
                    wait = max(run.slot - (claim.store_now or run.slot), wait)
                else:
                    tasks[id(run)] = self._settle(run, claim, latency)
            pending = early
            if early:
                for run in early:
                    run.sent = None
                    if self._lease:
                        run.token = secrets.token_hex(16)
                await asyncio.sleep(wait / 1000)
        return [tasks[id(run)] for run in runs]

    async def _send(self, pending: list[PendingClaim]) -> tuple[list[Claim], float] | None:
        """The answers to ``pending``'s claims, retried until the earliest horizon."""
        requests = [r.request(self.config.instance_id, self.config.lease_ms) for r in pending]
        single = pending[0] if len(pending) == 1 else None
        return await retry_store(
            functools.partial(self._timed_claims, requests),
            what="claim",
            config=self.config,
            log=self.log,
            deadline=min(r.slot + r.horizon for r in pending),
            job=single.job if single else None,
            slot=single.slot if single else None,
        )

    def _settle(
        self, run: PendingClaim, claim: Claim, latency: float | None
    ) -> asyncio.Task[Any] | None:
        """Act on a claim's answer: start a won attempt, log why anything else ran nothing."""
        job, slot = run.job, run.slot
        if claim.outcome == Outcome.WON:
            assert run.sent is not None
            lease = Lease(job.store_name, slot, claim.attempt, run.token)
            return self.attempts.start(
                job,
                lease,
                run.origin,
                run.jitter,
                sent=run.sent,
                horizon_end=slot + run.horizon,
                store_now=store_now_at_most(claim, latency),
                before=run.before,
            )
        if claim.outcome in (Outcome.SKIPPED, Outcome.PAUSED):
            self.log.info("slot %s", claim.outcome, job=job, slot=slot)
        elif claim.outcome == Outcome.STALE:
            self.log.info(
                "slot not claimed: the job's definition changed in the store (version %s "
                "is gone); reading the change",
                job.version,
                job=job,
                slot=slot,
            )
            self.on_stale()
        elif claim.outcome == Outcome.EXPIRED:
            self.log.warn("slot abandoned: claimed past its horizon", job=job, slot=slot)
        elif claim.outcome == Outcome.LAPSED:
            self.log.warn(
                "not started: the claim's lease lapsed before its answer",
                job=job,
                slot=slot,
                attempt=1,
            )
        return None

    async def _timed_claims(self, requests: list[ClaimRequest]) -> tuple[list[Claim], float]:
        """The claims' answers and their round trip in seconds, sampling the skew
        (store − local) from the first answer.

        A slow answer (a pool wait, a reconnect) says nothing about the clocks: its
        midpoint could be seconds off, so such samples are dropped.
        """
        loop = asyncio.get_running_loop()
        sent, sent_at = self.config.clock(), loop.time()
        call = (
            _listed(self.backend.claim(requests[0]))
            if len(requests) == 1
            else self.backend.claim_many(requests)
        )
        claims = await self.uncut(call, functools.partial(won_leases, requests))
        latency = loop.time() - sent_at
        received = self.config.clock()
        first = claims[0].store_now if claims else None
        if (
            first is not None
            and self.backend.capabilities.store_clock
            and received - sent <= SKEW_SAMPLE_MAX_RTT_MS
        ):
            self._observe_skew(first - (sent + received) // 2)
        return claims, latency

    def _observe_skew(self, sample: int) -> None:
        """Keep the latest skew (store − local); log it at first and when it moves by 1 s.

        Past :data:`EARLY_TOLERANCE_MS` it is a warning: a clock that far ahead has its
        claims refused as early (and sent again at the slot), and one that far behind
        claims late, up to missing slots whose horizon is shorter than the skew.
        """
        if self._logged_skew is None or abs(sample - self._logged_skew) >= SKEW_LOG_STEP_MS:
            if abs(sample) > EARLY_TOLERANCE_MS:
                self.log.warn(
                    "store clock skew %+d ms (store − local) is over %d ms: fix this host's "
                    "clock (NTP); its claims are early or late by that much",
                    sample,
                    EARLY_TOLERANCE_MS,
                )
            else:
                self.log.info("store clock skew %+d ms (store − local)", sample)
            self._logged_skew = sample
        self.skew_ms = sample
        self.telemetry.skew(sample)

    # -- requests a stop may cut off ------------------------------------------------------
    async def uncut(self, call: Awaitable[T], won: Callable[[T], list[Lease]]) -> T:
        """Await a store request that may start leases; a stop that cancels the caller
        does not cut the request off: it reads the answer and gives ``won(answer)``
        back (see :meth:`give_back_cut_requests`)."""
        request = asyncio.ensure_future(call)
        self._requests[request] = won
        await asyncio.wait({request})  # a cancel: the stop reads the answer
        self._requests.pop(request, None)
        return request.result()

    async def give_back_cut_requests(self, jobs: dict[str, Job]) -> set[asyncio.Future[Any]]:
        """Wait briefly for the claims and takeovers whose callers the stop cancelled,
        and release what they won: nothing here will run it, and a won lease left to
        expire would block its run, and the job's next slots, for a whole lease. Returns
        the requests still unanswered (cancelled: their leases, if any, expire)."""
        requests, self._requests = self._requests, {}
        if not requests:
            return set()
        done, pending = await asyncio.wait(requests, timeout=STOP_REQUEST_WAIT_S)
        for request in pending:
            request.cancel()
        won = [
            lease
            for request in done
            if not request.cancelled() and request.exception() is None
            for lease in requests[request](request.result())
        ]
        # A job whose stored definition was removed meanwhile is not given back: its
        # lease expires on its own.
        won = [lease for lease in won if lease.job in jobs]
        if self._lease:
            await self.attempts.give_back([(jobs[lease.job], lease) for lease in won])
        else:  # a claim-only store has no takeover: the run is not run
            for lease in won:
                self.log.warn("won while stopping: not run", job=jobs[lease.job], slot=lease.slot)
        return pending


async def _listed(call: Awaitable[T]) -> list[T]:
    return [await call]


def won_leases(
    requests: Sequence[ClaimRequest | TakeoverRequest], claims: Sequence[Claim]
) -> list[Lease]:
    """The leases that ``claims``, the answers to ``requests``, won."""
    return [
        Lease(request.job, request.slot, claim.attempt, request.token)
        for request, claim in zip(requests, claims, strict=True)
        if claim.outcome == Outcome.WON
    ]


def store_now_at_most(claim: Claim, latency: float | None) -> int | None:
    """The store's clock now, at the latest: the answer was decided at ``store_now``,
    within the round trip just measured (``None`` where the store gives no time)."""
    if claim.store_now is None:
        return None
    return claim.store_now + round((latency or 0.0) * 1000)
