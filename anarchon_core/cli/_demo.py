"""``anarchon demo``: several real instances, one killed mid-run, and the takeover shown.

The demo is the claim of the project made visible: N separate OS processes run the
same jobs on one shared store, each slot runs once, and when the process running a
long job is killed with SIGKILL (no goodbye, no hand-over) another instance notices
the expired lease and runs attempt 2. It watches only through the store's history,
like an operator would, and judges the outcome from it: exit 0 when the killed run
was taken over and no slot succeeded twice.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ..backend import Backend
from ..backends import backend_from_url, mask_url
from ..records import TERMINAL_STATUSES, HistoryQuery, RunRecord, Status, iso_utc
from . import _demo_jobs
from ._format import format_ms, format_table

__all__ = ["run_demo"]

TARGET = "anarchon_core.cli._demo_jobs:scheduler"
TICK_JOB = "demo.tick"
LONG_JOB = _demo_jobs.LONG_JOB
DEMO_JOBS = frozenset(_demo_jobs.scheduler.jobs)
#: Kill the runner this far into its run, so the kill is clearly mid-run.
KILL_AFTER_MS = 1000
#: Grace the instances get when the demo stops them (SIGTERM).
STOP_GRACE_MS = 1000
POLL_S = 0.2
TICK_SUMMARY_S = 5.0
#: How long past ``--seconds`` the demo waits for the kill and the takeover to finish.
OVERTIME_S = 20.0
LOG_TAIL_LINES = 12


@dataclass(frozen=True)
class _Kill:
    instance: str
    pid: int
    slot: int
    ran_ms: int
    """How long the killed attempt had run when it was killed."""


@dataclass
class _Demo:
    url: str
    workdir: Path
    seconds: float
    instances: int
    out: TextIO
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    exits: dict[str, int] = field(default_factory=dict)
    kill: _Kill | None = None
    failures: list[str] = field(default_factory=list)
    seen: dict[tuple[str, int, int], Status] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)
    start_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)
    next_summary: float = TICK_SUMMARY_S
    stop_ms: int | None = None

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def event(self, text: str) -> None:
        self.say(f"[{time.monotonic() - self.t0:+6.1f}s] {text}")

    # -- the run -----------------------------------------------------------------------
    async def run(self) -> int:
        backend = backend_from_url(self.url)
        await backend.open()  # create the layout before the instances race to
        try:
            self._banner()
            try:
                for i in range(1, self.instances + 1):
                    self._spawn(f"demo-{i}")
                await self._watch(backend)
            finally:
                self._stop_all()
            records = await self._records(backend)
        finally:
            await backend.close()
        return self._report(records)

    def _banner(self) -> None:
        sched = _demo_jobs.scheduler
        jobs = ", ".join(f"{j.name} {j.describe()}" for j in sched.jobs.values())
        self.say(
            f"anarchon demo: {self.instances} instances for ~{self.seconds:g}s on "
            f"{mask_url(self.url)}"
        )
        self.say(f"jobs: {jobs}")
        self.say(
            f"      ({LONG_JOB} works {_demo_jobs.LONG_RUN_S:g}s; heartbeat "
            f"{sched.heartbeat_ms} ms, lease {sched.lease_ms} ms)"
        )
        self.say(
            f"plan: kill (SIGKILL) whichever instance runs {LONG_JOB}, "
            f"{KILL_AFTER_MS / 1000:g}s into the run; another instance must take it over"
        )
        self.say("")

    def _spawn(self, name: str) -> None:
        log = self.workdir / f"{name}.log"
        package_parent = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, ANARCHON_ENABLED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        command = [
            sys.executable,
            "-m",
            "anarchon_core",
            "run",
            TARGET,
            "--backend",
            self.url,
            "--instance-id",
            name,
            "--grace-ms",
            str(STOP_GRACE_MS),
        ]
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=env
            )
        self.procs[name], self.logs[name] = proc, log
        self.event(f"started {name} (pid {proc.pid})")

    async def _records(self, backend: Backend) -> list[RunRecord]:
        query = HistoryQuery(since=self.start_ms - 1000, limit=10_000)
        return [r for r in await backend.history(query) if r.job in DEMO_JOBS]

    async def _watch(self, backend: Backend) -> None:
        deadline = self.t0 + self.seconds
        while True:
            records = await self._records(backend)
            self._progress(records)
            self._check_children()
            if self.kill is None:
                self._maybe_kill(records)
            now = time.monotonic()
            if now >= deadline and self._takeover_over(records):
                return
            if now >= deadline + OVERTIME_S:
                self.failures.append(
                    f"gave up waiting {OVERTIME_S:g}s past --seconds for the kill and takeover"
                )
                return
            if not any(p.poll() is None for p in self.procs.values()):
                self.failures.append("every instance has exited")
                return
            await asyncio.sleep(POLL_S)

    # -- what happens --------------------------------------------------------------------
    def _progress(self, records: Sequence[RunRecord]) -> None:
        for r in sorted(records, key=lambda r: (r.slot, r.job, r.attempt)):
            key = (r.job, r.slot, r.attempt)
            if self.seen.get(key) == r.status:
                continue
            self.seen[key] = r.status
            if r.job == TICK_JOB and r.attempt <= 1 and r.status != Status.SKIPPED:
                continue  # a line a second would drown the story; summarised below
            note = ""
            if r.attempt >= 2 and r.status == Status.RUNNING:
                note = "  <- takeover"
            elif r.status == Status.SKIPPED:
                note = "  (previous run still live)"
            elif self._killed(r) and r.duration_ms is not None:
                assert self.kill is not None
                note = (
                    f"  (killed {format_ms(self.kill.ran_ms)} in; lease expiry seen "
                    f"{format_ms(r.duration_ms)} after its start)"
                )
            elif r.status in TERMINAL_STATUSES and r.duration_ms is not None:
                note = f"  ({format_ms(r.duration_ms)})"
            self.event(
                f"{r.job:<12} {_clock(r.slot)}  #{r.attempt}  {r.status!s:<11} "
                f"{r.instance_id or '-'}{note}"
            )
        if time.monotonic() - self.t0 >= self.next_summary:
            self.next_summary += TICK_SUMMARY_S
            ticks = Counter(r.instance_id for r in records if r.job == TICK_JOB and r.attempt >= 1)
            spread = ", ".join(f"{name} {ticks[name]}" for name in self.procs)
            self.event(f"{TICK_JOB}: {sum(ticks.values())} runs so far ({spread})")

    def _killed(self, record: RunRecord) -> bool:
        """``record`` is the attempt the demo killed."""
        kill = self.kill
        return kill is not None and (record.job, record.slot, record.attempt) == (
            LONG_JOB,
            kill.slot,
            1,
        )

    def _maybe_kill(self, records: Sequence[RunRecord]) -> None:
        now = time.time_ns() // 1_000_000
        for r in records:
            proc = self.procs.get(r.instance_id or "")
            if (
                r.job == LONG_JOB
                and r.attempt == 1
                and r.status == Status.RUNNING
                and r.started_at is not None
                and now - r.started_at >= KILL_AFTER_MS
                and proc is not None
                and proc.poll() is None
            ):
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                self.kill = _Kill(r.instance_id or "", proc.pid, r.slot, now - r.started_at)
                self.event(
                    f"killed {self.kill.instance} (pid {proc.pid}, SIGKILL) while it ran "
                    f"{LONG_JOB}@{_clock(r.slot)} (attempt 1, {format_ms(now - r.started_at)} in)"
                )
                return

    def _takeover_over(self, records: Sequence[RunRecord]) -> bool:
        kill = self.kill
        return kill is not None and any(
            r.job == LONG_JOB
            and r.slot == kill.slot
            and r.attempt >= 2
            and r.status in TERMINAL_STATUSES
            for r in records
        )

    def _check_children(self) -> None:
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is None or name in self.exits:
                continue
            self.exits[name] = code
            if self.kill is None or name != self.kill.instance:
                self.failures.append(f"{name} exited on its own (code {code})")
                self.event(f"{name} exited unexpectedly with code {code}")

    def _stop_all(self) -> None:
        self._check_children()  # an instance that died just now is a failure, not a stop
        self.stop_ms = time.time_ns() // 1_000_000
        alive = {n: p for n, p in self.procs.items() if p.poll() is None}
        for proc in alive.values():
            proc.send_signal(signal.SIGTERM)
        if alive:
            self.event(f"stopping {', '.join(alive)} (SIGTERM, grace {STOP_GRACE_MS} ms)")
        for name, proc in alive.items():
            try:
                code = proc.wait(STOP_GRACE_MS / 1000 + 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
                self.failures.append(f"{name} did not stop within its grace period")
            self.exits[name] = code
            if code != 0:
                self.failures.append(f"{name} stopped with exit code {code}")
        if alive:
            codes = ", ".join(f"{name} exit {self.exits[name]}" for name in alive)
            self.event(f"stopped ({codes})")

    # -- the verdict ---------------------------------------------------------------------
    def _report(self, records: Sequence[RunRecord]) -> int:
        ordered = sorted(records, key=lambda r: (r.slot, r.job, r.attempt))
        kill = self.kill
        self.say("")
        self.say(f"history ({len(ordered)} records, slot order):")
        rows = [
            [
                _clock(r.slot),
                r.job,
                str(r.attempt),
                str(r.status),
                r.instance_id or "-",
                format_ms(r.duration_ms),
                _note(r, kill, self.stop_ms),
            ]
            for r in ordered
        ]
        headers = ["SLOT (UTC)", "JOB", "ATT", "STATUS", "INSTANCE", "DURATION", "NOTE"]
        for line in format_table(headers, rows):
            self.say("  " + line)

        self.say("")
        self.say("runs per instance (who won the claims):")
        per: dict[str, Counter[str]] = defaultdict(Counter)
        for r in ordered:
            if r.attempt >= 1 and r.instance_id:
                per[r.instance_id]["runs"] += 1
                per[r.instance_id][str(r.status)] += 1
        names = sorted(set(self.procs) | set(per))
        rows = [
            [
                name,
                str(per[name]["runs"]),
                str(per[name][Status.SUCCESS.value]),
                str(per[name]["runs"] - per[name][Status.SUCCESS.value]),
                "killed" if kill and kill.instance == name else f"exit {self.exits.get(name)}",
            ]
            for name in names
        ]
        for line in format_table(["INSTANCE", "RUNS", "SUCCESS", "OTHER", "PROCESS"], rows):
            self.say("  " + line)

        self.say("")
        takeovers = [r for r in ordered if r.attempt >= 2]
        self.say(f"takeovers ({len(takeovers)}):")
        by_key = {(r.job, r.slot, r.attempt): r for r in ordered}
        for r in takeovers:
            before = by_key.get((r.job, r.slot, r.attempt - 1))
            was = f"{before.instance_id} ({before.status})" if before else "?"
            self.say(
                f"  {r.job}@{_clock(r.slot)}: attempt {r.attempt - 1} on {was} -> "
                f"attempt {r.attempt} on {r.instance_id} ({r.status})"
            )
        if not takeovers:
            self.say("  none")
        return self._verdict(ordered)

    def _verdict(self, records: Sequence[RunRecord]) -> int:
        failures = list(self.failures)
        kill = self.kill
        taken: RunRecord | None = None
        if kill is None:
            failures.append(f"no run of {LONG_JOB} was caught in flight, so nothing was killed")
        else:
            taken = next(
                (
                    r
                    for r in records
                    if r.job == LONG_JOB
                    and r.slot == kill.slot
                    and r.attempt >= 2
                    and r.instance_id != kill.instance
                ),
                None,
            )
            if taken is None:
                failures.append(
                    f"the run {LONG_JOB}@{_clock(kill.slot)} of the killed {kill.instance} "
                    "was not taken over"
                )
        wins = Counter((r.job, r.slot) for r in records if r.status == Status.SUCCESS)
        failures += _not_exactly_once(records, wins, self.stop_ms, kill)
        self.say("")
        if failures:
            self._log_tails()
            for text in failures:
                self.say(f"FAILED: {text}")
            return 1
        assert kill is not None and taken is not None
        self.say(
            f"OK: {taken.instance_id} took over {LONG_JOB}@{_clock(kill.slot)} as attempt "
            f"{taken.attempt} ({taken.status}) after {kill.instance} was killed;"
        )
        self.say(
            f"    each slot ran exactly once ({sum(wins.values())} successful runs by "
            f"{len({r.instance_id for r in records if r.status == Status.SUCCESS})} instances, "
            "one of them after the takeover);"
        )
        self.say("    slots skipped while their job's previous run was live, and short runs")
        self.say("    lost with the killed instance, are listed above.")
        return 0

    def _log_tails(self) -> None:
        for name, path in self.logs.items():
            try:
                lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            except OSError:
                continue
            self.say(f"--- last lines of {name}'s log ---")
            for line in lines:
                self.say("  " + line)


def _not_exactly_once(
    records: Sequence[RunRecord],
    wins: Counter[tuple[str, int]],
    stop_ms: int | None,
    kill: _Kill | None,
) -> list[str]:
    """Every slot of each demo job, from its first recorded slot to its last, ran
    exactly once: one success, or a ``skipped`` record (its previous run was live). Not
    judged: a slot whose run was still going at the stop, and a short job's run that the
    killed instance held (past its one-second horizon before a backup could take it)."""
    failures = []
    for job in _demo_jobs.scheduler.jobs.values():
        mine = [r for r in records if r.job == job.name]
        if not mine:
            continue
        judged = {r.slot for r in mine}
        for slot in job.schedule.slots_between(min(judged) - 1, max(judged)):
            runs = [r for r in mine if r.slot == slot]
            if any(r.status in (Status.SKIPPED, Status.PAUSED) for r in runs):
                continue
            if kill and any(_lost_with(r, kill) for r in runs) and job.name != LONG_JOB:
                continue
            if stop_ms is not None and any((r.finished_at or stop_ms) >= stop_ms for r in runs):
                continue  # still running, or released, at the stop
            if wins[job.name, slot] != 1:
                failures.append(f"{job.name}@{_clock(slot)} succeeded {wins[job.name, slot]} times")
    return failures


def _lost_with(record: RunRecord, kill: _Kill) -> bool:
    """``record`` is an attempt that ended ``interrupted`` with the killed instance."""
    return record.instance_id == kill.instance and record.status == Status.INTERRUPTED


def _clock(ms: int) -> str:
    """``08:00:06.000``: the time of day is enough within one short demo."""
    return iso_utc(ms)[11:23]


def _note(record: RunRecord, kill: _Kill | None, stop_ms: int | None) -> str:
    if record.attempt >= 2:
        return "takeover"
    if kill and (record.job, record.slot, record.attempt) == (LONG_JOB, kill.slot, 1):
        return "runner killed (SIGKILL)"
    if kill and _lost_with(record, kill):
        return "instance killed, past its horizon"
    if record.status == Status.SKIPPED:
        return "previous run still live"
    stopped = stop_ms is not None and (record.finished_at or 0) >= stop_ms
    if record.status == Status.INTERRUPTED and stopped:
        return "released at stop: no backup left"
    return ""


def run_demo(
    *,
    seconds: float = 20.0,
    instances: int = 3,
    backend: str | None = None,
    keep: bool = False,
    out: TextIO | None = None,
) -> int:
    """Run the demo; returns the exit code (0 when a takeover happened and was clean)."""
    stream = out or sys.stdout
    workdir = Path(tempfile.mkdtemp(prefix="anarchon-demo-"))
    url = backend or f"sqlite:///{workdir / 'demo.sqlite3'}"
    try:
        return asyncio.run(_Demo(url, workdir, seconds, instances, stream).run())
    finally:
        if keep:
            print(f"\nfiles kept in {workdir} (instance logs, store)", file=stream)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
