"""The ``anarchon`` command line, mostly through the real ``python -m anarchon_core``.

Subprocesses matter here: importing ``MODULE:ATTR`` from the current directory, exit
codes, and SIGTERM handling are properties of a real process, not of ``main()``.
Cheap argument checks call ``main()`` in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from processes import wait_until

from anarchon_core.backend import ClaimRequest, Lease
from anarchon_core.backends import backend_from_url
from anarchon_core.cli import CliError, add_commands, exit_code, main, parse_time_ms
from anarchon_core.errors import BackendError, ConfigurationError
from anarchon_core.records import HistoryQuery, Origin, RunRecord, Status

ROOT = Path(__file__).resolve().parents[2]
RECORD_KEYS = {
    "job", "slot", "scheduled_at", "attempt", "origin", "status", "instance_id",
    "claimed_at", "started_at", "finished_at", "duration_ms", "lateness_ms", "error",
    "error_summary", "meta",
}  # fmt: skip

JOBS_MODULE = """
from anarchon_core import Scheduler

scheduler = Scheduler("memory://", namespace="svc")
not_a_scheduler = 42

@scheduler.every("sync", "10s")
def sync(ctx):
    pass

@scheduler.cron("nightly", "30 2 * * *", tz="America/New_York")
def nightly(ctx):
    pass
"""

RUN_MODULE = """
import time
from anarchon_core import Scheduler

scheduler = Scheduler(heartbeat_ms=300)

@scheduler.every("quick", "200ms")
def quick(ctx):
    pass

@scheduler.every("stubborn", "1s")
def stubborn(ctx):
    time.sleep(8)  # ignores ctx on purpose: only the grace period ends its wait
"""

GRACE_MS = 500


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("ANARCHON_BACKEND", "ANARCHON_ENABLED")}
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), out.get("PYTHONPATH")) if p)
    return out


def cli(*args: str, cwd: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "anarchon_core", *args],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"  # an absolute path gives sqlite:////...


def read_history(url: str, query: HistoryQuery | None = None) -> list[RunRecord]:
    async def go() -> list[RunRecord]:
        backend = backend_from_url(url)
        await backend.open()
        try:
            return await backend.history(query or HistoryQuery(limit=10_000))
        finally:
            await backend.close()

    return asyncio.run(go())


# -- jobs -------------------------------------------------------------------------


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Path:
    (tmp_path / "myjobs.py").write_text(JOBS_MODULE)
    return tmp_path


def test_jobs_imports_from_cwd_and_lists_next_slots(jobs_dir: Path) -> None:
    result = cli("jobs", "myjobs:scheduler", "--count", "3", cwd=jobs_dir)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "2 job(s)" in out and "memory://" in out
    assert "every 10s" in out and "svc:sync" in out
    assert 'cron "30 2 * * *" (America/New_York)' in out and "svc:nightly" in out
    assert "America/New_York" in out and "UTC" in out
    slot_lines = [line.split() for line in out.splitlines() if line.rstrip().endswith("000")]
    assert len(slot_lines) == 6
    for parts in slot_lines:
        iso, ms = parts[-2], int(parts[-1])
        assert parse_time_ms(iso) == ms


def test_console_script_imports_from_cwd(jobs_dir: Path) -> None:
    """Unlike ``python -m``, a console script starts with its bin/ directory on sys.path."""
    script = Path(sys.executable).with_name("anarchon")
    if not script.exists():
        pytest.skip("the anarchon console script is not installed in this environment")
    result = subprocess.run(
        [str(script), "jobs", "myjobs:scheduler", "--count", "1"],
        cwd=jobs_dir, env=env(), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "svc:sync" in result.stdout


def test_jobs_json(jobs_dir: Path) -> None:
    result = cli("jobs", "myjobs:scheduler", "--json", "--count", "4", cwd=jobs_dir)
    assert result.returncode == 0, result.stderr
    jobs = {j["job"]: j for j in map(json.loads, result.stdout.splitlines())}
    assert set(jobs) == {"sync", "nightly"}
    sync = jobs["sync"]
    assert sync["store_name"] == "svc:sync" and sync["tz"] == "UTC"
    slots = sync["next_slots"]
    assert len(slots) == 4 and all(s % 10_000 == 0 for s in slots)
    assert [b - a for a, b in itertools.pairwise(slots)] == [10_000] * 3
    assert jobs["nightly"]["tz"] == "America/New_York"
    assert [parse_time_ms(t) for t in jobs["nightly"]["next_at"]] == jobs["nightly"]["next_slots"]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("myjobs", "not a valid target"),
        ("myjobs:scheduler:x", "not a valid target"),
        (":scheduler", "not a valid target"),
        ("myjobs:", "not a valid target"),
        ("my-jobs:scheduler", "not a valid target"),
        ("no_such_module_xyz:scheduler", "cannot import module 'no_such_module_xyz'"),
        ("myjobs:nope", "has no attribute 'nope'"),
        ("myjobs:not_a_scheduler", "not an anarchon Scheduler"),
        ("broken:scheduler", "importing 'broken' failed: ZeroDivisionError"),
    ],
)
@pytest.mark.parametrize("command", ["run", "jobs"])
def test_bad_targets_exit_2_with_one_line(
    command: str,
    target: str,
    message: str,
    jobs_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (jobs_dir / "broken.py").write_text("1 / 0\n")
    monkeypatch.chdir(jobs_dir)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("myjobs", "broken"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert main([command, target]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert target in err or "broken" in err
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_bad_target_in_a_real_process(tmp_path: Path) -> None:
    result = cli("run", "no_such_module_xyz:scheduler", cwd=tmp_path)
    assert result.returncode == 2
    assert "cannot import module 'no_such_module_xyz'" in result.stderr
    assert "Traceback" not in result.stderr
    debug = cli("run", "no_such_module_xyz:scheduler", "--debug", cwd=tmp_path)
    assert debug.returncode == 2 and "Traceback" in debug.stderr


# -- run --------------------------------------------------------------------------


@dataclass
class Ran:
    cwd: Path
    url: str
    returncode: int
    stop_seconds: float
    log: str


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    """One real ``anarchon run``, stopped with SIGTERM while a handler ignores its ctx."""
    cwd = tmp_path_factory.mktemp("run")
    (cwd / "runjobs.py").write_text(RUN_MODULE)
    url = sqlite_url(cwd / "run.sqlite3")
    log_path = cwd / "run.log"

    def ready() -> bool:
        if not (cwd / "run.sqlite3").exists():
            return False
        records = read_history(url)
        quick = [r for r in records if r.job == "quick" and r.status == Status.SUCCESS]
        stubborn = [r for r in records if r.job == "stubborn" and r.status == Status.RUNNING]
        return len(quick) >= 2 and bool(stubborn)

    with log_path.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "anarchon_core", "run", "runjobs:scheduler",
             "--backend", "sqlite:///run.sqlite3", "--instance-id", "t-1",
             "--grace-ms", str(GRACE_MS)],
            cwd=cwd, env=env(), stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until(ready, 15, "quick runs and a running stubborn handler")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
        stop_seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Ran(cwd, url, code, stop_seconds, log_path.read_text())


def test_run_stops_gracefully_within_the_grace_period(ran: Ran) -> None:
    assert ran.returncode == 0, ran.log
    # The stubborn handler would take 8 s; --grace-ms bounds the wait, then it is handed over.
    assert ran.stop_seconds < GRACE_MS / 1000 + 3, ran.log
    assert "anarchon started" in ran.log and "stopped" in ran.log
    assert "[t-1]" in ran.log and "INFO" in ran.log
    assert "Traceback" not in ran.log
    records = read_history(ran.url)
    assert {r.instance_id for r in records} == {"t-1"}
    assert sum(r.job == "quick" and r.status == Status.SUCCESS for r in records) >= 2
    stubborn = [r for r in records if r.job == "stubborn" and r.attempt >= 1]
    assert stubborn and all(r.status == Status.INTERRUPTED for r in stubborn)


def test_history_json_lines(ran: Ran) -> None:
    result = cli("history", "--backend", "sqlite:///run.sqlite3", "--json", cwd=ran.cwd)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines and all(set(line) == RECORD_KEYS for line in lines)
    assert all(line["status"] in {s.value for s in Status} for line in lines)
    slots = [line["slot"] for line in lines]
    assert slots == sorted(slots, reverse=True)  # newest first
    assert parse_time_ms(lines[0]["scheduled_at"]) == lines[0]["slot"]


def test_history_filters(ran: Ran) -> None:
    def history(*args: str) -> list[dict[str, object]]:
        result = cli("history", "--backend", ran.url, "--json", *args, cwd=ran.cwd)
        assert result.returncode == 0, result.stderr
        return [json.loads(line) for line in result.stdout.splitlines()]

    assert {r["status"] for r in history("--status", "interrupted")} == {"interrupted"}
    assert {r["job"] for r in history("--job", "quick")} == {"quick"}
    assert len(history("--limit", "1")) == 1
    assert history("--since", "2999-01-01T00:00:00Z") == []
    assert history("--until", "2000-01-01") == []
    slot = history("--limit", "1")[0]["slot"]
    assert isinstance(slot, int)
    newest = history("--since", str(slot))
    assert newest and {r["slot"] for r in newest} == {slot}
    assert all(
        isinstance(r["slot"], int) and r["slot"] < slot for r in history("--until", str(slot))
    )
    assert history("--since", "1d")  # a duration means that long ago


def test_history_table(ran: Ran) -> None:
    result = cli("history", "--backend", ran.url, cwd=ran.cwd)
    assert result.returncode == 0, result.stderr
    header, rule, *rows = result.stdout.splitlines()
    for column in ("JOB", "SCHEDULED (UTC)", "ATT", "STATUS", "INSTANCE", "DURATION", "ORIGIN"):
        assert column in header
    assert set(rule.replace(" ", "")) == {"-"}
    assert rows and max(map(len, result.stdout.splitlines())) <= 120
    assert any("interrupted" in row and "t-1" in row for row in rows)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--status", "bogus"], "invalid choice: 'bogus'"),
        (["--since", "1700000000"], "looks like epoch seconds"),
        (["--until", "yesterday"], "is not a time"),
        (["--limit", "0"], "integer >= 1"),
    ],
)
def test_history_rejects_bad_arguments(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["history", "--backend", "memory://", *args]) == 2
    assert message in capsys.readouterr().err


def test_status_choices_are_the_status_words(tmp_path: Path) -> None:
    result = cli("history", "--status", "done", cwd=tmp_path)
    assert result.returncode == 2
    for status in Status:
        assert status.value in result.stderr


def test_run_refused_at_start_exits_2(jobs_dir: Path) -> None:
    """An AnarchonError at start (here: a store written by a newer anarchon) is exit 2."""
    db = jobs_dir / "newer.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE anarchon_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO anarchon_meta VALUES ('schema_version', '999')")
    conn.close()
    result = cli("run", "myjobs:scheduler", "--backend", sqlite_url(db), cwd=jobs_dir)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("anarchon run: ") and "schema version 999" in last
    assert "Traceback" not in result.stderr
    health = cli("health", "--backend", sqlite_url(db), cwd=jobs_dir)
    assert health.returncode == 1 and "schema version 999" in health.stderr


# -- prune, health --------------------------------------------------------------------


def test_prune_keeps_latest_and_counts(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "prune.sqlite3")

    async def populate() -> None:
        backend = backend_from_url(url)
        await backend.open()
        now = await backend.now_ms()
        try:
            for job in ("a", "b"):
                for k in (3, 2, 1):
                    slot = now - k * 3_600_000
                    token = f"{job}{k}"
                    claim = await backend.claim(
                        ClaimRequest(job, slot, Origin.SCHEDULE, token, "i", 10_000,
                                     horizon_ms=10**9, skip_overlap=False)
                    )  # fmt: skip
                    assert claim.attempt == 1
                    assert await backend.finish(Lease(job, slot, 1, token), Status.SUCCESS)
        finally:
            await backend.close()

    asyncio.run(populate())
    result = cli("prune", "--backend", url, "--older-than", "30m", "--all", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("4 history record(s) pruned")
    assert "every job" in result.stdout
    remaining = read_history(url)
    assert sorted(r.job for r in remaining) == ["a", "b"]  # each job's latest record stays
    again = cli("prune", "--backend", url, "--older-than", "30m", "--all", cwd=tmp_path)
    assert again.stdout.startswith("0 history record(s) pruned")
    bad = cli("prune", "--backend", url, "--older-than", "7", "--all", cwd=tmp_path)
    assert bad.returncode == 2 and "bare number" in bad.stderr


def _finished_runs(url: str, jobs: tuple[str, ...]) -> None:
    """Three finished hourly runs of each job, the latest an hour ago."""

    async def populate() -> None:
        backend = backend_from_url(url)
        await backend.open()
        now = await backend.now_ms()
        try:
            for job in jobs:
                for k in (3, 2, 1):
                    slot = now - k * 3_600_000
                    token = f"{job}{k}"
                    await backend.claim(
                        ClaimRequest(job, slot, Origin.SCHEDULE, token, "i", 10_000,
                                     horizon_ms=10**9, skip_overlap=False)
                    )  # fmt: skip
                    assert await backend.finish(Lease(job, slot, 1, token), Status.SUCCESS)
        finally:
            await backend.close()

    asyncio.run(populate())


def _counts(url: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in read_history(url):
        counts[record.job] = counts.get(record.job, 0) + 1
    return counts


def test_prune_needs_a_scope(tmp_path: Path) -> None:
    """A store is shared by services: pruning every job must be asked for with --all."""
    url = sqlite_url(tmp_path / "scope.sqlite3")
    _finished_runs(url, ("a",))
    none = cli("prune", "--backend", url, "--older-than", "30m", cwd=tmp_path)
    assert none.returncode == 2
    assert "which jobs to prune is required" in none.stderr
    assert "--job NAME (repeatable), --namespace NS, or --all" in none.stderr
    both = cli("prune", "--backend", url, "--older-than", "1m", "--all", "--job", "a",
               cwd=tmp_path)  # fmt: skip
    assert both.returncode == 2 and "--job and --all exclude each other" in both.stderr
    colon = cli("prune", "--backend", url, "--older-than", "1m", "--namespace", "a:b",
                cwd=tmp_path)  # fmt: skip
    assert colon.returncode == 2 and "may not contain ':'" in colon.stderr
    long = cli("prune", "--backend", url, "--older-than", "1m", "--job", "x" * 5000,
               cwd=tmp_path)  # fmt: skip
    assert long.returncode == 2 and "(5000 characters)" in long.stderr
    assert len(long.stderr) < 500
    assert _counts(url) == {"a": 3}  # nothing was pruned


def test_prune_by_job_and_by_namespace(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "scoped.sqlite3")
    _finished_runs(url, ("billing:sync", "billing:report", "shop:sync", "plain"))
    jobs = cli("prune", "--backend", url, "--older-than", "30m", "--job", "plain",
               "--job", "shop:sync", cwd=tmp_path)  # fmt: skip
    assert jobs.returncode == 0, jobs.stderr
    assert jobs.stdout.startswith("4 history record(s) pruned")
    assert "plain, shop:sync" in jobs.stdout
    assert _counts(url) == {"billing:sync": 3, "billing:report": 3, "shop:sync": 1, "plain": 1}
    ns = cli("prune", "--backend", url, "--older-than", "30m", "--namespace", "billing",
             cwd=tmp_path)  # fmt: skip
    assert ns.returncode == 0, ns.stderr
    assert ns.stdout.startswith("4 history record(s) pruned") and "namespace billing" in ns.stdout
    assert _counts(url) == {"billing:sync": 1, "billing:report": 1, "shop:sync": 1, "plain": 1}


def test_health_exit_codes(tmp_path: Path) -> None:
    ok = cli("health", "--backend", sqlite_url(tmp_path / "h.sqlite3"), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: ")
    down = cli("health", "--backend", "sqlite:////proc/nope/x.db", cwd=tmp_path)
    assert down.returncode == 1
    assert "unhealthy" in down.stderr and "/proc/nope/x.db" in down.stderr
    assert "Traceback" not in down.stderr
    unknown = cli("health", "--backend", "nosuch://h/x", cwd=tmp_path)
    assert unknown.returncode == 2 and "unknown" in unknown.stderr


def test_health_uses_env_backend_and_refuses_a_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ANARCHON_BACKEND", "sqlite:////proc/nope/env.db")
    assert main(["health"]) == 1
    assert "/proc/nope/env.db" in capsys.readouterr().err
    assert main(["health", "nosuchmodule:scheduler"]) == 2


PROBE_MODULE = """
from anarchon_core import Scheduler

scheduler = Scheduler("sqlite:///probe.sqlite3", heartbeat_ms=100)
scheduler.every("hourly", "1h", lambda ctx: None)
"""


def test_health_is_a_liveness_probe_for_a_scheduler(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE_MODULE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "anarchon_core", "run", "probe:scheduler"],
        cwd=tmp_path, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(
            lambda: cli("health", "probe:scheduler", cwd=tmp_path).returncode == 0,
            15,
            "the instance to register",
        )
        proc.kill()
        proc.wait()
        time.sleep(0.5)  # > 3 heartbeats
        dead = cli("health", "probe:scheduler", cwd=tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert dead.returncode == 1
    assert "no instance of probe:scheduler" in dead.stderr and "3 heartbeats" in dead.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-03T08:00:00Z", 1_796_284_800_000),
        ("2026-12-03T08:00:00", 1_796_284_800_000),
        ("2026-12-03T10:00:00+02:00", 1_796_284_800_000),
        ("1796284800000", 1_796_284_800_000),
        ("0", 0),
    ],
)
def test_parse_time_ms(text: str, expected: int) -> None:
    assert parse_time_ms(text) == expected


def test_version_and_help(tmp_path: Path) -> None:
    version = cli("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("anarchon ")
    for command in ("run", "jobs", "history", "prune", "health", "demo"):
        helped = cli(command, "--help", cwd=tmp_path)
        assert helped.returncode == 0 and "--backend" in helped.stdout, command


def test_add_commands_offers_chosen_subcommands_on_a_fixed_target() -> None:
    """A framework's own command reuses the core's parsers (manage.py anarchon does)."""
    parser = argparse.ArgumentParser(prog="host")
    sub = parser.add_subparsers(dest="subcommand", required=True)
    made = add_commands(sub, ("run", "jobs", "history"), target="app:scheduler", default_store="X")
    assert set(made) == set(sub.choices) == {"run", "jobs", "history"}
    args = parser.parse_args(["jobs", "--count", "2"])
    assert (args.target, args.count, args.name, args.backend) == ("app:scheduler", 2, "jobs", None)
    assert args.command is made["jobs"].get_default("command")
    assert "default: X" in made["history"].format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "app:other"])  # the target is fixed: no positional
    with pytest.raises(SystemExit):
        parser.parse_args(["prune", "--older-than", "1d", "--all"])  # not offered


def test_pause_and_resume_refuse_an_unknown_job_unless_forced(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for command in ("pause", "resume"):
        assert main([command, "--backend", "memory://", "tik"]) == 1
        assert "job 'tik' is unknown" in capsys.readouterr().err
        assert main([command, "--force", "--backend", "memory://", "tik"]) == 0


def test_exit_codes_of_errors() -> None:
    assert exit_code(CliError("usage")) == 2 and exit_code(CliError("store", code=1)) == 1
    assert exit_code(ConfigurationError("bad")) == 2 and exit_code(BackendError("down")) == 1


# -- demo -------------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_shows_a_takeover(tmp_path: Path) -> None:
    started = time.monotonic()
    result = cli("demo", "--seconds", "10", cwd=tmp_path, timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "killed demo-" in out and "while it ran demo.long@" in out
    assert "<- takeover" in out and "OK: " in out
    takeovers = out.split("takeovers (", 1)[1]
    assert "attempt 2 on demo-" in takeovers
    assert "runs per instance" in out
    assert max(len(line) for line in out.splitlines()) <= 120
    assert elapsed < 40
    assert not list(tmp_path.iterdir())  # nothing left behind in the working directory


SECOND_SIGNAL_MODULE = """
import logging
import time
from anarchon_core import Scheduler

scheduler = Scheduler("sqlite:///second.sqlite3", instance_id="t-2", heartbeat_ms=300)

@scheduler.every("stubborn", "1s")
def stubborn(ctx):
    time.sleep(30)  # ignores ctx: only the hand-over ends its run

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    scheduler.run(grace_ms=60_000)
"""


def test_a_second_signal_hands_the_running_runs_over_at_once(tmp_path: Path) -> None:
    """``Scheduler.run()``: the first Ctrl-C waits for the running run (60 s of grace),
    the second hands it over at once: no traceback, and the run is recorded ended."""
    (tmp_path / "second.py").write_text(SECOND_SIGNAL_MODULE)
    url = sqlite_url(tmp_path / "second.sqlite3")
    log_path = tmp_path / "second.log"

    def running() -> bool:
        if not (tmp_path / "second.sqlite3").exists():
            return False
        return any(r.status == Status.RUNNING for r in read_history(url))

    with log_path.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "second.py"], cwd=tmp_path, env=env(), stdout=sink,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until(running, 15, "a running run")
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: "waiting up to 60.0 s" in log_path.read_text(), 15, "the grace wait")
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=15)
        seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = log_path.read_text()
    assert code == 0, log
    assert seconds < 10, log  # not the 60 s of grace, nor the handler's 30 s
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
    assert "a second Ctrl-C hands running runs over now" in log
    assert "stop hurried" in log
    records = read_history(url)
    assert records and all(r.status != Status.RUNNING for r in records), records


def test_cancel_takes_the_slot_as_the_history_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = sqlite_url(tmp_path / "cancel.sqlite3")
    slot = time.time_ns() // 60_000_000_000 * 60_000  # this minute: claimable now
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(slot // 1000))

    async def claim() -> None:
        backend = backend_from_url(url)
        await backend.open()
        try:
            await backend.claim(
                ClaimRequest("j", slot, Origin.SCHEDULE, "t", "i", 600_000,
                             horizon_ms=10**12, skip_overlap=False)
            )  # fmt: skip
        finally:
            await backend.close()

    asyncio.run(claim())
    assert main(["cancel", "j", iso, "--backend", url]) == 0
    assert f"cancelled j@{slot} ({iso[:-1]}.000Z)" in capsys.readouterr().out
    assert main(["cancel", "j", "yesterday", "--backend", url]) == 2
    err = capsys.readouterr().err
    assert "'yesterday' is not a time: give ISO-8601" in err and "epoch milliseconds" in err
    assert main(["cancel", "j", "9" * 40, "--backend", url]) == 2
    assert "is past the year 9899" in capsys.readouterr().err
