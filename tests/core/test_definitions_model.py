"""Definitions and the finite schedules: every value checked at definition time, with
an error that names it and the accepted form; the JSON form round-trips."""

from __future__ import annotations

import datetime as dt

import pytest

from anarchon_core.definitions import (
    MAX_ARGUMENTS_BYTES,
    Definition,
    schedule_from_json,
)
from anarchon_core.errors import ConfigurationError
from anarchon_core.schedules import NO_SLOT, At, Cron, Every, Window, from_canonical
from anarchon_core.stored_jobs import plan_apply, read_file_definitions

T = 1_800_000_000_000  # 2027-01-15T08:00:00Z


def test_at_has_one_slot_and_then_none() -> None:
    at = At("2027-01-15T10:00:00+02:00")
    assert at.at_ms == T
    assert at.next_slot(T - 1) == T
    assert at.next_slot(T) == NO_SLOT
    assert at.slots_between(T - 1, T) == [T] and at.slots_between(T, T + 1) == []
    assert from_canonical(at.canonical()) == at
    assert at.describe() == "at 2027-01-15T08:00:00.000Z"
    assert At(dt.datetime(2027, 1, 15, 8, tzinfo=dt.UTC)) == At(T)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("2027-01-15T10:00:00", "no UTC offset"),
        ("tomorrow", "ISO 8601"),
        (True, "ISO 8601"),
        (10**17, "outside the years"),
    ],
)
def test_an_instant_without_an_offset_or_out_of_range_is_refused(value: object, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        At(value)  # type: ignore[arg-type]


def test_a_window_bounds_the_slots_of_its_schedule() -> None:
    window = Window(Every("1h"), start_at=T + 1, end_at=T + 3 * 3_600_000)
    assert window.next_slot(0) == T + 3_600_000  # start_at bounds the first slot
    assert window.slots_between(T - 1, T + 10 * 3_600_000) == [
        T + 3_600_000,
        T + 2 * 3_600_000,
        T + 3 * 3_600_000,  # end_at is the last instant a slot may have
    ]
    assert window.next_slot(T + 3 * 3_600_000) == NO_SLOT
    assert from_canonical(window.canonical()) == window
    assert Window(Cron("0 3 * * *"), end_at=T).next_slot(T + 1) == NO_SLOT
    with pytest.raises(ConfigurationError, match="before start_at"):
        Window(Every("1h"), start_at=T, end_at=T - 1)


def test_schedules_from_their_json_forms() -> None:
    assert schedule_from_json({"every": "10s", "offset": "2s"}) == Every("10s", "2s")
    assert schedule_from_json({"cron": "0 3 * * *", "tz": "Europe/Athens"}) == Cron(
        "0 3 * * *", "Europe/Athens"
    )
    assert schedule_from_json({"at": T}) == At(T)
    for bad in ({"every": "10s", "tz": "UTC"}, {"every": "1s", "cron": "* * * * *"}, "10s", {}):
        with pytest.raises(ConfigurationError, match=r"schedule .* is not valid"):
            schedule_from_json(bad)


def test_a_definition_round_trips_through_its_json_and_body() -> None:
    definition = Definition.create(
        "nightly",
        {"cron": "0 3 * * *", "tz": "Europe/Athens", "day_or": False},
        "reports.send",
        args=[42, "x"],
        kwargs={"fmt": "pdf"},
        options={"timeout_ms": 600_000, "catch_up": "all"},
        enabled=False,
        reason="maintenance",
        start_at="2027-01-01T00:00:00Z",
        end_at=T,
        description="the nightly report",
        target_options={"queue": "reports"},
        version=7,
    )
    assert Definition.from_json(definition.to_json()) == definition
    assert Definition.from_body(definition.body(), 7) == definition
    assert '"version"' not in definition.body()
    assert definition.effective_schedule.next_slot(T) == NO_SLOT
    assert definition.fingerprint() != definition.with_version(8).fingerprint()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"name": "a:b"}, "may not contain ':'"),
        ({"name": ""}, "definition name"),
        ({"target": "no spaces"}, "target"),
        ({"args": "42"}, "give a JSON array"),
        ({"kwargs": {"x": object()}}, "not JSON values"),
        ({"args": ["x" * MAX_ARGUMENTS_BYTES]}, "at most 16384"),
        ({"options": {"timeout": 5}}, "unknown option 'timeout'"),
        ({"options": {"retries": -1}}, "retries"),
        ({"enabled": "yes"}, "enabled"),
        ({"owner": "admin"}, "owner"),
        ({"description": "x" * 1001}, "at most 1000 characters"),
        ({"start_at": T, "end_at": T - 1}, "before start_at"),
        ({"colour": "red"}, "unknown key"),
    ],
)
def test_a_bad_value_is_refused_naming_it(change: dict[str, object], says: str) -> None:
    data = {"name": "nightly", "schedule": {"every": "1h"}, "target": "reports.send"}
    with pytest.raises(ConfigurationError, match=says):
        Definition.from_json({**data, **change})


def test_apply_plans_creates_updates_and_removals_and_refuses_code_jobs() -> None:
    def d(name: str, every: str, **kw: object) -> Definition:
        return Definition.create(name, Every(every), "reports.send", **kw)  # type: ignore[arg-type]

    current = [d("a", "1h", version=3), d("b", "1h", version=4), d("c", "1h", version=5)]
    namespace, wanted = read_file_definitions(
        {"namespace": "ns", "definitions": [d("a", "1h").to_json(), d("b", "2h").to_json()]}
    )
    assert namespace == "ns"
    plan = plan_apply(current, [*wanted, d("new", "1m")])
    assert [x.name for x in plan.create] == ["new"]
    assert [(x.name, x.version) for x in plan.update] == [("b", 4)]
    assert [(x.name, x.version) for x in plan.remove] == [("c", 5)]
    assert plan.unchanged == ["a"]
    assert not plan_apply(current, wanted, prune=False).remove
    with pytest.raises(ConfigurationError, match="more than once"):
        plan_apply(current, [d("a", "1h"), d("a", "2h")])
    with pytest.raises(ConfigurationError, match="a code job's"):
        plan_apply([d("a", "1h", owner="code", version=1)], [d("a", "2h")])
