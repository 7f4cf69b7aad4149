"""The settings reader that the Django and Celery adapters share."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect

import pytest

from anarchon_core import Scheduler
from anarchon_core.job import JobOptions
from anarchon_core.settings import SCHEDULER_SETTINGS, Setting, one_of, read_settings

DEFAULTS = {name: setting.default for name, setting in SCHEDULER_SETTINGS.items()}


def upper(name: str) -> str:
    return name.upper()


def test_valid_values_are_returned_by_setting_name_with_the_defaults() -> None:
    raw = {"JITTER_MS": 0, "HISTORY_RETENTION": dt.timedelta(days=2), "CANDIDATES": None}
    values, problems = read_settings(raw, spell=upper)
    assert problems == []
    assert values == {
        **DEFAULTS,
        "jitter_ms": 0,
        "history_retention": dt.timedelta(days=2),
        "candidates": None,
    }


def test_every_problem_is_reported_with_its_key_form_and_default() -> None:
    raw = {"JITER_MS": 5, "GRACE_MS": -1, "ENABLED": "yes", "BACKEND": ""}
    values, problems = read_settings(raw, spell=upper)
    assert values == DEFAULTS  # a bad value falls back to its default
    assert [(p.key, p.unknown) for p in problems] == [
        ("JITER_MS", True),
        ("BACKEND", False),
        ("GRACE_MS", False),
        ("ENABLED", False),
    ]
    assert "did you mean 'JITTER_MS'?" in problems[0].hint
    assert str(problems[2]) == (
        "GRACE_MS = -1 is not valid: give an int of milliseconds >= 0 and <= "
        "315360000000 (default: 10000)"
    )
    assert "default" not in problems[3].hint.replace("default on", "")  # None is not quoted


def test_the_defaults_are_the_schedulers_own() -> None:
    keywords = inspect.signature(Scheduler).parameters
    job = {f.name: f.default for f in dataclasses.fields(JobOptions)}
    for name, setting in SCHEDULER_SETTINGS.items():
        expected = keywords[name].default if name in keywords else job[name]
        assert setting.default == expected, name


def test_the_lease_is_checked_against_the_heartbeat_given_or_its_default() -> None:
    values, problems = read_settings({"HEARTBEAT_MS": 1000, "LEASE_MS": 1500}, spell=upper)
    assert (values["heartbeat_ms"], values["lease_ms"]) == (1000, None)
    assert "LEASE_MS = 1500" in problems[0].message
    assert ">= 2 × HEARTBEAT_MS" in problems[0].hint
    values, problems = read_settings({"HEARTBEAT_MS": 500, "LEASE_MS": 1500}, spell=upper)
    assert (values["heartbeat_ms"], values["lease_ms"], problems) == (500, 1500, [])
    _, problems = read_settings({"LEASE_MS": 3000}, spell=upper)  # 1.5 × the default
    assert [p.key for p in problems] == ["LEASE_MS"]


def test_a_hosts_own_settings_are_read_and_may_replace_a_default() -> None:
    extra = {
        "mode": Setting("'a' or 'b'", one_of("a", "b"), "a"),
        "catch_up": dataclasses.replace(SCHEDULER_SETTINGS["catch_up"], default=None),
    }
    values, problems = read_settings({"MODE": "b", "MODDE": 1}, spell=upper, extra=extra)
    assert (values["mode"], values["catch_up"]) == ("b", None)
    assert "did you mean 'MODE'?" in problems[0].hint
    _, problems = read_settings({"MODE": "c"}, spell=upper, extra=extra)
    assert str(problems[0]) == "MODE = 'c' is not valid: give 'a' or 'b' (default: 'a')"


@pytest.mark.parametrize(
    ("value", "ok"), [(True, True), (None, False), (1, False), ("True", False)]
)
def test_one_of_takes_only_the_choices_themselves(value: object, ok: bool) -> None:
    check = one_of(True, False)
    if ok:
        assert check(value, {}) is value
    else:
        with pytest.raises(ValueError):
            check(value, {})


def test_a_huge_bad_value_is_quoted_briefly() -> None:
    _, problems = read_settings({"NAMESPACE": "x " * 10_000}, spell=upper)
    assert len(problems[0].message) < 200


def test_every_setting_is_a_scheduler_keyword_or_a_job_default() -> None:
    keywords = set(inspect.signature(Scheduler).parameters)
    job_defaults = {f.name for f in dataclasses.fields(JobOptions)}
    assert set(SCHEDULER_SETTINGS) <= keywords | job_defaults
