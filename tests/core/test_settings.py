"""The scheduler settings reader that the Django and Celery adapters share."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect

from anarchon_core import Scheduler
from anarchon_core.job import JobOptions
from anarchon_core.settings import SCHEDULER_SETTINGS, read_settings


def upper(name: str) -> str:
    return name.upper()


def test_valid_values_are_returned_by_setting_name() -> None:
    raw = {"JITTER_MS": 0, "HISTORY_RETENTION": dt.timedelta(days=2), "CANDIDATES": None}
    values, problems = read_settings(raw, spell=upper)
    assert problems == []
    assert values == {"jitter_ms": 0, "history_retention": dt.timedelta(days=2), "candidates": None}


def test_every_problem_is_reported_with_its_key_and_form() -> None:
    raw = {"JITER_MS": 5, "GRACE_MS": -1, "ENABLED": "yes", "OWN": 1}
    values, problems = read_settings(raw, spell=upper, own=("OWN",), defaults={"grace_ms": 10})
    assert values == {}
    assert [(p.key, p.unknown) for p in problems] == [
        ("JITER_MS", True),
        ("GRACE_MS", False),
        ("ENABLED", False),
    ]
    assert "did you mean 'JITTER_MS'?" in problems[0].hint
    assert str(problems[1]) == (
        "GRACE_MS = -1 is not valid: give an int of milliseconds >= 0 and <= "
        "315360000000 (default: 10)"
    )


def test_the_lease_is_checked_against_the_heartbeat_given() -> None:
    values, problems = read_settings({"HEARTBEAT_MS": 1000, "LEASE_MS": 1500}, spell=upper)
    assert values == {"heartbeat_ms": 1000}
    assert "LEASE_MS = 1500" in problems[0].message
    assert ">= 2 × HEARTBEAT_MS" in problems[0].hint
    values, problems = read_settings({"HEARTBEAT_MS": 500, "LEASE_MS": 1500}, spell=upper)
    assert (values, problems) == ({"heartbeat_ms": 500, "lease_ms": 1500}, [])


def test_only_limits_the_settings_a_host_reads() -> None:
    _, problems = read_settings({"ENABLED": True}, spell=upper, only=("jitter_ms",))
    assert [(p.key, p.unknown) for p in problems] == [("ENABLED", True)]


def test_a_huge_bad_value_is_quoted_briefly() -> None:
    _, problems = read_settings({"NAMESPACE": "x " * 10_000}, spell=upper)
    assert len(problems[0].message) < 200


def test_every_setting_is_a_scheduler_keyword_or_a_job_default() -> None:
    keywords = set(inspect.signature(Scheduler).parameters)
    job_defaults = {f.name for f in dataclasses.fields(JobOptions)}
    assert set(SCHEDULER_SETTINGS) <= keywords | job_defaults
