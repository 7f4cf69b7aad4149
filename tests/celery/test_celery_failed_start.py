"""A start refused for its configuration: one message naming every problem, no traceback.

Celery's beat logs an exception escaping its start with its traceback at CRITICAL and
re-raises it, and the interpreter prints it again through beat's stderr proxy, one
``WARNING/MainProcess`` line per token: about 700 lines for one typo (issue 31).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from celery.beat import Service
from celery_cluster import celery_cluster, wait_until
from services import require_tcp

import anarchon_celery
from anarchon_core.errors import ConfigurationError

PROBLEMS = (
    "3 problems in the anarchon configuration:",
    "anarchon_jiter_ms is not a setting anarchon knows: did you mean 'anarchon_jitter_ms'?",
    "anarchon_entries names 'nosuch', which is not a beat_schedule entry",
    "anarchon_entries['every second']: unknown key 'jitter'; did you mean 'jitter_ms'?",
)
BAD = {"ANARCHON_TEST_BAD_CONFIG": "1"}
#: A log line of Celery's stderr proxy holding one token of a shredded traceback.
SHRED = re.compile(r"WARNING/MainProcess\] *\S* *$")


def assert_one_report(log: str) -> None:
    for problem in PROBLEMS:
        assert problem in log, f"{problem!r} missing from:\n{log}"
    assert log.count(PROBLEMS[0]) == 1, log  # once: neither the banner nor a traceback
    assert log.count("celery beat cannot start: ") == 1, log
    assert "Traceback (most recent call last)" not in log, log
    shreds = [line for line in log.splitlines() if SHRED.search(line)]
    assert not shreds, shreds


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["anarchon", "anarchon_celery:Scheduler"])
def test_a_bad_configuration_stops_beat_with_one_short_report(
    tmp_path: Path, scheduler: str
) -> None:
    require_tcp("Redis", "127.0.0.1", 6379)  # the broker (beat stops before using it)
    with celery_cluster(tmp_path) as c:
        beat = c.beat("beat", scheduler, env=BAD)
        assert beat.wait(60) == 1
        log = c.log("beat")
    assert_one_report(log)
    assert len(log.splitlines()) < 80, log  # 697 lines before issue 31
    assert "anarchon: configuration error (beat logs every problem and stops)" in log


@pytest.mark.slow
def test_a_bad_configuration_stops_an_embedded_beat_with_one_report(tmp_path: Path) -> None:
    require_tcp("Redis", "127.0.0.1", 6379)
    with celery_cluster(tmp_path) as c:
        c.spawn(
            "worker",
            "worker",
            "-B",
            "--scheduler",
            "anarchon_celery:Scheduler",
            "-P",
            "solo",
            "-Q",
            c.queue,
            "--without-mingle",
            "--without-gossip",
            "-s",
            str(tmp_path / "worker-schedule"),
            "-l",
            "info",
            env=BAD,
        )
        wait_until(lambda: PROBLEMS[-1] in c.log("worker"), 60, "the embedded beat's report")
        wait_until(lambda: "ready." in c.log("worker"), 30, "the worker")
        log = c.log("worker")
    assert_one_report(log)


def test_beats_service_exits_with_status_1_and_logs_the_problems_once(make_app, caplog):
    app = make_app(
        {"sync": {"task": "t", "schedule": 5}},
        anarchon_jiter_ms=5,
        anarchon_entries={"sync": {"jitter": 3}},
    )
    service = Service(app, scheduler_cls="anarchon_celery:Scheduler", remote_control=False)
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as raised:
        service.start()
    assert raised.value.code == 1
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.levelno == logging.ERROR and record.exc_info is None
    message = record.getMessage()
    assert message.startswith("celery beat cannot start: 2 problems in the anarchon")
    assert "did you mean 'anarchon_jitter_ms'?" in message
    assert "unknown key 'jitter'; did you mean 'jitter_ms'?" in message


def test_outside_beat_the_constructor_raises_the_error(make_app, caplog):
    app = make_app({"sync": {"task": "t", "schedule": 5}}, anarchon_jiter_ms=5)
    with pytest.raises(ConfigurationError, match="jitter_ms"):
        anarchon_celery.Scheduler(app=app)
    assert not caplog.records  # the caller reports it


def test_the_banner_names_a_configuration_error_without_repeating_it(make_app):
    app = make_app({"sync": {"task": "t", "schedule": 5}}, anarchon_jiter_ms=5)
    info = anarchon_celery.Scheduler(app=app, lazy=True).info
    assert info == "anarchon: configuration error (beat logs every problem and stops)"
