"""Deployments, not one service: services, rolling deploys, stops and clock steps on one store.

The fault simulation (``tests/simulation.py``) runs one service whose instances hold the
same jobs and die only by crashing. This one runs the cluster an operator runs, on one
in-memory store and virtual time (``tests/virtual.py``); one seed decides everything.

The model
---------
- **Services.** 2–3 services (namespaces ``alpha``, ``beta``, ``gamma``) share the store,
  each with its own jobs (job names repeat across services: the namespace keeps them
  apart), 2–3 replicas, ``candidates`` (1, 2 or every instance), ``jitter_ms`` (0, 100
  or 500) and ``lease_ms`` (300, 600 or 1000; heartbeats every 100 ms). One service in
  three is *busy*: four replicas, one or two candidates, 1 s leases, and one job whose
  runs last three intervals (``overlap="allow"``), so that its replicas seldom idle.
  Each job draws its interval (250 ms–2 s), its handler's time (5 %–150 % of the
  interval), ``misfire_grace_ms`` (the default, 200 or 300 ms: never under two
  heartbeats), ``catch_up`` and ``overlap``.
- **Versions.** Each service has three versions of its job list; each next one adds a
  job, removes one, changes one's interval or changes its options (the third may bring
  back a job the second removed, with its catch-up).
- **Stories.** Each service lives through 1–3 of: a rolling deploy to its next version
  (one replica at a time: the new one starts, runs beside the old one for 50–400 ms, then
  the old one leaves by a graceful ``stop(grace_ms)`` with a grace of 0–500 ms, or by a
  crash one time in five), a restart of one replica (graceful or crash), a crash with a
  replacement later, a scale-down to one replica while runs are in flight (the busy
  replicas stop gracefully together, graces of 0.2–1 s; back 0.4–1 s later), and an
  outage (every replica down, graceful or crash, back 0.4–1.2 s later, sometimes on the
  next version: catch-up work). A crash is a SIGKILL: handlers end at once and the link
  is cut for good.
- **Clocks.** Every host's clock is off by up to ±30 ms. 0–2 clock incidents step one
  replica's clock forward or back by 0.4 s, 3 s, 1 min or 1 h and step it back after
  0.3–1.2 s (the correction: a step the other way).
- **Store hiccups.** Per seed, finish writes fail before they are sent with probability
  0, 0.1 or 0.3 (each retried by the engine); nothing else fails. No link is cut except
  a crashed replica's.
- Story actions start between 0.3 s and 2 s; a calm of 0.5 s (and one lease after the
  last crash, for its takeover) follows, then every replica stops gracefully: about
  3.5 s in all. Times are the store's clock (the truth).

The judge
---------
:func:`simulate` returns a :class:`Report`; it is broken when

- (a) ``rerun``: a handler that ran to the end (returned) for a run, and the same run
  executed again afterwards;
- (b) ``concurrent``: two attempts of one run executed at once;
- (c) ``missed``: a slot nothing ran (no execution, no ``skipped``/``paused`` record)
  although a replica holding the job, with a schedule that has that slot, was up, not
  stopping, with a correct clock (within 50 ms) from a lease before the slot through its
  horizon. During a deploy that changes a job's interval, the old grid's slots are owed
  only while an old replica qualifies, the new grid's only while a new one does;
- (d) ``untrue``: history that disagrees with what ran: ``interrupted`` for an attempt
  whose handler returned, ``success`` for one whose handler did not, an attempt that ran
  with no record or under another instance's name, a run left ``running``;
- (e) ``late``: a handler started past its slot's horizon (``misfire_grace_ms``, else
  the interval; the catch-up window for catch-up runs);
- (f) ``overlap``: with ``overlap="skip"``, a run started while another run of the job
  was executing (catch-up runs are exempt from skipping each other only): §8 *one live
  run per job*, §10 *catch-up keeps the overlap rule*;
- (g) ``flood``: after a forward step of its clock, an instance logged more than one
  warning about one job naming slots that step left past their horizon (§10: the slot
  loop skips to the slots still claimable and reports the skipped ones once per job).

Narrowed where the engine cannot do better (each narrowing is as tight as the protocol):

- (a) and the ``interrupted`` rule of (d) do not count an attempt whose instance crashed
  (SIGKILL, link cut) within 1 s after its handler returned: the finish may not have
  landed, and the store cannot know the handler ran. A graceful stop is no excuse.
- (d) does not count a record left ``running`` whose runner stopped while the store
  kept failing its finish (finish faults on): the engine resends the finish through the
  grace and one lease, then leaves the lease to expire as after a crash; a backup ends
  the run unless no replica holding the job outlives that expiry.
- (c) does not count a slot of a job when a replica holding that job (any version)
  crashed, or had a wrong clock, within the liveness bound (lease + 2 heartbeats) before
  the slot through its horizon: survivors rank such a replica until it leaves the
  registry (one lease after its last refresh), and only then claim the slots it was
  ranked for. Graceful stops and deploys get no such allowance (§10: a stopping instance
  leaves the ranking as soon as its slot loop ends).
- (c) owes nothing for a slot shortly after a graceful stop either, but needs no rule
  for it: survivors read the registry every heartbeat, and every horizon is at least
  two heartbeats, so a stopper that leaves the ranking at once costs no slot.
- (d) does not count a run left ``running`` whose runner crashed when no replica holding
  its job stayed up long enough after the lease expired to end it (the job had left
  every version still running).
- (g) counts only warnings that name a slot and no attempt: a summary with a count may
  name none, and a run's own warnings (a finish retried) are not about skipped slots.

Virtual time cannot show one thing: a slot loop that replays a long backlog costs CPU,
not virtual time, so the lateness that follows (issue 27's "first run 11 s late") is
visible here only as the flood of warnings (g).

``ANARCHON_DEPLOY_SEED=S`` replays one seed, and its failure prints the whole timeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace

from virtual import BASE_MS, Execution, Recorder, run_virtual

from anarchon_core import MemoryBackend, RunContext, Scheduler
from anarchon_core.backend import InstanceInfo
from anarchon_core.records import HistoryQuery, RunRecord, Status
from anarchon_core.testing import Faults, FaultyBackend, LoopClock

HEARTBEAT_MS = 100
#: Each service's lease: 3 heartbeats (the default), 6 or 10.
LEASES_MS = (300, 300, 600, 1000)
#: A host clock this close to the store's counts as correct.
CLOCK_TOLERANCE_MS = 50
#: Every host's clock is off by up to this much.
SKEW_MS = 30
#: A crash this soon after a handler returned may have kept its finish from landing.
FINISH_LANDS_MS = 1000
#: The engine sends no claim for a slot this far past its horizon by the local clock.
HORIZON_MARGIN_MS = 1000
CATCH_UP_WINDOW_MS = 86_400_000
MAX_MISFIRE_GRACE_MS = 3_600_000
STORIES_FROM_S = 0.3
STORIES_UNTIL_S = 2.0
#: The last story action starts before STORIES_UNTIL_S; a calm of at least CALM_S
#: follows the last one, and the run ends at END_S at the earliest.
CALM_S = 0.5
END_S = 3.0
FINAL_GRACE_MS = 500
NAMESPACES = ("alpha", "beta", "gamma")
JOB_NAMES = ("sync", "report", "mail", "purge", "index", "audit")
INTERVALS_MS = (250, 500, 500, 1000, 1000, 2000)
CLOCK_STEPS_MS = (400, 3_000, 60_000, 3_600_000)
#: What happens to a service, drawn 1–3 times.
PLOTS = ("deploy", "deploy", "restart", "crash", "scale", "outage")


def at(ms: int | float | None) -> str:
    """A store time as seconds since the simulation began."""
    return "-" if ms is None else f"{(ms - BASE_MS) / 1000:.3f}s"


@dataclass(frozen=True)
class JobDef:
    """One version of a job's definition."""

    name: str
    every_ms: int
    work_ms: int
    misfire_grace_ms: int | None
    catch_up: str
    overlap: str

    def horizon_ms(self, origin: str = "schedule") -> int:
        if origin == "catch_up":
            return CATCH_UP_WINDOW_MS
        if self.misfire_grace_ms is not None:
            return self.misfire_grace_ms
        return min(self.every_ms, MAX_MISFIRE_GRACE_MS)

    def __str__(self) -> str:
        grace = "" if self.misfire_grace_ms is None else f" grace={self.misfire_grace_ms}"
        return (
            f"{self.name}/{self.every_ms}ms work={self.work_ms}{grace} "
            f"catch_up={self.catch_up} overlap={self.overlap}"
        )


@dataclass(kw_only=True)
class Run(Execution):
    """An execution with the origin of its run."""

    origin: str = "schedule"


@dataclass
class DeployRecorder(Recorder):
    def job_handler(self, job: str, work_ms: int) -> Callable[[RunContext], Awaitable[None]]:
        """A handler that works ``work_ms`` and stops when cancelled; it records its run
        under the store's name of the job (``namespace:name``)."""

        async def handle(ctx: RunContext) -> None:
            run = Run(job, ctx.slot, ctx.attempt, ctx.instance_id, self.clock())
            run.origin = str(ctx.origin)
            self.executions.append(run)
            try:
                await asyncio.sleep(work_ms / 1000)
                run.completed = ctx.instance_id not in self.dead
            except asyncio.CancelledError:
                run.told_to_stop_at = self.clock()
                raise
            finally:
                if run.end is None:  # else its instance was killed: it ended then
                    run.end = self.clock()

        return handle


@dataclass
class Replica:
    name: str
    service: str
    version: int
    jobs: dict[str, JobDef]  # by store name
    clock: LoopClock
    link: FaultyBackend
    scheduler: Scheduler
    lease_ms: int
    started: int = 0
    stopping: int | None = None
    grace_ms: int | None = None
    crashed: int | None = None
    #: Spans (store ms) when its clock was off by more than the tolerance.
    wrong: list[tuple[int, float]] = field(default_factory=list)
    #: Forward steps of its clock: (store ms, local ms before, local ms after).
    forward: list[tuple[int, int, int]] = field(default_factory=list)
    #: When its clock stepped (either way), store ms.
    steps: list[int] = field(default_factory=list)

    @property
    def liveness_ms(self) -> int:
        """How long survivors may rank it after it died: it leaves the registry one lease
        after its last refresh, and they read the registry once per heartbeat."""
        return self.lease_ms + 2 * HEARTBEAT_MS

    @property
    def gone(self) -> float:
        """When it stopped claiming (stop or crash), store ms; inf while it runs."""
        ends = [t for t in (self.stopping, self.crashed) if t is not None]
        return min(ends) if ends else float("inf")

    def impaired(self, start: float, end: float) -> bool:
        """Its clock was wrong at some time in [start, end]."""
        return any(lo <= end and start <= hi for lo, hi in self.wrong)


@dataclass
class Service:
    namespace: str
    candidates: int | None
    jitter_ms: int
    lease_ms: int
    size: int
    versions: list[dict[str, JobDef]]  # by short name
    busy: bool = False
    live: list[Replica] = field(default_factory=list)
    version: int = 0
    launched: int = 0


@dataclass(frozen=True)
class LogLine:
    time: int | None
    instance: str | None
    job: str | None
    slot: int | None
    attempt: int | None
    message: str


class _Warnings(logging.Handler):
    """Keeps the engine's warnings, stamped with the store's time."""

    def __init__(self, clock: LoopClock) -> None:
        super().__init__(logging.WARNING)
        self.clock = clock
        self.lines: list[LogLine] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            now: int | None = self.clock()
        except RuntimeError:  # no running loop
            now = None
        self.lines.append(
            LogLine(
                now,
                getattr(record, "instance", None),
                getattr(record, "job", None),
                getattr(record, "slot", None),
                getattr(record, "attempt", None),
                str(record.msg),
            )
        )


@contextlib.contextmanager
def _captured_warnings(clock: LoopClock) -> Iterator[_Warnings]:
    """The engine's warnings go to the judge only (not to the test's log capture)."""
    engine = logging.getLogger("anarchon")
    handler = _Warnings(clock)
    level, propagate = engine.level, engine.propagate
    engine.setLevel(logging.WARNING)
    engine.propagate = False
    engine.addHandler(handler)
    try:
        yield handler
    finally:
        engine.removeHandler(handler)
        engine.setLevel(level)
        engine.propagate = propagate


class Store(MemoryBackend):
    """The in-memory store, decoding each registry entry once for all its readers.

    Every replica reads the whole registry once per heartbeat, and each entry changes
    (its ``last_seen``) once per heartbeat: decoding it for every reader was a sixth of
    a seed's time. The readers of one version of an entry share its (frozen) info and
    its ``jobs``, which the engine only reads. (It reads the registry that
    :class:`MemoryBackend` keeps as JSON text.)
    """

    def __init__(self, *, clock: Callable[[], int]) -> None:
        super().__init__(clock=clock)
        self._decoded: dict[str, tuple[str, InstanceInfo]] = {}

    async def instances(self) -> list[InstanceInfo]:
        now = self._clock()
        for dead in [key for key, (_, expires) in self._instances.items() if expires <= now]:
            del self._instances[dead]
        infos = []
        for key, (text, _) in sorted(self._instances.items()):
            known = self._decoded.get(key)
            if known is None or known[0] is not text:
                known = self._decoded[key] = (text, InstanceInfo.from_json(json.loads(text)))
            infos.append(known[1])
        return infos


@dataclass
class Report:
    seed: int
    rerun: list[str] = field(default_factory=list)
    concurrent: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    untrue: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)
    overlap: list[str] = field(default_factory=list)
    flood: list[str] = field(default_factory=list)
    #: What the seed did, for the test's "the model really happened" checks.
    counts: Counter[str] = field(default_factory=Counter)
    #: Slots owed and the slots excused (a holder crashed or had a wrong clock).
    owed: int = 0
    excused: int = 0
    timeline: list[tuple[int, str]] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)

    RULES = ("rerun", "concurrent", "missed", "untrue", "late", "overlap", "flood")

    @property
    def broken(self) -> bool:
        return any(getattr(self, rule) for rule in self.RULES)

    @property
    def broken_rules(self) -> list[str]:
        return [rule for rule in self.RULES if getattr(self, rule)]

    def explain(self, limit: int = 6, timeline: bool = False) -> str:
        lines = [f"seed {self.seed} (replay: ANARCHON_DEPLOY_SEED={self.seed})"]
        for rule in self.RULES:
            found = getattr(self, rule)
            lines += [f"  {rule}: {text}" for text in found[:limit]]
            if len(found) > limit:
                lines.append(f"  {rule}: … {len(found) - limit} more")
        if timeline:
            lines.append("  timeline:")
            lines += [f"    {at(t)} {text}" for t, text in self.timeline]
        return "\n".join(lines)


# -- drawing the world ---------------------------------------------------------------
def _draw_job(rng: random.Random, name: str) -> JobDef:
    every = rng.choice(INTERVALS_MS)
    return JobDef(
        name=name,
        every_ms=every,
        work_ms=max(1, round(every * rng.choice((0.05, 0.3, 0.6, 0.9, 0.9, 1.5)))),
        misfire_grace_ms=rng.choice((None, None, 200, 300)),
        catch_up=rng.choice(("none", "latest", "all")),
        overlap=rng.choice(("skip", "skip", "allow")),
    )


def _next_version(
    rng: random.Random, jobs: dict[str, JobDef], removed: dict[str, JobDef]
) -> dict[str, JobDef]:
    """A deploy's job list: one job added (or brought back), removed, or changed."""
    out = dict(jobs)
    kinds = ["add", "interval", "options"] + (["remove"] if len(jobs) > 1 else [])
    if removed:
        kinds.append("back")
    kind = rng.choice(kinds)
    if kind == "back":
        name = rng.choice(sorted(removed))
        out[name] = removed.pop(name)
    elif kind == "add":
        free = [n for n in JOB_NAMES if n not in jobs and n not in removed]
        name = rng.choice(free)
        out[name] = _draw_job(rng, name)
    elif kind == "remove":
        name = rng.choice(sorted(jobs))
        removed[name] = out.pop(name)
    elif kind == "interval":
        name = rng.choice(sorted(jobs))
        every = rng.choice([i for i in INTERVALS_MS if i != jobs[name].every_ms])
        work = max(1, round(jobs[name].work_ms * every / jobs[name].every_ms))
        out[name] = replace(jobs[name], every_ms=every, work_ms=work)
    else:
        name = rng.choice(sorted(jobs))
        fresh = _draw_job(rng, name)
        out[name] = replace(
            jobs[name],
            misfire_grace_ms=fresh.misfire_grace_ms,
            catch_up=fresh.catch_up,
            overlap=fresh.overlap,
        )
    return out


class World:
    """The cluster of one seed, and what happened to it."""

    def __init__(self, seed: int) -> None:
        rng = self.rng = random.Random(seed)
        self.recorder = DeployRecorder()
        self.store = Store(clock=self.recorder.clock)
        self.finish_fail = rng.choice((0.0, 0.1, 0.3))
        self.services: list[Service] = []
        for namespace in NAMESPACES[: rng.choice((2, 2, 2, 2, 3))]:
            names = rng.sample(JOB_NAMES, rng.choice((2, 3)))
            first = {name: _draw_job(rng, name) for name in sorted(names)}
            # A busy service: four replicas that are seldom idle (a job whose runs
            # last three intervals), ranked by few candidates, with long leases.
            busy = rng.random() < 0.3
            if busy:
                worker = first[names[0]]
                first[worker.name] = replace(worker, work_ms=3 * worker.every_ms, overlap="allow")
            removed: dict[str, JobDef] = {}
            versions = [first]
            for _ in range(2):
                versions.append(_next_version(rng, versions[-1], removed))
            self.services.append(
                Service(
                    namespace,
                    candidates=rng.choice((1, 2) if busy else (1, 2, None)),
                    jitter_ms=rng.choice((0, 100, 500)),
                    lease_ms=1000 if busy else rng.choice(LEASES_MS),
                    size=4 if busy else rng.choice((2, 2, 3, 3)),
                    versions=versions,
                    busy=busy,
                )
            )
        self.replicas: list[Replica] = []
        self.stopping: list[asyncio.Future[None]] = []
        self.timeline: list[tuple[int, str]] = []
        self.counts: Counter[str] = Counter()

    def note(self, text: str) -> None:
        self.timeline.append((self.recorder.clock(), text))

    # -- replicas --------------------------------------------------------------------
    async def launch(self, service: Service, rng: random.Random) -> Replica:
        service.launched += 1
        name = f"{service.namespace}-{service.launched}"
        jobs = service.versions[service.version]
        faults = {"finish": Faults(fail=self.finish_fail)} if self.finish_fail else None
        link = FaultyBackend(self.store, faults, seed=rng.randrange(2**32))
        clock = LoopClock(BASE_MS, rng.randint(-SKEW_MS, SKEW_MS))
        scheduler = Scheduler(
            link,
            namespace=service.namespace,
            instance_id=name,
            heartbeat_ms=HEARTBEAT_MS,
            lease_ms=service.lease_ms,
            jitter_ms=service.jitter_ms,
            max_attempts=5,
            candidates=service.candidates,
            clock=clock,
        )
        held = {}
        for job in jobs.values():
            store_name = f"{service.namespace}:{job.name}"
            scheduler.every(
                job.name,
                f"{job.every_ms}ms",
                misfire_grace_ms=job.misfire_grace_ms,
                catch_up=job.catch_up,
                overlap=job.overlap,
            )(self.recorder.job_handler(store_name, job.work_ms))
            held[store_name] = job
        replica = Replica(
            name, service.namespace, service.version, held, clock, link, scheduler, service.lease_ms
        )
        replica.started = self.recorder.clock()
        self.replicas.append(replica)
        service.live.append(replica)
        self.note(f"start {name} (v{service.version + 1}, clock {clock.offset_ms:+d} ms)")
        await scheduler.start()
        self.counts["started"] += 1
        return replica

    def retire(self, service: Service, replica: Replica, grace_ms: int | None) -> None:
        """A graceful stop (``grace_ms``), or a crash (``None``); the stop runs on."""
        in_flight = replica in self.busy(service)
        service.live.remove(replica)
        now = self.recorder.clock()
        if grace_ms is None:
            replica.crashed = now
            self.recorder.kill(replica.name)
            replica.link.cut(None)
            stop = replica.scheduler.stop(grace_ms=0)
            self.counts["crashes"] += 1
            self.note(f"crash {replica.name}")
        else:
            replica.stopping, replica.grace_ms = now, grace_ms
            stop = replica.scheduler.stop(grace_ms=grace_ms)
            self.counts["graceful stops"] += 1
            self.counts["graceful stops with runs in flight"] += in_flight
            self.note(f"stop {replica.name} (grace {grace_ms} ms, runs in flight: {in_flight})")
        self.stopping.append(asyncio.ensure_future(stop))

    def busy(self, service: Service) -> list[Replica]:
        """The live replicas of ``service`` with a handler running."""
        running = {run.instance for run in self.recorder.executions if run.end is None}
        return [r for r in service.live if r.name in running]

    @staticmethod
    def leave(rng: random.Random) -> int | None:
        """How a replica leaves: a grace in ms, or ``None`` for a crash (one in five)."""
        return None if rng.random() < 0.2 else rng.choice((0, 0, 50, 200, 500))

    # -- stories -----------------------------------------------------------------------
    async def story(self, service: Service, rng: random.Random) -> None:
        await asyncio.sleep(rng.uniform(STORIES_FROM_S, 1.0))
        loop = asyncio.get_running_loop()
        for _ in range(rng.choice((1, 2, 2, 3))):
            if loop.time() > STORIES_UNTIL_S:
                return
            plot = rng.choice(PLOTS + ("scale",) * 3 if service.busy else PLOTS)
            if plot == "deploy" and service.version + 1 < len(service.versions):
                await self.rolling_deploy(service, rng)
            elif plot == "restart" and service.live:
                old = rng.choice(service.live)
                self.retire(service, old, self.leave(rng))
                await asyncio.sleep(rng.uniform(0, 0.3))
                await self.launch(service, rng)
            elif plot == "crash" and service.live:
                self.retire(service, rng.choice(service.live), None)
                await asyncio.sleep(rng.uniform(0.3, 0.8))
                await self.launch(service, rng)
            elif plot == "scale" and len(service.live) >= 2:
                # While runs are in flight (the case of issue 27): the busy ones go.
                for _ in range(20):
                    if len(self.busy(service)) >= len(service.live) - 1:
                        break
                    await asyncio.sleep(0.05)
                busy = self.busy(service)
                order = busy + [r for r in service.live if r not in busy]
                going = order[: len(service.live) - 1]
                self.note(f"scale {service.namespace} down to one")
                for replica in going:
                    self.retire(service, replica, rng.choice((200, 500, 1000)))
                await asyncio.sleep(rng.uniform(0.4, 1.0))
                for _ in going:
                    await self.launch(service, rng)
            elif plot == "outage" and service.live:
                self.note(f"outage of {service.namespace}")
                crash = rng.random() < 0.5
                for replica in list(service.live):
                    self.retire(service, replica, None if crash else 0)
                await asyncio.sleep(rng.uniform(0.4, 1.2))
                if service.version + 1 < len(service.versions) and rng.random() < 0.5:
                    service.version += 1
                for _ in range(service.size):
                    await self.launch(service, rng)
            await asyncio.sleep(rng.uniform(0.1, 0.5))

    async def rolling_deploy(self, service: Service, rng: random.Random) -> None:
        service.version += 1
        self.counts["deploys"] += 1
        self.note(f"deploy {service.namespace} v{service.version + 1}")
        for old in [r for r in service.live if r.version < service.version]:
            await self.launch(service, rng)
            await asyncio.sleep(rng.uniform(0.05, 0.4))
            if old in service.live:
                self.retire(service, old, self.leave(rng))
            await asyncio.sleep(rng.uniform(0, 0.2))

    async def clock_incidents(self, rng: random.Random) -> None:
        for _ in range(rng.choice((0, 1, 1, 2))):
            await asyncio.sleep(rng.uniform(STORIES_FROM_S, 1.0))
            live = [r for s in self.services for r in s.live]
            if not live or asyncio.get_running_loop().time() > STORIES_UNTIL_S:
                return
            replica = rng.choice(live)
            delta = rng.choice(CLOCK_STEPS_MS) * rng.choice((1, -1))
            self.step(replica, delta)
            self.counts["clock steps"] += 1
            await asyncio.sleep(rng.uniform(0.3, 1.2))
            if replica.gone == float("inf"):
                self.step(replica, -delta)
                self.counts["clock steps"] += 1

    def step(self, replica: Replica, delta: int) -> None:
        now = self.recorder.clock()
        before = replica.clock.offset_ms
        replica.clock.offset_ms += delta
        after = replica.clock.offset_ms
        replica.steps.append(now)
        if delta > 0:
            replica.forward.append((now, now + before, now + after))
        if abs(after) > CLOCK_TOLERANCE_MS and abs(before) <= CLOCK_TOLERANCE_MS:
            replica.wrong.append((now, float("inf")))
        elif abs(after) <= CLOCK_TOLERANCE_MS and replica.wrong:
            replica.wrong[-1] = (replica.wrong[-1][0], now)
        self.note(f"clock of {replica.name} steps {delta:+d} ms (now {after:+d} ms)")

    async def main(self) -> list[RunRecord]:
        for service in self.services:
            for n, jobs in enumerate(service.versions, 1):
                self.note(
                    f"{service.namespace} v{n} (candidates={service.candidates}, jitter_ms="
                    f"{service.jitter_ms}, lease_ms={service.lease_ms}): "
                    + "; ".join(str(job) for job in jobs.values())
                )
        for service in self.services:
            for _ in range(service.size):
                await self.launch(service, self.rng)
        seeds = [self.rng.randrange(2**32) for _ in range(len(self.services) + 1)]
        stories = [
            self.story(service, random.Random(s))
            for service, s in zip(self.services, seeds, strict=False)
        ]
        await asyncio.gather(*stories, self.clock_incidents(random.Random(seeds[-1])))
        loop = asyncio.get_running_loop()
        # Long enough for the takeover of a run whose runner crashed last.
        crashes = [(r.crashed - BASE_MS + r.lease_ms) / 1000 for r in self.replicas if r.crashed]
        end = max([END_S, loop.time() + CALM_S] + [t + CALM_S for t in crashes])
        await asyncio.sleep(end - loop.time())
        self.note("the end: every replica stops")
        for service in self.services:
            for replica in list(service.live):
                self.retire(service, replica, FINAL_GRACE_MS)
        await asyncio.gather(*self.stopping)
        return await self.store.history(HistoryQuery(limit=1_000_000))


def simulate(seed: int) -> Report:
    random.seed(seed)  # the engines' jitter and sweep pacing
    world = World(seed)
    with _captured_warnings(world.recorder.clock) as warnings:
        records = run_virtual(world.main, lean=True)
    report = Report(seed, counts=world.counts, timeline=world.timeline)
    _judge(report, world, records, warnings.lines)
    return report


# -- the judge -------------------------------------------------------------------------
def _judge(report: Report, world: World, records: list[RunRecord], logs: list[LogLine]) -> None:
    runs: list[Run] = world.recorder.executions  # type: ignore[assignment]
    report.runs = runs
    replicas = {r.name: r for r in world.replicas}
    by_attempt = {(r.job, r.slot, r.attempt): r for r in records}
    report.counts["executions"] += len(runs)
    report.counts["takeovers"] += sum(1 for r in records if r.attempt >= 2)
    report.counts["catch-up runs"] += sum(1 for r in runs if r.origin == "catch_up")
    report.counts["skipped"] += sum(1 for r in records if r.status == Status.SKIPPED)

    def cut_off(run: Run) -> bool:
        """Its instance crashed before the finish of a returned handler could land."""
        crashed = replicas[run.instance].crashed
        return crashed is not None and run.end is not None and crashed - run.end <= FINISH_LANDS_MS

    def orphaned(record: RunRecord) -> bool:
        """Its runner died (or stopped while the store kept failing its finish: the
        engine then leaves the lease to expire, as after a crash) and no replica holding
        the job was up long enough after its lease expired to end the run."""
        runner = replicas.get(record.instance_id or "")
        if runner is None:
            return False
        left = runner.crashed if runner.crashed is not None else runner.stopping
        if left is None or (runner.crashed is None and not world.finish_fail):
            return False
        # A stopping runner resends its finish through its grace and one lease more.
        expired = left + (runner.grace_ms or 0) + 2 * runner.lease_ms
        return not any(
            max(h.started, expired) + h.liveness_ms <= h.gone
            for h in world.replicas
            if record.job in h.jobs and h is not runner
        )

    # (a) a returned handler's run executed again
    by_run: dict[tuple[str, int], list[Run]] = defaultdict(list)
    for run in runs:
        by_run[(run.job, run.slot)].append(run)
    for same in by_run.values():
        same.sort(key=lambda r: r.start)
        for i, first in enumerate(same):
            if not first.completed or first.end is None or cut_off(first):
                continue
            again = [r for r in same[i + 1 :] if r.start >= first.end]
            if again:
                record = by_attempt.get((first.job, first.slot, first.attempt))
                report.rerun.append(
                    f"{_run(first)} returned (recorded {_status(record)}), then ran again: "
                    + "; ".join(_run(r) for r in again)
                )
    # (b) two attempts of one run at once
    for one, other in world.recorder.overlapping():
        report.concurrent.append(f"{_run(one)} | {_run(other)}")
    # (d) history against what ran
    ran = {(run.job, run.slot, run.attempt): run for run in runs}
    for key, run in ran.items():
        record = by_attempt.get(key)
        if record is None:
            report.untrue.append(f"{_run(run)} ran with no record")
        elif record.instance_id != run.instance:
            report.untrue.append(f"{_run(run)} ran, recorded for {record.instance_id}")
    for key, record in by_attempt.items():
        found = ran.get(key)
        if record.status == Status.RUNNING:
            if not orphaned(record):
                report.untrue.append(f"{_record(record)} still running at the end")
        elif record.status == Status.SUCCESS and (found is None or not found.completed):
            report.untrue.append(f"{_record(record)}, but its handler did not complete")
        elif record.status == Status.FAILED and found is None:
            report.untrue.append(f"{_record(record)}, but its handler never ran")
        elif (
            record.status == Status.INTERRUPTED
            and found is not None
            and found.completed
            and not cut_off(found)
        ):
            report.untrue.append(
                f"{_record(record)}, but its handler returned at {at(found.end)} "
                f"and {found.instance} {_fate(replicas[found.instance])}"
            )
    # (e) late starts
    for run in runs:
        job = replicas[run.instance].jobs[run.job]
        if run.start > run.slot + job.horizon_ms(run.origin):
            report.late.append(f"{_run(run)}: horizon {job.horizon_ms(run.origin)} ms")
    # (f) overlap="skip": no run starts while another run of the job executes
    by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_job[run.job].append(run)
    for same_job in by_job.values():
        same_job.sort(key=lambda r: r.start)
        for i, second in enumerate(same_job):
            if replicas[second.instance].jobs[second.job].overlap != "skip":
                continue
            for first in same_job[:i]:
                if first.slot == second.slot:
                    continue  # (b) judges attempts of one run
                if first.origin == second.origin == "catch_up":
                    continue
                end = first.end if first.end is not None else float("inf")
                if second.start < end:
                    report.overlap.append(f"{_run(second)} started beside {_run(first)}")
    _judge_missed(report, world, runs, records)
    _judge_flood(report, world, logs)


def _judge_missed(report: Report, world: World, runs: list[Run], records: list[RunRecord]) -> None:
    """(c): slots owed by a qualifying replica that nothing ran."""
    owed: dict[tuple[str, int], tuple[int, Replica]] = {}
    for replica in world.replicas:
        for name, job in replica.jobs.items():
            horizon = job.horizon_ms()
            first = (replica.started + replica.lease_ms) // job.every_ms * job.every_ms
            first += job.every_ms
            slot = first
            while slot + horizon < replica.gone:
                if not replica.impaired(slot - replica.lease_ms, slot + horizon):
                    best = owed.get((name, slot))
                    if best is None or best[0] < horizon:
                        owed[(name, slot)] = (horizon, replica)
                slot += job.every_ms
    holders: dict[str, list[Replica]] = defaultdict(list)
    for replica in world.replicas:
        for name in replica.jobs:
            holders[name].append(replica)
    started = {(run.job, run.slot) for run in runs}
    nothing_ran = {(r.job, r.slot) for r in records if r.status in (Status.SKIPPED, Status.PAUSED)}
    report.owed = len(owed)
    for (name, slot), (horizon, replica) in sorted(owed.items(), key=lambda kv: kv[0][::-1]):
        if (name, slot) in started or (name, slot) in nothing_ran:
            continue
        hi = slot + horizon
        if any(
            (h.crashed is not None and slot - h.liveness_ms <= h.crashed <= hi)
            or h.impaired(slot - h.liveness_ms, hi)
            for h in holders[name]
        ):
            report.excused += 1
            continue
        up = [
            h.name
            for h in holders[name]
            if h.started <= slot <= h.gone and slot % h.jobs[name].every_ms == 0
        ]
        stored = [_record(r) for r in records if r.job == name and r.slot == slot]
        report.missed.append(
            f"{name}@{at(slot)} (horizon {horizon} ms; owed by {replica.name}; holders up: "
            f"{', '.join(up)}; store: {', '.join(stored) or 'nothing'})"
        )


def _judge_flood(report: Report, world: World, logs: list[LogLine]) -> None:
    """(g): after a forward step, at most one warning per job naming the skipped slots."""
    by_instance: dict[str, list[LogLine]] = defaultdict(list)
    for line in logs:
        if line.instance and line.slot is not None and line.time and line.attempt is None:
            by_instance[line.instance].append(line)
    for replica in world.replicas:
        for step_at, before, after in replica.forward:
            for job in replica.jobs.values():
                horizon = job.horizon_ms()
                until = min(
                    [step_at + job.every_ms + HORIZON_MARGIN_MS]
                    + [t for t in replica.steps if t > step_at]
                )
                about = [
                    line
                    for line in by_instance[replica.name]
                    if line.job == job.name
                    and step_at <= (line.time or 0) < until
                    and before < (line.slot or 0) < after - horizon - HORIZON_MARGIN_MS
                ]
                if len(about) > 1:
                    report.flood.append(
                        f"{replica.name} {job.name}: {len(about)} warnings about slots skipped "
                        f"by its clock step at {at(step_at)} ({about[0].message!r}, …)"
                    )


def _run(run: Execution) -> str:
    origin = getattr(run, "origin", "schedule")
    end = "…" if run.end is None else at(run.end)
    done = " returned" if run.completed else ""
    return (
        f"{run.job}@{at(run.slot)}#{run.attempt} {origin} on {run.instance} "
        f"[{at(run.start)}–{end}{done}]"
    )


def _record(record: RunRecord) -> str:
    return (
        f"{record.job}@{at(record.slot)}#{record.attempt} {record.status} by {record.instance_id}"
    )


def _status(record: RunRecord | None) -> str:
    return "nothing" if record is None else str(record.status)


def _fate(replica: Replica) -> str:
    if replica.crashed is not None:
        return f"crashed at {at(replica.crashed)}"
    if replica.stopping is not None:
        return f"stopped gracefully at {at(replica.stopping)} (grace {replica.grace_ms} ms)"
    return "stayed up"


# -- the seeds of a test run -------------------------------------------------------------
#: ``make test`` runs FIXED seeds and the day's window of ROTATING more, split into PARTS
#: test files so that the two xdist workers share them.
FIXED = 800
ROTATING = 200
PARTS = 2


def todays_seeds(fixed: int = FIXED, rotating: int = ROTATING) -> list[int]:
    """Seeds 0..fixed-1, then the day's window of ``rotating`` seeds from 100,000 on."""
    day = int(time.time() // 86_400)
    start = 100_000 + (day * rotating) % 1_000_000
    return list(range(fixed)) + list(range(start, start + rotating))


def seeds_of_part(part: int, parts: int = PARTS) -> list[int]:
    """The seeds test file ``part`` (0-based) of ``parts`` runs.

    ``ANARCHON_DEPLOY_SEED=S`` runs seed S alone (in part 0), ``ANARCHON_DEPLOY_SEEDS=N``
    seeds 0..N-1 (a soak) instead of the day's seeds.
    """
    one = os.environ.get("ANARCHON_DEPLOY_SEED")
    if one:
        return [int(one)] if part == 0 else []
    count = os.environ.get("ANARCHON_DEPLOY_SEEDS")
    seeds = list(range(int(count))) if count else todays_seeds()
    return seeds[part::parts]


def check_seeds(seeds: list[int]) -> None:
    """Simulate ``seeds``; fail with the broken ones explained (one seed: its timeline).

    Over many seeds, also check that the model really happened: deploys, graceful stops
    with runs in flight, crashes, clock steps, catch-up runs, skipped slots, takeovers.
    """
    if not seeds:
        return
    reports = [simulate(seed) for seed in seeds]
    broken = [report for report in reports if report.broken]
    rules = Counter(rule for report in broken for rule in report.broken_rules)
    assert not broken, (
        f"{len(broken)} of {len(seeds)} seeds broke a promise ({dict(rules)}); seeds "
        f"{[r.seed for r in broken][:40]}:\n"
        + "\n".join(r.explain(timeline=len(seeds) == 1) for r in broken[:5])
    )
    if len(seeds) < 100:
        return
    counts = sum((report.counts for report in reports), Counter[str]())
    for what in (
        "deploys",
        "graceful stops with runs in flight",
        "crashes",
        "clock steps",
        "catch-up runs",
        "skipped",
        "takeovers",
    ):
        assert counts[what] >= len(seeds) // 10, (what, counts)
    assert counts["executions"] >= 20 * len(seeds), counts
    assert sum(report.owed for report in reports) >= 5 * len(seeds)
