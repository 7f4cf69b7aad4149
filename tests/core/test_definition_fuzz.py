"""Definition-time fuzzing: every input is refused clearly or round-trips exactly.

Job names, namespaces, durations, cron expressions, time zones and options are drawn
from well-formed, boundary, huge and garbage values and given to ``Scheduler(...)``,
``every()`` and ``cron()``. Each must either raise :class:`ConfigurationError` with a
short message (the bad value quoted briefly), or define a job whose description,
canonical text, next slots and dashboard row (``api.jobs``) are all computable, with
every duration small enough that a slot plus it is still a valid instant. Any other
exception (``OverflowError``, ``KeyError``, a ``ValueError`` of the standard library…)
fails the test.

``pytest --hypothesis-show-statistics`` reports how many inputs each test tried.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import zoneinfo
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from anarchon_core import stored_jobs
from anarchon_core.backend import InstanceInfo
from anarchon_core.backends.memory import MemoryBackend
from anarchon_core.durations import MAX_DURATION_MS, format_duration_ms, parse_duration_ms
from anarchon_core.engine.planner import jitter_bound_ms
from anarchon_core.errors import ConfigurationError
from anarchon_core.job import MAX_HORIZON_MS, JobOptions
from anarchon_core.records import iso_utc
from anarchon_core.scheduler import MAX_HEARTBEAT_MS, Scheduler
from anarchon_core.schedules import Cron, Every, from_canonical
from anarchon_core.web import api

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
NOW = (dt.datetime(2026, 12, 4, 12, 0, 7, tzinfo=dt.UTC) - EPOCH) // dt.timedelta(milliseconds=1)
INT64 = 2**63 - 1
#: The longest error message allowed: the accepted form plus a brief quote of the value.
MAX_MESSAGE = 700

FUZZ = settings(
    max_examples=800,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def handler(ctx: Any) -> None:
    """A valid handler: only the definition is under test."""


# -- checking one input -----------------------------------------------------------------


def refused_clearly(exc: ConfigurationError, *values: object) -> None:
    """The message is short and does not repeat a long bad value whole."""
    message = str(exc)
    assert message
    assert len(message) <= MAX_MESSAGE, message[:200]
    for value in values:
        if isinstance(value, str) and len(value) > 100:
            assert value not in message


def define(call: Callable[[], Any], *values: object, what: str = "job") -> Any:
    """``call()``'s result, or ``None`` when it raised a clear ConfigurationError.

    The outcome is a Hypothesis event (``--hypothesis-show-statistics``).
    """
    try:
        result = call()
    except ConfigurationError as exc:
        refused_clearly(exc, *values)
        event(f"{what} refused (ConfigurationError)")
        return None
    event(f"{what} defined")
    return result


def fits(slot: int, duration_ms: int | None) -> None:
    """A slot plus the duration is a valid instant: in int64 and as a datetime."""
    if duration_ms is None:
        return
    assert 0 <= duration_ms <= MAX_DURATION_MS
    assert slot + duration_ms <= INT64
    iso_utc(slot + duration_ms)
    iso_utc(slot - duration_ms)


def round_trips(scheduler: Scheduler, name: str) -> None:
    """Everything a defined job must offer: description, slots, registry spec, API row."""
    job = scheduler.jobs[name]
    schedule = job.schedule
    assert job.describe() and repr(schedule)
    again = from_canonical(schedule.canonical())
    assert again == schedule and again.fingerprint() == schedule.fingerprint()
    slots, after = [], NOW
    for _ in range(3):
        after = schedule.next_slot(after)
        slots.append(after)
    assert slots == sorted(set(slots)) and slots[0] > NOW
    assert schedule.slots_between(NOW, slots[-1]) == slots
    assert again.next_slot(NOW) == slots[0]
    for slot in slots:
        iso_utc(slot)
        options: JobOptions = job.options
        for duration in (
            options.jitter_ms,
            options.timeout_ms,
            options.retry_backoff_ms,
            options.catch_up_window_ms,
            options.misfire_grace_ms,
            job.horizon_ms(slot),
            scheduler.heartbeat_ms,
            scheduler.lease_ms,
            scheduler.grace_ms,
            scheduler.history_retention_ms,
        ):
            fits(slot, duration)
        retries = min(options.retries, options.max_attempts - 1)
        fits(slot, options.retry_backoff_ms * (2**retries - 1))
        assert 0 <= jitter_bound_ms(job, slot) <= min(options.jitter_ms, job.horizon_ms(slot))
    row = asyncio.run(api_row(scheduler, name))
    assert row["fingerprints"] == [job.fingerprint]
    if ":" in name:  # not storable (a definition's name holds no ':'): shown without one
        assert (row["schedule"], row["next_slots"]) == (None, [])
        return
    assert row["schedule"] == job.describe()
    assert [s["slot"] for s in row["next_slots"]][:3] == slots


async def api_row(scheduler: Scheduler, name: str) -> dict[str, Any]:
    """The dashboard's row of a job whose only live instance stored it at its start (the
    registry lists its fingerprint; the schedule is read from the stored definition)."""
    job = scheduler.jobs[name]
    backend = MemoryBackend(clock=lambda: NOW)
    await backend.open()
    report = await stored_jobs.sync_code_jobs(backend, {name: job}, scheduler.namespace)
    assert (report.not_storable if ":" in name else report.created) == [name]
    digest = {job.store_name: job.fingerprint}
    await backend.register(InstanceInfo("fuzz:1:abcdef", "host", 1, "test", NOW, NOW, digest), 1)
    data = await api.jobs(backend, now_ms=NOW)
    json.dumps(data)
    (row,) = data["jobs"]
    assert row["job"] == job.store_name
    return dict(row)


# -- strategies ---------------------------------------------------------------------------


def mostly(good: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` half of the time (``|`` would flatten and weigh every branch alike)."""
    return st.booleans().flatmap(lambda pick: good if pick else other)


NAME_CHARS = "ABCXYZabcxyz0189_.:-"
garbage_text = st.text(max_size=40) | st.text(alphabet=NAME_CHARS + " /\\\x00é{}%*", max_size=40)
huge_text = st.builds(lambda n, c: c * n, st.integers(150, 20_000), st.sampled_from("a:_ é"))
non_strings = st.none() | st.integers() | st.floats() | st.binary(max_size=10) | st.just([1])

job_names = (
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,40}", fullmatch=True)
    | st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{185,215}", fullmatch=True)
    | garbage_text
    | huge_text
    | non_strings
)
namespaces = (
    st.none()
    | st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,20}", fullmatch=True)
    | st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{150,210}", fullmatch=True)
    | garbage_text
    | huge_text
)

UNITS = ("d", "h", "m", "s", "ms")


@st.composite
def unit_strings(draw: st.DrawFn) -> str:
    """Mostly well-formed ``<n><unit>`` sequences, sometimes out of order or huge."""
    units = draw(st.lists(st.sampled_from(UNITS), min_size=1, max_size=5))
    if draw(st.booleans()):
        units = sorted(set(units), key=UNITS.index)
    numbers = st.integers(0, 100) | st.integers(0, 10**6) | st.integers(0, 10**30)
    return "".join(f"{draw(numbers)}{unit}" for unit in units)


valid_durations: st.SearchStrategy[Any] = st.integers(1, MAX_DURATION_MS).map(
    format_duration_ms
) | st.timedeltas(min_value=dt.timedelta(milliseconds=1), max_value=dt.timedelta(days=3650)).map(
    lambda d: d - d % dt.timedelta(milliseconds=1) or dt.timedelta(milliseconds=1)
)
durations: st.SearchStrategy[Any] = (
    valid_durations
    | unit_strings()
    | st.timedeltas(min_value=dt.timedelta(0), max_value=dt.timedelta(days=5000))
    | st.timedeltas()
    | st.integers()
    | st.floats()
    | st.text(alphabet="0123456789dhms .-+e", max_size=30)
    | garbage_text
    | huge_text
    | st.builds(lambda n: f"{n}d", st.integers(0, 10**40))
    | st.none()
)

CRON_WORDS = ["mon", "fri", "sun", "jan", "dec", "L", "W", "#", "?", "H", "R", "@hourly"]


@st.composite
def cron_fields(draw: st.DrawFn) -> str:
    """Cron-like text: fields of numbers, steps, ranges, lists and names."""

    def field() -> str:
        n = st.integers(0, 70)
        return draw(
            st.one_of(
                st.just("*"),
                st.builds(lambda step: f"*/{step}", n),
                st.builds(str, n),
                st.builds(lambda a, b: f"{a}-{b}", n, n),
                st.builds(lambda a, b, c: f"{a}-{b}/{c}", n, n, n),
                st.builds(lambda xs: ",".join(map(str, xs)), st.lists(n, min_size=1, max_size=4)),
                st.sampled_from(CRON_WORDS),
                st.builds(lambda w, k: f"{w}#{k}", st.sampled_from(["mon", "5"]), n),
            )
        )

    count = draw(st.sampled_from([5, 5, 5, 6, 4, 7]))
    return " ".join(field() for _ in range(count))


@st.composite
def valid_cron(draw: st.DrawFn) -> str:
    """Well-formed five- or six-field expressions, each field within its range."""

    def field(low: int, high: int) -> str:
        n = st.integers(low, high)
        return draw(
            st.one_of(
                st.just("*"),
                st.builds(lambda step: f"*/{step}", st.integers(1, high - low + 1)),
                st.builds(str, n),
                st.builds(lambda a, b: f"{min(a, b)}-{max(a, b)}", n, n),
                st.builds(lambda xs: ",".join(map(str, sorted(set(xs)))), st.lists(n, min_size=1)),
            )
        )

    fields = [field(0, 59), field(0, 23), field(1, 31), field(1, 12), field(0, 6)]
    if draw(st.booleans()) and draw(st.booleans()):
        fields.append(field(0, 59))
    return " ".join(fields)


cron_expressions: st.SearchStrategy[Any] = (
    cron_fields()
    | st.sampled_from(["@daily", "@hourly", "@yearly", "@reboot", "0 0 29 2 *", "0 0 30 2 *"])
    | st.text(alphabet="0123456789*/,-LW#? monfrijadec@", max_size=40)
    | garbage_text
    | huge_text
    | non_strings
)

ZONES = sorted(zoneinfo.available_timezones())
time_zones: st.SearchStrategy[Any] = (
    st.sampled_from(["UTC", "America/New_York", "Pacific/Apia", "Australia/Lord_Howe"])
    | st.sampled_from(ZONES)
    | st.sampled_from(["localtime", "utc", "Etc/GMT+14", "../etc/passwd", "Europe/", ""])
    | garbage_text
    | huge_text
    | non_strings
)

option_values: st.SearchStrategy[Any] = (
    st.integers(-5, 5000)
    | st.integers(-(10**25), 10**25)
    | st.sampled_from([MAX_DURATION_MS, MAX_DURATION_MS + 1, MAX_HORIZON_MS, 1023, 1024, 10**19])
    | st.builds(lambda n: 2**n, st.integers(0, 5000))
    | st.booleans()
    | st.floats()
    | st.none()
    | durations
)
#: Per option, values it accepts (mostly): drawn half of the time, else anything.
JOB_OPTION_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "jitter_ms": st.integers(0, MAX_DURATION_MS),
    "timeout_ms": st.none() | st.integers(1, MAX_DURATION_MS),
    "max_attempts": st.integers(1, 1023),
    "retries": st.integers(0, 1022),
    "retry_backoff_ms": st.integers(0, MAX_HORIZON_MS),
    "misfire_grace_ms": st.none() | st.integers(1, MAX_HORIZON_MS),
    "catch_up": st.sampled_from(["none", "latest", "all"]),
    "overlap": st.sampled_from(["skip", "allow"]),
    "catch_up_window": st.integers(1, MAX_HORIZON_MS).map(format_duration_ms),
}
SCHEDULER_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "heartbeat_ms": st.integers(1, MAX_HEARTBEAT_MS),
    "lease_ms": st.none() | st.integers(6000, MAX_DURATION_MS),
    "grace_ms": st.integers(0, MAX_DURATION_MS),
    "history_retention": valid_durations,
    "instance_id": st.text(min_size=1, max_size=250),
}


def options(values: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[tuple[str, Any]]:
    """(option name, value): the value mostly one the option accepts, else anything."""
    anything = option_values | garbage_text | huge_text
    return st.sampled_from(sorted(values)).flatmap(
        lambda key: st.tuples(st.just(key), mostly(values[key], anything))
    )


# -- tests ------------------------------------------------------------------------------------


@FUZZ
@given(name=job_names, namespace=namespaces)
@example(name="b:c", namespace="a")
@example(name="c", namespace="a:b")
@example(name="z" * 10_000, namespace=None)
def test_job_names_and_namespaces(name: Any, namespace: Any) -> None:
    scheduler = define(
        lambda: Scheduler(MemoryBackend(), namespace=namespace), namespace, what="scheduler"
    )
    if scheduler is None:
        assert namespace is not None
        return
    job = define(lambda: scheduler.every(name, "1m", handler), name, namespace)
    if job is None:
        return
    assert isinstance(name, str) and len(job.store_name) <= 200
    if namespace is None:
        assert job.store_name == name
    else:  # unambiguous: the namespace is everything before the first ':'
        assert job.store_name.partition(":")[::2] == (namespace, name)
    round_trips(scheduler, name)


@FUZZ
@given(first=st.tuples(namespaces, job_names), second=st.tuples(namespaces, job_names))
@example(first=("a", "b:c"), second=("a:b", "c"))
def test_distinct_definitions_never_share_a_store_name(
    first: tuple[Any, Any], second: tuple[Any, Any]
) -> None:
    names = []
    for namespace, name in (first, second):
        scheduler = define(
            lambda ns=namespace: Scheduler(MemoryBackend(), namespace=ns), what="scheduler"
        )
        job = scheduler and define(lambda s=scheduler, n=name: s.every(n, "1m", handler))
        if job is None:
            return
        names.append(job.store_name)
    assert (names[0] == names[1]) == (first == second)


@FUZZ
@given(interval=mostly(valid_durations, durations), offset=mostly(st.none(), durations))
@example(interval="99999999999999999999d", offset=None)
@example(interval="3650d", offset="3649d23h59m59s999ms")
@example(interval=dt.timedelta.max, offset=None)
@example(interval="1" * 5000 + "s", offset=None)
def test_every_durations(interval: Any, offset: Any) -> None:
    scheduler = Scheduler(MemoryBackend())
    job = define(lambda: scheduler.every("x", interval, handler, offset=offset), interval, offset)
    if job is None:
        return
    assert isinstance(job.schedule, Every)
    assert job.schedule.interval_ms == parse_duration_ms(
        format_duration_ms(job.schedule.interval_ms)
    )
    assert 0 < job.schedule.interval_ms <= MAX_DURATION_MS
    assert 0 <= job.schedule.offset_ms < job.schedule.interval_ms
    round_trips(scheduler, "x")


@settings(FUZZ, max_examples=400)
@given(
    expression=mostly(valid_cron(), cron_expressions),
    tz=mostly(st.sampled_from(ZONES), time_zones),
    day_or=st.booleans(),
)
@example(expression="30 2 * * *", tz="America/New_York", day_or=True)
@example(expression="0 0 29 2 mon", tz="UTC", day_or=False)
@example(expression="* * * * * */10", tz="Pacific/Apia", day_or=True)
@example(expression="0 " * 4000, tz="UTC", day_or=True)
def test_cron_expressions_and_zones(expression: Any, tz: Any, day_or: bool) -> None:
    scheduler = Scheduler(MemoryBackend())
    job = define(
        lambda: scheduler.cron("x", expression, handler, tz=tz, day_or=day_or), expression, tz
    )
    if job is None:
        return
    assert isinstance(job.schedule, Cron) and job.schedule.tz == tz
    round_trips(scheduler, "x")


@FUZZ
@given(option=options(JOB_OPTION_VALUES), at=st.sampled_from(["job", "both"]))
@example(option=("retry_backoff_ms", 10**19), at="job")
@example(option=("retries", 1022), at="job")
@example(option=("catch_up", "x" * 5000), at="both")
def test_job_options(option: tuple[str, Any], at: str) -> None:
    key, value = option
    defaults = {"max_attempts": 1023} if key == "retries" else {}
    scheduler = Scheduler(MemoryBackend(), **defaults)
    if at == "both":  # the same value as a scheduler default
        scheduler = define(
            lambda: Scheduler(MemoryBackend(), **{**defaults, key: value}), value, what="scheduler"
        )
        if scheduler is None:
            return
    job = define(lambda: scheduler.every("x", "1m", handler, **{key: value}), value)
    if job is None:
        return
    round_trips(scheduler, "x")


@FUZZ
@given(
    retries=st.integers(0, 1100),
    backoff=st.integers(0, 10**9) | st.integers(0, 2000),
    max_attempts=st.integers(1, 1023),
)
@example(retries=19, backoff=1000, max_attempts=1023)
@example(retries=20, backoff=1000, max_attempts=1023)
def test_retries_fit_before_the_claim_horizon(
    retries: int, backoff: int, max_attempts: int
) -> None:
    scheduler = Scheduler(MemoryBackend())
    options = {"retries": retries, "retry_backoff_ms": backoff, "max_attempts": max_attempts}
    job = define(lambda: scheduler.every("x", "1m", handler, **options))
    if job is None:
        return
    allowed = min(retries, max_attempts - 1)
    assert backoff * (2**allowed - 1) <= MAX_HORIZON_MS
    round_trips(scheduler, "x")


@FUZZ
@given(option=options(SCHEDULER_VALUES))
@example(option=("heartbeat_ms", 10**19))
@example(option=("heartbeat_ms", MAX_HEARTBEAT_MS + 1))
@example(option=("lease_ms", 2**70))
@example(option=("instance_id", "i" * 5000))
def test_scheduler_settings(option: tuple[str, Any]) -> None:
    key, value = option
    scheduler = define(lambda: Scheduler(MemoryBackend(), **{key: value}), value, what="scheduler")
    if scheduler is None:
        return
    scheduler.every("x", "1m", handler)
    round_trips(scheduler, "x")


# -- the findings these bounds fix, as plain tests ---------------------------------------------


def test_a_retry_backoff_beyond_the_store_columns_is_refused() -> None:
    """10**19 ms overflowed PostgreSQL's bigint at every finish: the run kept its lease."""
    with pytest.raises(ConfigurationError, match=r"retry_backoff_ms = 10000000000000000000 .*7d"):
        Scheduler(MemoryBackend(), retry_backoff_ms=10**19)
    with pytest.raises(ConfigurationError, match=r"retries=30 .* past the longest claim horizon"):
        Scheduler(MemoryBackend(), max_attempts=100).every("x", "1m", handler, retries=30)


def test_an_interval_beyond_the_calendar_is_refused() -> None:
    """It used to be accepted, and then ``api.jobs`` raised OverflowError for the cluster."""
    with pytest.raises(ConfigurationError, match="too long: at most 3650d"):
        Scheduler(MemoryBackend()).every("x", "99999999999999999999d", handler)


def test_a_long_name_is_quoted_briefly() -> None:
    with pytest.raises(ConfigurationError, match=r"\(10000 characters\)") as info:
        Scheduler(MemoryBackend()).every("z" * 10_000, "1m", handler)
    assert len(str(info.value)) < 300


def test_a_namespace_cannot_contain_the_separator() -> None:
    """Namespace ``a`` + job ``b:c`` and namespace ``a:b`` + job ``c`` were both ``a:b:c``."""
    with pytest.raises(ConfigurationError, match="may not contain ':'"):
        Scheduler(MemoryBackend(), namespace="a:b")
    job = Scheduler(MemoryBackend(), namespace="a").every("b:c", "1m", handler)
    assert job.store_name == "a:b:c"
