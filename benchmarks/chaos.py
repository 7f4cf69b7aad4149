"""Chaos on the real stores: do runs stay single and on time when links and processes fail?

Per store (SQLite file, PostgreSQL, Redis and a throwaway Valkey, both with the lease
strategy), ``--workers`` (4) worker processes run one :class:`anarchon_core.Scheduler`
each (``heartbeat_ms=200``, ``lease_ms=1200``, clock offset uniform in ±lease/2) with
the jobs of ``benchmarks/_chaos_jobs.py``: every 200 ms, 1 s and 2 s, handlers of
20-600 ms that honour cancellation and one that ignores it. Every handler records its
start and end in true wall time. For ``--seconds`` (600) the workers' links to the
server go through fault proxies that delay (up to 2 leases), cut or reset a reply with
probability ``--p`` (0.2), and a seeded chaos loop SIGSTOPs, SIGKILLs (and restarts)
workers and pauses links. SQLite has no link: there the faults are SIGSTOP, SIGKILL and
the clock offsets. ``--other-service`` (1) workers of a second service (namespace
``other``, jobs of its own) share each store behind faulty links of their own, never
stopped or killed: the main service's rankings must leave them out. ``--candidates``
(2, or ``none``) is every worker's ``candidates``. Then everything is stopped cleanly
and the store's history read.

Printed per store: slots due, ran, concurrent duplicates, late starts, missed slots,
takeovers and the faults injected, for the main service (the judged figures) and for
the other service. The exit status is 1 if any run of either service had a concurrent
duplicate (not counting a handler that ignored being fenced, nor a frozen runner) or
started late, 2 if a store failed to run.

Run: ``python -m benchmarks.chaos [--stores sqlite,postgres,redis,valkey --seconds 600
--p 0.2 --seed N --candidates 2|none --other-service 1]``; PostgreSQL from
``$ANARCHON_BENCH_POSTGRES`` (else the test server), Redis from
``$ANARCHON_BENCH_REDIS`` (else ``redis://127.0.0.1:6379/0``).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from ._chaos_analysis import Counts, Finding, StoreResult, analyse
from ._chaos_run import Options, run_store
from ._chaos_stores import STORES, StoreUnavailable, open_store
from ._util import machine, print_table

OUTCOME_HEADERS = (
    "store",
    "due",
    "ran",
    "concurrent dups",
    "fenced-ignoring",
    "frozen overlaps",
    "late starts",
    "late (frozen)",
    "past self-fence",
    "missed",
    "missed (cut off)",
    "cut off by lag",
    "missed (link faults)",
    "won, not started",
    "skipped/paused",
    "takeovers",
)
#: Misses printed per job and store (they are many under a high --p).
MISSED_SHOWN = 5
FAULT_HEADERS = (
    "store",
    "seconds",
    "instances",
    "SIGSTOP",
    "SIGKILL",
    "crashed",
    "link pauses",
    "links",
    "replies",
    "delayed",
    "cut",
    "reset",
)


def outcome_row(name: str, c: Counts) -> tuple[object, ...]:
    return (
        name,
        c.due,
        c.ran,
        c.duplicates,
        c.fenced_ignoring,
        c.frozen_overlaps,
        c.late,
        c.late_frozen,
        c.past_fence,
        c.missed,
        c.missed_cut_off,
        c.cut_off_by_lag,
        c.missed_link_faults,
        c.missed_claimed,
        c.skipped,
        c.takeovers,
    )


def fault_row(result: StoreResult) -> tuple[object, ...]:
    run, f = result.run, result.run.faults
    proxied = run.store.target is not None
    return (
        run.store.name,
        round(run.ended - run.began),
        sum(1 for inst in run.instances.values() if inst.service == "main"),
        run.actions["SIGSTOP"],
        run.actions["SIGKILL"],
        run.actions["crash"],
        run.actions["pause"] if proxied else "-",
        f.connections if proxied else "-",
        f.replies if proxied else "-",
        f.delayed if proxied else "-",
        f.cut if proxied else "-",
        f.reset if proxied else "-",
    )


def report_store(result: StoreResult, details: int) -> None:
    run = result.run
    main = {i for i, inst in run.instances.items() if inst.service == "main"}
    offsets = [run.instances[i].offset_ms for i in main]
    early = [
        e["t"] * 1000 - e["slot"]
        for e in run.events
        if e["e"] == "start" and e["t"] * 1000 < e["slot"] and e["instance"] in main
    ]
    others = len(run.instances) - len(main)
    print(
        f"{len(main)} instances of the main service (clock offsets "
        f"{min(offsets):+d}..{max(offsets):+d} ms), {others} of the other service, "
        f"{len(run.events)} events, {len(run.history)} history records; "
        f"{len(early)} main handler starts before their slot"
        + (f" (earliest {min(early):.0f} ms, by a worker clock ahead)" if early else "")
    )
    print_table(
        f"{run.store.name}: per job",
        ("job", *OUTCOME_HEADERS[1:], "ran again"),
        [(*outcome_row(job, c), c.ran_again) for job, c in result.per_job.items()],
    )
    _report_findings(run.store.name, result.findings, details)
    if result.other is not None:
        other = result.other
        print_table(
            f"{run.store.name}: the other service (namespace {other.service.namespace!r}, "
            "no chaos on its worker but its link's faults), per job",
            ("job", *OUTCOME_HEADERS[1:], "ran again"),
            [(*outcome_row(job, c), c.ran_again) for job, c in other.per_job.items()],
        )
        _report_findings(f"{run.store.name} (other)", other.findings, details)


def _report_findings(where: str, findings: list[Finding], details: int) -> None:
    shown: dict[tuple[str, str], int] = {}
    for finding in findings:
        key = (finding.kind, finding.job if finding.kind == "missed" else "")
        shown[key] = shown.get(key, 0) + 1
        if shown[key] <= _limit(finding.kind, details):
            print(f"  [{finding.kind}] {where}: {finding.text}")
            for line in finding.log_lines:
                print(f"      | {line}")
    for (kind, job), n in shown.items():
        if n > _limit(kind, details):
            print(f"  ... {n - _limit(kind, details)} more [{kind}] findings {job}".rstrip())


def keep_run(result: StoreResult, tmp: Path) -> None:
    """Beside the events and the logs: the store's history, the chaos actions, every
    link fault and the instances (for digging into a finding afterwards)."""
    run = result.run
    with open(tmp / "history.jsonl", "w", encoding="utf-8") as out:
        for record in run.history:
            out.write(json.dumps(record.to_json()) + "\n")
    with open(tmp / "chaos.jsonl", "w", encoding="utf-8") as out:
        for action in run.chaos_log:
            out.write(json.dumps(action) + "\n")
    instances = {
        i: {
            "worker": inst.worker,
            "service": inst.service,
            "offset_ms": inst.offset_ms,
            "spawned": inst.spawned,
            "ready": inst.ready,
            "gone": inst.gone,
            "killed": inst.killed,
            "freezes": inst.freezes,
        }
        for i, inst in run.instances.items()
    }
    meta = {
        "began": run.began,
        "ended": run.ended,
        "instances": instances,
        "pauses": run.pauses,
        "link_log": run.link_log,
    }
    (tmp / "run.json").write_text(json.dumps(meta))


def _other(result: StoreResult) -> Counts | None:
    return result.other.total if result.other is not None else None


def _failed(counts: Counts | None) -> bool:
    return counts is not None and bool(counts.duplicates or counts.late)


def _candidates(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


def _limit(kind: str, details: int) -> int:
    return min(details, MISSED_SHOWN) if kind == "missed" else details


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    parser.add_argument("--stores", default=",".join(STORES), help="comma-separated")
    parser.add_argument("--seconds", type=float, default=600, help="chaos time per store")
    parser.add_argument("--p", type=float, default=0.2, help="fault probability per reply")
    parser.add_argument("--seed", type=int, default=None, help="default: random, printed")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--jitter-ms", type=int, default=500)
    parser.add_argument(
        "--chaos-every", type=float, default=2.0, help="mean seconds between chaos actions"
    )
    parser.add_argument(
        "--slack-ms",
        type=int,
        default=50,
        help="late-start slack beyond horizon + clock lag (the engine's check to the handler)",
    )
    parser.add_argument(
        "--details",
        type=int,
        default=20,
        help="findings printed per kind (misses: at most 5 per job)",
    )
    parser.add_argument(
        "--candidates",
        type=_candidates,
        default=2,
        help="every worker's candidates: an int, or none (every instance claims)",
    )
    parser.add_argument(
        "--other-service",
        type=int,
        default=1,
        help="workers of a second service (namespace 'other', its own jobs) on each store",
    )
    parser.add_argument("--keep", action="store_true", help="keep the events and worker logs")
    args = parser.parse_args(argv)
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = [s for s in stores if s not in STORES]
    if unknown:
        parser.error(f"unknown store(s) {unknown}: choose from {', '.join(STORES)}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    options = Options(
        seconds=args.seconds,
        p=args.p,
        seed=seed,
        workers=args.workers,
        jitter_ms=args.jitter_ms,
        chaos_every_s=args.chaos_every,
        candidates=args.candidates,
        other_service=args.other_service,
    )
    # The store warns, on reading the history, that Redis runs without AOF: the servers
    # are never restarted here, so nothing depends on it.
    logging.getLogger("anarchon").setLevel(logging.ERROR)
    print(f"== chaos ==\n{machine()}")
    print(
        f"seed {seed}, {args.seconds:g} s per store, p={args.p:g} per reply, {args.workers} "
        f"workers, heartbeat {options.heartbeat_ms} ms, lease {options.lease_ms} ms, "
        f"clock offsets within ±{options.lease_ms // 2} ms, a chaos action every "
        f"{args.chaos_every:g} s on average; candidates={args.candidates}, "
        f"{args.other_service} worker(s) of another service",
        flush=True,
    )
    results: list[StoreResult] = []
    failed: list[str] = []
    for name in stores:
        tmp = Path(tempfile.mkdtemp(prefix=f"anarchon-chaos-{name}-"))
        started = time.monotonic()
        try:
            with open_store(name, tmp) as store:
                print(f"\n-- {name}: {store.description}", flush=True)
                result = analyse(run_store(store, options, tmp), args.slack_ms)
                if args.keep:
                    keep_run(result, tmp)
            report_store(result, args.details)
            results.append(result)
            print(f"[{name}: {time.monotonic() - started:.0f} s]", flush=True)
        except StoreUnavailable as exc:
            print(f"\n-- {name}: SKIPPED, the server is unavailable: {exc}", flush=True)
        except Exception:
            traceback.print_exc()
            print(f"\n-- {name}: FAILED to run (see the traceback above)", flush=True)
            failed.append(name)
        finally:
            if args.keep:
                print(f"events and logs kept in {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)
    if not results:
        print("\nno store ran")
        return 2 if failed else 0
    print_table(
        f"chaos outcomes (seed {seed}, p={args.p:g})",
        OUTCOME_HEADERS,
        [outcome_row(r.run.store.name, r.total) for r in results],
    )
    others = [(r.run.store.name, r.other) for r in results if r.other is not None]
    if others:
        print_table(
            "the other service's outcomes (reported, judged for duplicates and late starts)",
            OUTCOME_HEADERS,
            [outcome_row(name, o.total) for name, o in others],
        )
    print_table(
        "faults injected (the main service's instances and links)",
        FAULT_HEADERS,
        [fault_row(r) for r in results],
    )
    for r in results:
        if r.other is not None and r.run.store.target is not None:
            f = r.run.other_faults
            print(
                f"{r.run.store.name}: the other service's links: {f.replies:,} replies, "
                f"{f.delayed:,} delayed, {f.cut:,} cut, {f.reset:,} reset"
            )
    print(
        f"\nlate starts: later than slot + horizon (the gap to the next slot) + the starting\n"
        f"  worker's clock lag + {args.slack_ms} ms slack\n"
        f"past self-fence: started more than lease - heartbeat + {args.slack_ms} ms after the\n"
        "  store recorded the claim\n"
        "missed (cut off): no instance was up, running and connected in its claim window;\n"
        "  cut off by lag: one was, but its clock lagged by more than the horizon\n"
        "missed (link faults): not cut off, but the link of every instance that could claim\n"
        "  had a reply cut, reset or delayed in its claim window\n"
        "won, not started: missed, with a store record (an answer that came too late\n"
        "  starts nothing)"
    )
    bad = [r.run.store.name for r in results if _failed(r.total) or _failed(_other(r))]
    if bad:
        print(f"FAILED: concurrent duplicates or late starts on {', '.join(bad)}")
        return 1
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
