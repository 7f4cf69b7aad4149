"""One chaos run on one store: start the workers, break things, stop, collect.

The workers are separate processes (``python -m benchmarks._chaos_worker``), each with
its own fault proxy (``FaultProxy``) between it and the server, so that each instance
has a faulty link of its own. While the run lasts, the proxies inject faults with
probability ``p`` and a seeded chaos loop SIGSTOPs workers (SIGCONT after a random
span), SIGKILLs them (restarted after a random span, as a new instance with a new clock
offset) and pauses a worker's proxy (every byte held). The workers of a second service
(``other_service``, another namespace with other jobs) share the store behind faulty
links of their own, but are never stopped, killed or paused: they show that several
services share one store. Then every worker is stopped
with SIGTERM (the scheduler's ``stop()``) on fault-free links, and the store's history
is read. What happened is returned as a :class:`RunLog` for the analysis.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anarchon_core import RunRecord, backend_from_url
from anarchon_core.records import HistoryQuery

from ._chaos_jobs import MAIN, OTHER
from ._chaos_stores import Store
from ._fault_proxy import FaultCounts, FaultProxy

__all__ = ["Instance", "Options", "RunLog", "run_store"]

Span = tuple[float, float]  # true wall time, seconds


@dataclass(frozen=True)
class Options:
    seconds: float
    p: float
    seed: int
    workers: int = 4
    heartbeat_ms: int = 200
    lease_ms: int = 1200
    jitter_ms: int = 500
    chaos_every_s: float = 2.0  # mean time between chaos actions
    max_span_leases: float = 3.0  # SIGSTOP, restart and pause spans: up to this many leases
    candidates: int | None = 2  # the workers' `candidates` (None: every instance claims)
    other_service: int = 1  # workers of the other service (namespace `other`), no chaos

    @property
    def all_workers(self) -> int:
        return self.workers + self.other_service

    def service(self, worker: int) -> str:
        """The service of a worker slot: the first ``workers`` are the main one's."""
        return MAIN.name if worker < self.workers else OTHER.name


@dataclass
class Instance:
    """One worker process: a worker slot (``worker``, its proxy) runs one at a time."""

    instance_id: str
    worker: int
    offset_ms: int
    proc: subprocess.Popen[bytes]
    spawned: float
    ready: float | None = None
    gone: float | None = None  # killed, crashed or exited
    killed: bool = False
    freezes: list[Span] = field(default_factory=list)
    service: str = MAIN.name


@dataclass
class RunLog:
    """What happened in one run, as the orchestrator and the workers saw it."""

    store: Store
    options: Options
    began: float  # every first worker ready: chaos starts
    ended: float  # chaos stops, SIGTERM follows
    instances: dict[str, Instance]
    pauses: dict[int, list[Span]]  # per worker slot: its proxy held every byte
    actions: dict[str, int]
    faults: FaultCounts  # the main service's links
    other_faults: FaultCounts  # the other service's links
    link_log: dict[int, list[tuple[float, str, float]]]  # per worker slot: its link's faults
    chaos_log: list[dict[str, Any]]  # every chaos action: time, kind, worker, instance, span
    events: list[dict[str, Any]]
    history: list[RunRecord]
    logs: Path


class ChaosRun:
    def __init__(self, store: Store, options: Options, tmp: Path) -> None:
        self.store = store
        self.options = options
        self.tmp = tmp
        self.events_path = tmp / "events.jsonl"
        self.rng = random.Random(f"{options.seed}:{store.name}:chaos")
        # The other service draws from its own generator: the main service's chaos is
        # the same with or without it.
        self.other_rng = random.Random(f"{options.seed}:{store.name}:other")
        self.proxies: list[FaultProxy | None] = []
        self.instances: dict[str, Instance] = {}
        self.current: dict[int, Instance] = {}  # worker slot -> its live instance
        self.busy: set[int] = set()  # worker slots frozen or dead right now
        self.pauses: dict[int, list[Span]] = {w: [] for w in range(options.all_workers)}
        self.actions = dict.fromkeys(("SIGSTOP", "SIGKILL", "pause", "crash"), 0)
        self.chaos_log: list[dict[str, Any]] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.generation = [0] * options.all_workers

    @property
    def lease_s(self) -> float:
        return self.options.lease_ms / 1000

    # -- workers -----------------------------------------------------------------
    def spawn(self, worker: int) -> Instance:
        gen = self.generation[worker]
        self.generation[worker] += 1
        service = self.options.service(worker)
        name = f"w{worker}" if service == MAIN.name else f"{service}{worker - self.options.workers}"
        instance_id = f"{self.store.name}-{name}" + (f".{gen}" if gen else "")
        half = self.options.lease_ms // 2
        offset = (self.rng if service == MAIN.name else self.other_rng).randint(-half, half)
        proxy = self.proxies[worker]
        spec = {
            "url": self.store.worker_url(proxy.port if proxy else None),
            "instance_id": instance_id,
            "service": service,
            "candidates": self.options.candidates,
            "offset_ms": offset,
            "heartbeat_ms": self.options.heartbeat_ms,
            "lease_ms": self.options.lease_ms,
            "jitter_ms": self.options.jitter_ms,
            "events": str(self.events_path),
        }
        env = {**os.environ, "ANARCHON_CHAOS_SPEC": json.dumps(spec), "PYTHONUNBUFFERED": "1"}
        with open(self.tmp / f"{instance_id}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks._chaos_worker"],
                env=env,
                stdout=log,
                stderr=log,
                cwd=Path(__file__).resolve().parent.parent,
            )
        inst = Instance(instance_id, worker, offset, proc, time.time(), service=service)
        self.instances[instance_id] = inst
        self.current[worker] = inst
        return inst

    def events(self) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        with open(self.events_path, encoding="utf-8") as lines:
            return [json.loads(line) for line in lines if line.endswith("\n")]

    async def wait_ready(self, count: int, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = [e for e in self.events() if e["e"] == "ready"]
            if len(ready) >= count:
                return max(float(e["t"]) for e in ready)
            crashed = [i for i in self.instances.values() if i.proc.poll() is not None]
            if crashed:
                raise RuntimeError(f"{crashed[0].instance_id} exited at start-up: see its log")
            await asyncio.sleep(0.05)
        raise RuntimeError(f"the workers were not ready after {timeout:.0f} s")

    def reap_crashed(self) -> None:
        """A worker that exited by itself (e.g. its start failed on a cut link) restarts."""
        for worker, inst in list(self.current.items()):
            if worker not in self.busy and inst.proc.poll() is not None:
                inst.gone = time.time()
                self.actions["crash"] += 1
                self.spawn(worker)

    # -- chaos -------------------------------------------------------------------
    def start_task(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def freeze(self, worker: int, seconds: float) -> None:
        inst = self.current[worker]
        began = self.stop_unlocked(inst)
        if began is None:
            self.busy.discard(worker)
            return
        self.actions["SIGSTOP"] += 1
        try:
            await asyncio.sleep(seconds)
        finally:
            inst.proc.send_signal(signal.SIGCONT)
            inst.freezes.append((began, time.time()))
            self.busy.discard(worker)

    def stop_unlocked(self, inst: Instance) -> float | None:
        """SIGSTOP ``inst``; on SQLite at a moment it holds no write lock (else None).

        A process frozen inside its own write would block every instance on a
        one-writer file: an outage of the whole store, not of one instance.
        """
        path = self.store.sqlite_path
        for _ in range(20):
            inst.proc.send_signal(signal.SIGSTOP)
            began = time.time()
            if path is None or not _sqlite_locked(path):
                return began
            inst.proc.send_signal(signal.SIGCONT)
            time.sleep(0.02)
        return None

    async def kill(self, worker: int, down_s: float) -> None:
        inst = self.current[worker]
        inst.proc.kill()
        inst.gone, inst.killed = time.time(), True
        self.actions["SIGKILL"] += 1
        try:
            await asyncio.sleep(down_s)
            inst.proc.wait()
            self.spawn(worker)
        finally:  # cancelled when the chaos ends: the worker stays down
            self.busy.discard(worker)

    async def pause(self, worker: int, seconds: float) -> None:
        proxy = self.proxies[worker]
        if proxy is None or proxy.paused:
            return
        self.actions["pause"] += 1
        began = time.time()
        try:
            await proxy.pause(seconds)
        finally:
            self.pauses[worker].append((began, time.time()))

    def act(self) -> None:
        """One seeded chaos action on a random worker."""
        kinds = ("stop", "kill") if self.store.target is None else ("stop", "kill", "pause")
        kind = self.rng.choice(kinds)
        worker = self.rng.randrange(self.options.workers)
        span = self.rng.uniform(0.1, self.options.max_span_leases) * self.lease_s
        self.chaos_log.append(
            {
                "t": time.time(),
                "kind": kind,
                "worker": worker,
                "instance": self.current[worker].instance_id,
                "span_s": round(span, 3),
                "busy": worker in self.busy,  # a stop or kill of a busy worker does nothing
            }
        )
        if kind == "pause":
            self.start_task(self.pause(worker, span))
        elif worker not in self.busy:
            self.busy.add(worker)
            action = self.freeze if kind == "stop" else self.kill
            self.start_task(action(worker, span))

    async def chaos(self, until: float) -> None:
        while True:
            wait = self.rng.expovariate(1 / self.options.chaos_every_s)
            if time.time() + wait >= until:
                await asyncio.sleep(max(until - time.time(), 0))
                return
            await asyncio.sleep(wait)
            self.reap_crashed()
            self.act()

    # -- the run -----------------------------------------------------------------
    @property
    def links(self) -> list[FaultProxy]:
        return [proxy for proxy in self.proxies if proxy is not None]

    async def open_proxies(self) -> None:
        for worker in range(self.options.all_workers):
            if self.store.target is None:
                self.proxies.append(None)
                continue
            proxy = FaultProxy(
                f"{self.store.name}-w{worker}",
                self.store.target,
                p=0.0,  # no faults while the first workers start
                max_delay_s=2 * self.lease_s,
                seed=self.options.seed,
            )
            await proxy.start()
            self.proxies.append(proxy)

    async def run(self) -> RunLog:
        opts = self.options
        await self.open_proxies()
        try:
            for worker in range(opts.all_workers):
                self.spawn(worker)
            await self.wait_ready(opts.all_workers, timeout=60)
            began = time.time()
            for link in self.links:
                link.p = opts.p
            await self.chaos(began + opts.seconds)
            ended = time.time()
            await self.calm()
            await self.stop_all()
        finally:
            for inst in self.instances.values():
                if inst.proc.poll() is None:
                    inst.proc.kill()
                inst.proc.wait()
            for link in self.links:
                await link.close()
        faults, other_faults = FaultCounts(), FaultCounts()
        for worker, proxy in enumerate(self.proxies):
            if proxy is not None:
                main = self.options.service(worker) == MAIN.name
                (faults if main else other_faults).add(proxy.counts)
        events = self.events()
        for event in events:
            if event["e"] == "ready" and event["instance"] in self.instances:
                self.instances[event["instance"]].ready = float(event["t"])
        return RunLog(
            store=self.store,
            options=opts,
            began=began,
            ended=ended,
            instances=self.instances,
            pauses=self.pauses,
            actions=self.actions,
            faults=faults,
            other_faults=other_faults,
            link_log={w: list(p.log) for w, p in enumerate(self.proxies) if p is not None},
            chaos_log=self.chaos_log,
            events=events,
            history=await read_history(self.store.url),
            logs=self.tmp,
        )

    async def calm(self) -> None:
        """End the chaos: faults off, frozen workers resumed, proxies open again."""
        for link in self.links:
            link.p = 0.0
        for task in list(self.tasks):
            task.cancel()  # each one's `finally` resumes, restarts or un-pauses
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def stop_all(self, timeout: float = 30.0) -> None:
        """SIGTERM every live worker (the scheduler's ``stop()``); SIGKILL after ``timeout``."""
        live = [i for i in self.current.values() if i.proc.poll() is None]
        for inst in live:
            inst.proc.send_signal(signal.SIGCONT)
            inst.proc.terminate()
        deadline = time.monotonic() + timeout
        for inst in live:
            while inst.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if inst.proc.poll() is None:
                inst.proc.kill()
                inst.proc.wait()
            inst.gone = time.time()
        for inst in self.instances.values():
            if inst.gone is None:
                inst.gone = time.time()


def _sqlite_locked(path: str) -> bool:
    """Whether another process holds the write lock of the SQLite file at ``path``."""
    with closing(sqlite3.connect(path, timeout=0)) as conn:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return True
        conn.rollback()
        return False


async def read_history(url: str) -> list[RunRecord]:
    backend = backend_from_url(url)
    await backend.open()
    try:
        return await backend.history(HistoryQuery(limit=10_000_000))
    finally:
        await backend.close()


def run_store(store: Store, options: Options, tmp: Path) -> RunLog:
    return asyncio.run(ChaosRun(store, options, tmp).run())
