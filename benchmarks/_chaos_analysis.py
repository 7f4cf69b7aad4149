"""What a chaos run did: due slots against what the handlers really ran.

Every time is the true wall clock (``time.time()`` in the handlers and the
orchestrator, all on one host); slots and horizons are epoch ms. A handler interval
runs from its ``start`` event to its ``end`` event, or, without one, to the moment its
process was killed or exited.

* **concurrent duplicate**: two executions of one ``(job, slot)`` whose intervals
  overlap. Reported apart, and not counted as duplicates: *fenced but ignoring*, where
  the earlier execution's handler ignores cancellation and had been told it lost its
  lease by the time the later one started; *frozen*, where the earlier execution's
  process was stopped (SIGSTOP) when the later one started, or woke less than the slack
  before (the one case the guarantees name: a frozen runner's code runs between waking
  and being told).
* **late start**: a start later than ``slot + horizon`` (``misfire_grace_ms``: the gap
  to the next slot), with as tolerance the amount by which the starting worker's clock
  lags the true one (it judges the horizon by its own clock) plus a slack for the hop
  from the engine's check to the handler's first line. A start whose process was
  stopped between the slot and the start is reported apart (*frozen*).
* **started past the self-fence window**: a start later than ``lease_ms -
  heartbeat_ms`` (plus the slack) after the store recorded the attempt's claim (its
  ``claimed_at``, by the store's clock, which on this one host is the true one), unless
  the process was stopped meanwhile: the attempt's deadline counts from the claim's
  first send, which came no later.
* **missed**: a due slot with no start and no ``skipped``/``paused`` record. Counted apart
  (*cut off*) when no instance could have claimed it: every instance was dead, stopped,
  behind a paused link, or had a clock lagging by more than the horizon, for the whole
  of its claim window (from the slot by its own clock to the slot's horizon); and of
  those, apart, the slots some instance could have claimed but for its clock lag. The
  other misses are counted apart (*link faults*) when every instance that could claim
  had its link hit in its claim window: a reply cut or reset from a second before the
  window to its end, or delayed across part of it. Each such miss is printed with what
  every instance went through in its window.

Each service is judged on its own jobs with its own instances: an instance of the
other service (another namespace) never holds a main job, so it never counts as one
that could have claimed it. The main service's figures are the benchmark's; the other
service's are reported beside them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from anarchon_core.records import RunRecord, Status, iso_utc

from ._chaos_jobs import MAIN, OTHER, POLL_S, JobSpec, Service
from ._chaos_run import Instance, RunLog, Span

__all__ = ["Counts", "Finding", "StoreResult", "analyse"]


@dataclass
class Counts:
    due: int = 0
    ran: int = 0
    duplicates: int = 0  # runs with a concurrent duplicate
    fenced_ignoring: int = 0
    frozen_overlaps: int = 0
    late: int = 0
    late_frozen: int = 0
    past_fence: int = 0  # started after the self-fence window from the claim's record
    missed: int = 0
    missed_cut_off: int = 0
    cut_off_by_lag: int = 0  # of those, claimable by some instance but for its clock lag
    missed_link_faults: int = 0  # not cut off, but every claimable instance's link faulted
    missed_claimed: int = 0  # missed, but the store holds a record: won, never started
    skipped: int = 0  # skipped or paused records of due slots
    ran_again: int = 0  # due runs with more than one execution (overlapping or not)
    takeovers: int = 0  # history records with attempt >= 2

    def add(self, other: Counts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class Finding:
    kind: str  # duplicate, fenced-ignoring, frozen, late, late-frozen, past-fence, missed
    text: str
    log_lines: list[str] = field(default_factory=list)
    job: str = ""


@dataclass
class ServiceResult:
    service: Service
    total: Counts
    per_job: dict[str, Counts]
    findings: list[Finding]


@dataclass
class StoreResult:
    run: RunLog
    total: Counts  # the main service's
    per_job: dict[str, Counts]
    findings: list[Finding]
    slack_ms: int
    other: ServiceResult | None = None  # the other service's, if it ran


@dataclass
class Execution:
    job: str
    slot: int
    attempt: int
    instance: str
    start: float
    end: float
    ended: bool  # an end event was written
    cancelled: str | None
    told: float | None

    def describe(self, offset_ms: int) -> str:
        span = f"{self.start * 1000 - self.slot:+.0f}..{self.end * 1000 - self.slot:+.0f} ms"
        how = f"ended, cancelled={self.cancelled!r}" if self.ended else "no end (process gone)"
        told = "" if self.told is None else f", told {self.told * 1000 - self.slot:+.0f} ms"
        return (
            f"attempt {self.attempt} on {self.instance} (clock {offset_ms:+d} ms) "
            f"ran {span} from the slot, {how}{told}"
        )


def analyse(run: RunLog, slack_ms: int) -> StoreResult:
    main = judge(run, MAIN, slack_ms)
    other = None
    if any(inst.service == OTHER.name for inst in run.instances.values()):
        other = judge(run, OTHER, slack_ms)
    return StoreResult(run, main.total, main.per_job, main.findings, slack_ms, other)


def judge(run: RunLog, service: Service, slack_ms: int) -> ServiceResult:
    """The slots of ``service``'s jobs against what its instances ran."""
    instances = {i: inst for i, inst in run.instances.items() if inst.service == service.name}
    executions = _executions(run.events, instances)
    by_run: dict[tuple[str, int], list[Execution]] = defaultdict(list)
    for ex in executions:
        by_run[(ex.job, ex.slot)].append(ex)
    specs = {spec.name: spec for spec in service.jobs}
    by_store_name = {service.store_name(spec.name): spec.name for spec in service.jobs}
    records: dict[tuple[str, int], list[RunRecord]] = defaultdict(list)
    for record in run.history:
        if record.job in by_store_name:
            records[(by_store_name[record.job], record.slot)].append(record)
    per_job = {spec.name: Counts() for spec in service.jobs}
    findings: list[Finding] = []
    checker = _Checker(run, instances, service, slack_ms)
    for key, runs in sorted(by_run.items()):
        spec = specs.get(key[0])
        if spec is not None:
            findings += checker.overlaps(spec, runs, per_job[spec.name])
            findings += checker.late_starts(spec, runs, per_job[spec.name])
            findings += checker.past_fence(spec, runs, per_job[spec.name])
    for (job, _), held in records.items():
        per_job[job].takeovers += sum(1 for record in held if record.attempt >= 2)
    begin_ms, end_ms = int(run.began * 1000), int(run.ended * 1000)
    for spec in service.jobs:
        counts = per_job[spec.name]
        for slot in spec.schedule.slots_between(begin_ms, end_ms):
            if slot + spec.horizon_ms(slot) > end_ms:
                continue
            counts.due += 1
            ran = by_run.get((spec.name, slot), [])
            statuses = {r.status for r in records.get((spec.name, slot), [])}
            if ran:
                counts.ran += 1
                counts.ran_again += len(ran) > 1
            elif statuses & {Status.SKIPPED, Status.PAUSED}:
                counts.skipped += 1
            else:
                counts.missed += 1
                counts.missed_claimed += bool(statuses)
                if checker.anyone_could_claim(spec, slot):
                    finding, link_faults = checker.missed(
                        spec, slot, records.get((spec.name, slot))
                    )
                    counts.missed_link_faults += link_faults
                    findings.append(finding)
                else:
                    counts.missed_cut_off += 1
                    counts.cut_off_by_lag += checker.anyone_could_claim(spec, slot, lag=False)
    total = Counts()
    for counts in per_job.values():
        total.add(counts)
    return ServiceResult(service, total, per_job, findings)


def _executions(
    events: Sequence[dict[str, Any]], instances: dict[str, Instance]
) -> list[Execution]:
    ends: dict[tuple[str, int, int, str], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["e"] == "end":
            ends[(e["job"], e["slot"], e["attempt"], e["instance"])].append(e)
    out = []
    for e in events:
        if e["e"] != "start":
            continue
        key = (e["job"], e["slot"], e["attempt"], e["instance"])
        end = ends[key].pop(0) if ends[key] else None
        inst = instances.get(e["instance"])
        gone = inst.gone if inst is not None and inst.gone is not None else math.inf
        out.append(
            Execution(
                job=e["job"],
                slot=int(e["slot"]),
                attempt=int(e["attempt"]),
                instance=e["instance"],
                start=float(e["t"]),
                end=float(end["t"]) if end else gone,
                ended=end is not None,
                cancelled=end.get("cancelled") if end else None,
                told=end.get("told") if end else None,
            )
        )
    return out


class _Checker:
    def __init__(
        self, run: RunLog, instances: dict[str, Instance], service: Service, slack_ms: int
    ) -> None:
        self.run = run
        self.slack = slack_ms / 1000
        self.instances = instances  # the service's own
        self.service = service
        self.claimed = {
            (r.job, r.slot, r.attempt, r.instance_id): r.claimed_at for r in run.history
        }

    def frozen_between(self, instance: str, start: float, end: float) -> bool:
        inst = self.instances.get(instance)
        return inst is not None and any(a <= end and b >= start for a, b in inst.freezes)

    def offset(self, instance: str) -> int:
        inst = self.instances.get(instance)
        return inst.offset_ms if inst is not None else 0

    def overlaps(self, spec: JobSpec, runs: list[Execution], counts: Counts) -> list[Finding]:
        ordered = sorted(runs, key=lambda ex: ex.start)
        found: list[Finding] = []
        for i, first in enumerate(ordered):
            for later in ordered[i + 1 :]:
                if first.end > later.start:
                    kind = self.classify(spec, first, later)
                    found.append(Finding(kind, self.pair_text(spec, first, later)))
        kinds = {f.kind for f in found}
        if "duplicate" in kinds:
            counts.duplicates += 1
            for finding in found:
                finding.log_lines = log_excerpt(
                    self.run.logs, {ex.instance for ex in runs}, spec.name, runs[0].slot
                )
        elif "frozen" in kinds:
            counts.frozen_overlaps += 1
        elif kinds:
            counts.fenced_ignoring += 1
        return found

    def classify(self, spec: JobSpec, first: Execution, later: Execution) -> str:
        told = first.told
        if (
            not spec.honours_cancellation
            and told is not None
            and (first.cancelled or "").startswith("lease lost")
            and told - POLL_S - self.slack <= later.start
        ):
            return "fenced-ignoring"
        inst = self.instances.get(first.instance)
        freezes = inst.freezes if inst is not None else []
        woke_by = max(first.start, later.start - self.slack)
        if any(a <= later.start and b >= woke_by for a, b in freezes):
            return "frozen"
        return "duplicate"

    def pair_text(self, spec: JobSpec, first: Execution, later: Execution) -> str:
        overlap = (min(first.end, later.end) - later.start) * 1000
        return (
            f"{spec.name} slot {first.slot} ({iso_utc(first.slot)}): "
            f"{first.describe(self.offset(first.instance))}; "
            f"{later.describe(self.offset(later.instance))}; overlap {overlap:.0f} ms"
        )

    def late_starts(self, spec: JobSpec, runs: list[Execution], counts: Counts) -> list[Finding]:
        found = []
        for ex in runs:
            horizon = spec.horizon_ms(ex.slot)
            offset = self.offset(ex.instance)
            tolerance = max(0, -offset)
            late_ms = ex.start * 1000 - (ex.slot + horizon)
            if late_ms <= tolerance + self.slack * 1000:
                continue
            frozen = self.frozen_between(ex.instance, ex.slot / 1000, ex.start)
            text = (
                f"{spec.name} slot {ex.slot} ({iso_utc(ex.slot)}): attempt {ex.attempt} on "
                f"{ex.instance} (clock {offset:+d} ms) started {ex.start * 1000 - ex.slot:.0f} ms "
                f"after the slot; horizon {horizon} ms, tolerance {tolerance} ms (clock lag) "
                f"+ {self.slack * 1000:.0f} ms (slack)"
            )
            if frozen:
                counts.late_frozen += 1
                found.append(Finding("late-frozen", text + "; its process was frozen meanwhile"))
            else:
                counts.late += 1
                lines = log_excerpt(self.run.logs, {ex.instance}, spec.name, ex.slot)
                found.append(Finding("late", text, lines))
        return found

    def missed(
        self, spec: JobSpec, slot: int, records: list[RunRecord] | None
    ) -> tuple[Finding, bool]:
        """The finding of a miss some instance could have claimed, and whether every
        such instance's link faulted in its claim window."""
        held = ", ".join(
            f"attempt {r.attempt} {r.status} on {r.instance_id}"
            + ("" if r.claimed_at is None else f" claimed {r.claimed_at - slot:+d} ms")
            for r in records or []
        )
        windows = self.claim_windows(spec, slot)
        faulted = [self.link_faults(inst, start, end) for inst, start, end in windows]
        states = "; ".join(
            self.describe_window(inst, start, end, slot, faults)
            for (inst, start, end), faults in zip(windows, faulted, strict=True)
        )
        every_link = bool(windows) and all(faulted)
        text = (
            f"{spec.name} slot {slot} ({iso_utc(slot)}): no start; "
            + (f"store records: {held}" if held else "no store record")
            + f"; could claim: {states}"
            + ("; every such link faulted" if every_link else "")
        )
        return Finding("missed", text, job=spec.name), every_link

    def claim_windows(self, spec: JobSpec, slot: int) -> list[tuple[Instance, float, float]]:
        """The instances up, running and connected for part of their claim window, with
        that window (true time, seconds)."""
        horizon_end = (slot + spec.horizon_ms(slot)) / 1000
        found = []
        for inst in self.instances.values():
            if inst.ready is None or inst.gone is None:
                continue
            start = max((slot - inst.offset_ms) / 1000, inst.ready)
            end = min(horizon_end, inst.gone)
            blocked = [*inst.freezes, *self.run.pauses.get(inst.worker, [])]
            if start < end and not _covered(start, end, blocked):
                found.append((inst, start, end))
        return found

    def link_faults(
        self, inst: Instance, start: float, end: float
    ) -> list[tuple[float, str, float]]:
        """The faults of ``inst``'s link that touch its claim window ``[start, end]``: a
        cut or reset from a second before it (the reconnect) to its end, a delay or a
        pause that overlaps it."""
        found = []
        for t, kind, seconds in self.run.link_log.get(inst.worker, []):
            if kind in ("cut", "reset"):
                if start - 1.0 <= t <= end:
                    found.append((t, kind, seconds))
            elif t <= end and t + seconds >= start:
                found.append((t, kind, seconds))
        return found

    def describe_window(
        self,
        inst: Instance,
        start: float,
        end: float,
        slot: int,
        faults: list[tuple[float, str, float]],
    ) -> str:
        """``inst`` in its claim window: its clock, freezes, pauses and link faults, in
        ms from the slot."""

        def ms(t: float) -> str:
            return f"{t * 1000 - slot:+.0f}"

        parts = [f"{inst.instance_id} (clock {inst.offset_ms:+d} ms) {ms(start)}..{ms(end)}"]
        for a, b in inst.freezes:
            if a <= end and b >= start:
                parts.append(f"frozen {ms(a)}..{ms(b)}")
        for t, kind, seconds in faults:
            parts.append(f"{kind} {ms(t)}" + (f" for {seconds * 1000:.0f} ms" if seconds else ""))
        if not faults and self.run.store.target is not None:
            parts.append("no link fault")
        return " ".join(parts)

    def past_fence(self, spec: JobSpec, runs: list[Execution], counts: Counts) -> list[Finding]:
        """Starts later than ``lease_ms - heartbeat_ms`` after the store recorded the claim
        (the store's clock; on this host, the true one): by then the attempt's self-fence
        deadline, counted from the claim's first send, had passed."""
        opts = self.run.options
        window = (opts.lease_ms - opts.heartbeat_ms) / 1000
        found = []
        for ex in runs:
            key = (self.service.store_name(ex.job), ex.slot, ex.attempt, ex.instance)
            claimed = self.claimed.get(key)
            if claimed is None or ex.start <= claimed / 1000 + window + self.slack:
                continue
            if self.frozen_between(ex.instance, claimed / 1000, ex.start):
                continue
            counts.past_fence += 1
            text = (
                f"{spec.name} slot {ex.slot} ({iso_utc(ex.slot)}): attempt {ex.attempt} on "
                f"{ex.instance} started {ex.start * 1000 - claimed:.0f} ms after the store "
                f"recorded its claim (self-fence window {window * 1000:.0f} ms)"
            )
            lines = log_excerpt(self.run.logs, {ex.instance}, spec.name, ex.slot)
            found.append(Finding("past-fence", text, lines))
        return found

    def anyone_could_claim(self, spec: JobSpec, slot: int, *, lag: bool = True) -> bool:
        """Whether some instance was up, running and connected for part of its claim
        window: from the slot by its own clock (``lag=False``: by the true clock) to the
        slot's horizon (true time)."""
        horizon_end = (slot + spec.horizon_ms(slot)) / 1000
        for inst in self.instances.values():
            if inst.ready is None or inst.gone is None:
                continue
            due = slot - inst.offset_ms if lag else min(slot, slot - inst.offset_ms)
            start = max(due / 1000, inst.ready)
            end = min(horizon_end, inst.gone)
            blocked = [*inst.freezes, *self.run.pauses.get(inst.worker, [])]
            if start < end and not _covered(start, end, blocked):
                return True
        return False


def _covered(start: float, end: float, spans: Iterable[Span]) -> bool:
    """Whether the union of ``spans`` covers ``[start, end]``."""
    reach = start
    for a, b in sorted(spans):
        if a > reach:
            return False
        reach = max(reach, b)
        if reach >= end:
            return True
    return reach >= end


def log_excerpt(logs: Path, instances: set[str], job: str, slot: int, limit: int = 12) -> list[str]:
    """The log lines of ``instances`` that name the run ``job@slot``."""
    needle = f"{job}@{slot}"
    lines: list[str] = []
    for name in sorted(instances):
        path = logs / f"{name}.log"
        if path.exists():
            with open(path, encoding="utf-8", errors="replace") as log:
                lines += [line.rstrip() for line in log if needle in line]
    return sorted(lines)[:limit]
