"""``anarchon_celery.Scheduler``: every beat maps ``beat_schedule`` and the ``anarchon_*``
settings to the same jobs (validated at start, with no I/O); the store picks one winner
per (job, slot), and only the winner sends the task.

Sends run in order in one daemon thread per beat, on beat's own publishing producer: a
thread and a producer-pool acquire per send cost about as much CPU as the send itself,
and beat is bound by one core (the GIL).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import difflib
import functools
import hashlib
import logging
import os
import queue
import re
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from itertools import groupby
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

from celery import beat  # type: ignore[import-untyped]
from celery.schedules import crontab, schedule, solar  # type: ignore[import-untyped]

from anarchon_core.backend import local_note
from anarchon_core.backends import backend_from_url, mask_url
from anarchon_core.background import BackgroundScheduler
from anarchon_core.context import RunContext
from anarchon_core.definitions import Definition, validate_target
from anarchon_core.errors import ConfigurationError
from anarchon_core.job import validate_option_keys
from anarchon_core.names import MAX_NAME_LENGTH, NAMESPACE_FORM, store_name, validate_job_name
from anarchon_core.redact import brief, brief_url
from anarchon_core.scheduler import Scheduler as CoreScheduler
from anarchon_core.schedules import Cron, Every, Schedule
from anarchon_core.settings import SCHEDULER_SETTINGS, Setting, one_of
from anarchon_core.settings import read_settings as read_core_settings

__all__ = [
    "TARGET_OPTION_KEYS",
    "TICK_SECONDS",
    "Scheduler",
    "cron_expression",
    "job_name",
    "send_options",
    "task_id_for",
]

logger = logging.getLogger("anarchon.celery")

#: The longest sleep ``tick()`` asks for, so beat notices a fatal engine error quickly.
TICK_SECONDS = 1.0
#: Most sends answered to the engine in one wake-up of its loop.
ANSWER_BATCH = 32
_TASK_ID_NAMESPACE = uuid.UUID("6f1c1f4e-3a5e-5a43-9d53-6e6172636860")

#: A queued send: the engine-loop future its run awaits, and the call.
_Send = tuple["asyncio.Future[None]", Callable[[], None]]
_Answer = tuple["asyncio.Future[None]", Exception | None]


def task_id_for(job: str, slot: int) -> str:
    """The deterministic Celery task id of a run: uuid5 of the store job name and slot."""
    return str(uuid.uuid5(_TASK_ID_NAMESPACE, f"{job}@{slot}"))


_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]+")

#: Per-entry keys of ``anarchon_entries``: the schedule's, then job options.
_JOB_OPTION_KEYS = ("jitter_ms", "catch_up", "max_attempts", "retries", "timeout_ms")
ENTRY_KEYS = ("tz", "offset", *_JOB_OPTION_KEYS)


def _entries(value: Any, _values: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
    if isinstance(value, Mapping) and all(isinstance(v, Mapping) for v in value.values()):
        return value
    raise ValueError


def _targets(value: Any, _values: Mapping[str, Any]) -> tuple[str, ...]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ValueError
    names = tuple(value)
    for name in names:
        validate_target(name)  # a ConfigurationError: reported as a bad value
    return names


#: The ``anarchon_*`` settings of this adapter, besides the core's (``anarchon_backend``,
#: ``anarchon_jitter_ms``, …). A ``None`` catch-up is the core's default (``"latest"``,
#: which a claim-only store ignores); a ``None`` backend is :func:`default_store`'s.
_NAMESPACE = SCHEDULER_SETTINGS["namespace"]
CELERY_SETTINGS: Mapping[str, Setting] = {
    "namespace": replace(_NAMESPACE, form=f"a name of {NAMESPACE_FORM} (default: the app's name)"),
    "catch_up": replace(SCHEDULER_SETTINGS["catch_up"], default=None),
    "entries": Setting(f"a dict of entry name -> dict of {', '.join(ENTRY_KEYS)}", _entries, {}),
    "task_id": Setting(
        "'deterministic' (uuid5 of job and slot) or 'random'",
        one_of("deterministic", "random"),
        "deterministic",
    ),
    "allow_local_tz": Setting("True or False", one_of(True, False), False),
    "targets": Setting(
        "a list of task names (1-200 characters of A-Z a-z 0-9 _ . : -) that stored "
        "definitions may name besides the app's tasks; they are sent by name",
        _targets,
        (),
    ),
}


def default_store(app: Any) -> str:
    """The store of a beat given no ``anarchon_backend``: ``$ANARCHON_BACKEND``, else the
    broker's Redis (shared by every beat, as redbeat does; keys under ``anarchon:``).

    :raises ConfigurationError: neither (a silent per-host file would send each entry
        once per host), saying what to set."""
    env = os.environ.get("ANARCHON_BACKEND")
    if env:
        return env
    broker = app.conf.broker_url
    first = broker.split(";", 1)[0].strip() if isinstance(broker, str) else ""
    parts = urlsplit(first)
    if parts.scheme in ("redis", "rediss"):
        # Only the server, credentials and database: kombu's own query options are not
        # redis-py's, and the lease strategy is the one that takes runs over.
        return urlunsplit((parts.scheme, parts.netloc, parts.path, "strategy=lease", ""))
    raise ConfigurationError(
        f"anarchon_backend is not set and the broker ({brief_url(broker or 'amqp://')}) is "
        "not Redis: set anarchon_backend (or $ANARCHON_BACKEND) to a store every beat "
        "shares, e.g. 'redis://host:6379/0' or 'postgresql://host/db', or to "
        "'sqlite:///anarchon.sqlite3' when every beat runs on this one host"
    )


def read_settings(app: Any) -> dict[str, Any]:
    """The ``anarchon_*`` settings by name, the store and namespace resolved.

    :raises ConfigurationError: listing every problem the core's reader found."""
    values, problems = settings_and_problems(app)
    if problems:
        raise ConfigurationError("; ".join(problems))
    return values


def settings_and_problems(app: Any) -> tuple[dict[str, Any], list[str]]:
    """The ``anarchon_*`` settings by name (a default where a value is bad) and every
    problem found, so that a start reports them all at once."""
    given = {
        str(key): value
        for key, value in app.conf.items()
        if str(key).lower().startswith("anarchon_") and value is not None
    }
    given.setdefault("anarchon_namespace", app.main)  # checked as if given
    values, found = read_core_settings(
        given, spell=lambda name: f"anarchon_{name}", extra=CELERY_SETTINGS
    )
    problems = [str(problem) for problem in found]
    if "anarchon_backend" not in given:
        try:
            values["backend"] = default_store(app)
        except ConfigurationError as exc:
            problems.append(str(exc))
    if given["anarchon_namespace"] is None:
        problems.append(
            "anarchon_namespace is not set and the Celery app has no main name: set "
            "anarchon_namespace (job names in the store are '{namespace}:{entry name}')"
        )
    return values, problems


def app_zone(app: Any, allow_local_tz: bool) -> str:
    """The IANA zone crontab entries are evaluated in, as Celery does (``app.timezone``)."""
    tz = app.conf.timezone or ("UTC" if app.conf.enable_utc else None)
    if tz is None and not allow_local_tz:
        raise ConfigurationError(
            "enable_utc=False with no timezone means the machine's local zone, which may "
            "differ between beat hosts: set timezone = '<IANA zone>' (or "
            "anarchon_allow_local_tz = True to use this host's zone)"
        )
    if tz is None and (tz := _local_zone_name()) is None:
        raise ConfigurationError(
            "anarchon_allow_local_tz = True but this host's IANA zone cannot be determined "
            "(neither TZ nor /etc/localtime names one): set timezone = '<IANA zone>'"
        )
    key = getattr(tz, "key", None) or getattr(tz, "zone", None) or tz
    if not isinstance(key, str):
        raise ConfigurationError(f"timezone {tz!r} is not valid: give an IANA zone name")
    return key


def _local_zone_name() -> str | None:
    tz = os.environ.get("TZ", "").lstrip(":")
    if (tz and "/" in tz) or tz == "UTC":
        return tz
    with contextlib.suppress(OSError):
        _, marker, name = str(Path("/etc/localtime").resolve()).partition("zoneinfo/")
        return name if marker else None
    return None


def job_name(entry: str, namespace: str) -> str:
    """The job name of a beat entry: the name itself when the core accepts it within the
    store name's length (``"{namespace}:{job name}"``), else a stable slug plus a hash."""
    room = MAX_NAME_LENGTH - len(namespace) - 1
    if len(entry) <= room:
        with contextlib.suppress(ConfigurationError):
            return validate_job_name(entry)
    digest = hashlib.sha256(entry.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    slug = _UNSAFE.sub("-", entry).strip("-_.:")
    slug = slug[: room - len(digest) - 1].rstrip("-_.:") or "entry"
    return f"{slug}-{digest}"


def _compress(values: set[int], low: int, high: int) -> str:
    """A cron field for an expanded Celery set: ``*`` when full, else ranges and numbers."""
    ordered = sorted(values)
    if ordered == list(range(low, high + 1)):
        return "*"
    runs = [[v for _, v in run] for _, run in groupby(enumerate(ordered), lambda p: p[1] - p[0])]
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def cron_expression(spec: Any) -> str:
    """The 5-field cron expression for a Celery ``crontab`` (from its expanded sets)."""
    sets = (spec.minute, spec.hour, spec.day_of_month, spec.month_of_year, spec.day_of_week)
    bounds = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
    return " ".join(_compress(values, *bound) for values, bound in zip(sets, bounds, strict=True))


_relative_logged: set[str] = set()


def _listed(problems: list[str]) -> str:
    """Every configuration problem of a start, in one message."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems in the anarchon configuration:\n" + "\n".join(
        f"  - {problem}" for problem in problems
    )


def plan_entry(
    entry: Any, extra: Mapping[str, Any], zone: Callable[[], str]
) -> tuple[Schedule, dict[str, Any]]:
    """One ``ScheduleEntry`` and its ``anarchon_entries`` keys as a schedule and job
    options (``zone()``: the app's); refuse what cannot map (the caller names the entry)."""
    name, spec, kind = entry.name, entry.schedule, type(entry.schedule)
    own = f"anarchon_entries[{name!r}]"
    unknown = sorted(set(extra) - set(ENTRY_KEYS))
    if unknown:
        hint = _did_you_mean(str(unknown[0]), ENTRY_KEYS)
        raise ConfigurationError(
            f"{own}: unknown key {unknown[0]!r}; {hint}accepted keys: " + ", ".join(ENTRY_KEYS)
        )
    if kind not in (schedule, crontab):
        what = "solar schedules are"
        if not isinstance(spec, solar):
            what = f"schedule {spec!r} ({kind.__name__}) is"
        raise ConfigurationError(
            f"{what} not supported by anarchon: use crontab or an interval (a number of "
            "seconds, a timedelta or celery.schedules.schedule)"
        )
    if spec.nowfun is not None:
        raise ConfigurationError(
            f"{kind.__name__}(nowfun=...) is not supported: anarchon computes slots from the "
            f"wall clock, crontab entries in an explicit zone (timezone or {own}['tz']); "
            "remove nowfun"
        )
    wrong, applies = ("tz", "crontab") if kind is schedule else ("offset", "interval")
    if wrong in extra:
        raise ConfigurationError(f"{own}: key {wrong!r} applies to {applies} entries only")
    if kind is crontab:
        result: Schedule = Cron(
            cron_expression(spec), extra["tz"] if "tz" in extra else zone(), day_or=False
        )
    else:
        if spec.relative and name not in _relative_logged:
            _relative_logged.add(name)
            logger.debug("beat entry %r: relative=True is ignored: slots lie on the grid", name)
        result = Every(spec.run_every, extra.get("offset"))  # the core checks both
    options = {key: extra[key] for key in _JOB_OPTION_KEYS if key in extra}
    return result, validate_option_keys(options, own)


# -- stored definitions: Celery send options ----------------------------------------------

#: The keys a stored definition's ``target_options`` may hold: Celery's send options (as
#: django-celery-beat's ``PeriodicTask`` has them; ``expire_seconds`` is its name for
#: ``expires`` in seconds).
TARGET_OPTION_KEYS = (
    "queue",
    "exchange",
    "routing_key",
    "headers",
    "priority",
    "expires",
    "expire_seconds",
)
_MAX_PRIORITY = 255


def send_options(
    target_options: Mapping[str, Any], where: str = "target_options"
) -> dict[str, Any]:
    """The ``send_task`` options of a definition's ``target_options``.

    ``expires`` is a number of seconds from the send or an ISO 8601 instant with a UTC
    offset (as ``apply_async`` takes it); ``expire_seconds`` is the same as seconds.

    :raises ConfigurationError: an unknown key (with the closest accepted one and the
        list) or a bad value, naming ``where`` and the key."""
    unknown = sorted(set(target_options) - set(TARGET_OPTION_KEYS))
    if unknown:
        hint = _did_you_mean(str(unknown[0]), TARGET_OPTION_KEYS)
        raise ConfigurationError(
            f"{where}: unknown key {unknown[0]!r}; {hint}accepted keys: "
            + ", ".join(TARGET_OPTION_KEYS)
        )
    options: dict[str, Any] = {}
    for key in ("queue", "exchange", "routing_key"):
        if key in target_options:
            value = target_options[key]
            if not isinstance(value, str) or not value:
                _bad(where, key, value, "a non-empty string")
            options[key] = value
    if "headers" in target_options:
        headers = target_options["headers"]
        if not isinstance(headers, Mapping) or not all(isinstance(k, str) for k in headers):
            _bad(where, "headers", headers, "an object with string keys")
        options["headers"] = dict(headers)
    if "priority" in target_options:
        priority = target_options["priority"]
        if isinstance(priority, bool) or not isinstance(priority, int):
            _bad(where, "priority", priority, f"an integer from 0 to {_MAX_PRIORITY}")
        if not 0 <= priority <= _MAX_PRIORITY:
            _bad(where, "priority", priority, f"an integer from 0 to {_MAX_PRIORITY}")
        options["priority"] = priority
    if "expires" in target_options and "expire_seconds" in target_options:
        raise ConfigurationError(
            f"{where}: give expires or expire_seconds, not both (both set the message's expiry)"
        )
    if "expire_seconds" in target_options:
        options["expires"] = _seconds(where, "expire_seconds", target_options["expire_seconds"])
    if "expires" in target_options:
        value = target_options["expires"]
        options["expires"] = (
            _instant(where, value) if isinstance(value, str) else _seconds(where, "expires", value)
        )
    return options


def definition_send_options(definition: Definition, task: str) -> dict[str, Any]:
    """The send options of a stored definition naming ``task`` (see :func:`send_options`).

    The beat checks them when it plans the definition (a refusal is logged then, and
    each run fails with it) and again at each send."""
    where = f"definition {definition.name!r} (target {task!r}): target_options"
    return send_options(definition.target_options, where)


def _bad(where: str, key: str, value: Any, form: str) -> NoReturn:
    raise ConfigurationError(f"{where}: {key} {brief(value)} is not valid: give {form}")


_EXPIRES_FORM = "a number of seconds (>= 0) or an ISO 8601 instant with a UTC offset"


def _seconds(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        _bad(where, key, value, _EXPIRES_FORM if key == "expires" else "a number of seconds >= 0")
    return float(value)


def _instant(where: str, value: str) -> dt.datetime:
    try:
        instant = dt.datetime.fromisoformat(value)
    except ValueError:
        instant = None
    if instant is None or instant.utcoffset() is None:
        _bad(where, "expires", value, _EXPIRES_FORM)
    return instant


# -- sending ---------------------------------------------------------------------------


class _Sender:
    """One daemon thread (a send hanging on a dead broker cannot outlive the grace period)
    that runs the winners' sends in order, dropping those whose run was cancelled first.
    Outcomes reach the engine's loop in batches (one wake-up per :data:`ANSWER_BATCH` sends
    or when the queue runs dry): a wake-up per send cost as much as the rest of the hand-off.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Send | None] | None = None

    def submit(self, call: Callable[[], None]) -> asyncio.Future[None]:
        """Queue ``call``; the returned future (of the running loop) ends with it."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._queue is None:
                self._queue = queue.SimpleQueue()
                name = "anarchon-celery-send"
                threading.Thread(target=_serve, args=(self._queue,), name=name, daemon=True).start()
            self._queue.put((future, call))
        return future

    def close(self) -> None:
        """Let the thread end after the sends already queued (never waits for it)."""
        with self._lock:
            pending, self._queue = self._queue, None
        if pending is not None:
            pending.put(None)


def _serve(pending: queue.SimpleQueue[_Send | None]) -> None:
    answers: list[_Answer] = []
    while True:
        if answers and (len(answers) >= ANSWER_BATCH or pending.empty()):
            _answer(answers)
            answers = []
        send = pending.get()
        if send is None:
            break
        future, call = send
        if future.cancelled():  # read across threads: at worst sent, then dropped
            continue
        try:
            call()
            answers.append((future, None))
        except Exception as exc:  # delivered to the run, which records it
            answers.append((future, exc))
        except BaseException as exc:  # SystemExit & co. would end the engine's loop
            answers.append((future, RuntimeError(f"the send raised {exc!r}")))
    _answer(answers)


def _answer(answers: list[_Answer]) -> None:
    """Hand outcomes to their loops, one ``call_soon_threadsafe`` per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Answer]] = {}
    for answer in answers:
        by_loop.setdefault(answer[0].get_loop(), []).append(answer)
    for loop, batch in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: abandoned at stop
            loop.call_soon_threadsafe(_settle, batch)


def _settle(batch: list[_Answer]) -> None:
    """On the loop: end each send's future (unless its run gave up waiting)."""
    for future, exc in batch:
        if not future.done() and exc is not None:
            future.set_exception(exc)
        elif not future.done():
            future.set_result(None)


def _in_beat_service_start() -> bool:
    """Whether this call runs inside Celery's ``beat.Service.start`` (``celery beat``, or a
    worker's embedded beat), which constructs its scheduler before its loop."""
    start = beat.Service.start.__code__
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is start:
            return True
        frame = frame.f_back
    return False


class Scheduler(beat.Scheduler):  # type: ignore[misc]
    """Run ``beat_schedule`` through anarchon: each due task is sent by exactly one beat.

    The constructor and :meth:`setup_schedule` validate only (no I/O, no threads); the
    engine starts in a background thread at the first :meth:`tick`.

    :raises ConfigurationError: listing every problem of the configuration; constructed
        by ``celery beat`` (:class:`celery.beat.Service`), the message is logged once at
        ERROR instead, without a traceback, and :exc:`SystemExit` (status 1) stops beat.
    """

    def __init__(self, app: Any, *args: Any, lazy: bool = False, **kwargs: Any) -> None:
        self._settings: dict[str, Any] = {}
        self._core: CoreScheduler | None = None
        self._background: BackgroundScheduler | None = None
        self._lifecycle = threading.Lock()
        self._sender = _Sender()
        try:
            super().__init__(app, *args, lazy=lazy, **kwargs)
        except ConfigurationError as exc:
            if not _in_beat_service_start():
                raise
            # Beat would log it with its traceback at CRITICAL and re-raise it, and the
            # interpreter would print it again through beat's stderr proxy, a log line per
            # token. Beat constructs its scheduler before the loop that takes SystemExit
            # for a shutdown: SystemExit reaches the interpreter unlogged, status 1.
            logger.error("celery beat cannot start: %s", exc)
            raise SystemExit(1) from exc

    # -- set-up (no I/O) -------------------------------------------------------------
    def setup_schedule(self) -> None:
        """Read the entries as beat does and map every one; refuse what cannot map."""
        super().setup_schedule()
        settings, problems = settings_and_problems(self.app)
        entries = settings["entries"]
        problems += [
            f"anarchon_entries names {name!r}, which is not a beat_schedule entry; "
            f"{_did_you_mean(name, sorted(self.schedule))}"
            f"entries: {', '.join(sorted(self.schedule)) or '(none)'}"
            for name in sorted(set(entries) - set(self.schedule))
        ]
        given = {name: settings[name] for name in SCHEDULER_SETTINGS}
        try:
            given["backend"] = backend_from_url(settings["backend"])
        except ConfigurationError as exc:
            problems.append(str(exc))
            given["backend"] = "memory://"  # the entries are still checked
        if given["catch_up"] is None:  # the core's default, which claim-only stores ignore
            del given["catch_up"]
        core = CoreScheduler(**given)
        zone = functools.partial(app_zone, self.app, settings["allow_local_tz"])
        for name in sorted(self.schedule):
            try:
                spec, options = plan_entry(self.schedule[name], entries.get(name, {}), zone)
                job = job_name(name, settings["namespace"] or self.app.main or "celery")
                core.add_job(job, spec, self._handler(name), **options)
            except ConfigurationError as exc:
                text = str(exc)
                problems.append(
                    text if text.startswith("anarchon_entries") else f"beat entry {name!r}: {text}"
                )
        for task in self._target_names(settings["targets"]):
            check = functools.partial(definition_send_options, task=task)
            core.add_target(task, self._target(task), takes_definition=True, check=check)
        try:
            core.validate()  # lease-only options on a claim-only store: refuse now
        except ConfigurationError as exc:
            if not problems:
                raise  # alone: as it is (a CapabilityError)
            problems.append(str(exc))
        if problems:
            raise ConfigurationError(_listed(problems))
        self._settings, self._core = settings, core

    def _handler(self, entry_name: str) -> Any:
        async def send(ctx: RunContext) -> None:
            await self._sender.submit(lambda: self._send(entry_name, ctx))

        send.__name__ = send.__qualname__ = f"send:{entry_name}"
        return send

    def _target_names(self, extra: Iterable[str]) -> list[str]:
        """The targets stored definitions may name: the app's tasks and the tasks of the
        beat entries (Celery's own ``celery.*`` left out), and ``anarchon_targets``."""
        known = {str(name) for name in self.app.tasks}
        known |= {str(entry.task) for entry in self.schedule.values()}
        names = set(extra)
        for name in sorted(known - names):
            if name.startswith("celery."):
                continue
            try:
                validate_target(name)
            except ConfigurationError as exc:
                logger.debug("task %r cannot be a target of stored definitions: %s", name, exc)
                continue
            names.add(name)
        return sorted(names)

    def _target(self, task: str) -> Any:
        """The target ``task``: a won run of a stored definition naming it sends the task
        with the definition's arguments and ``target_options``."""

        async def send(ctx: RunContext, definition: Definition) -> None:
            options = definition_send_options(definition, task)
            args, kwargs = list(definition.args), dict(definition.kwargs)
            assert self._core is not None
            job = store_name(self._core.namespace, ctx.job)
            await self._sender.submit(
                lambda: self._publish(ctx, job, definition.name, task, args, kwargs, options)
            )

        send.__name__ = send.__qualname__ = f"send:{task}"
        return send

    def _send(self, entry_name: str, ctx: RunContext) -> None:
        """Send the entry's task (in the sender thread); a publish error fails the attempt."""
        assert self._core is not None
        entry = self.schedule[entry_name]
        args = beat._evaluate_entry_args(entry.args)
        kwargs = beat._evaluate_entry_kwargs(entry.kwargs)
        job = self._core.jobs[ctx.job].store_name
        self._publish(ctx, job, entry_name, entry.task, args, kwargs, dict(entry.options))

    def _publish(
        self,
        ctx: RunContext,
        job: str,
        label: str,
        task: str,
        args: Any,
        kwargs: Any,
        options: dict[str, Any],
    ) -> None:
        """Publish a won run of ``job`` (a beat entry's or a stored definition's, named
        ``label`` in the log), with its headers and task id, on beat's producer."""
        headers = {"celery_beat_task": True, **(options.get("headers") or {})}
        headers.update(anarchon_job=job, anarchon_slot=ctx.slot, anarchon_attempt=ctx.attempt)
        options["headers"] = headers
        if "task_id" not in options:
            random = self._settings["task_id"] == "random"
            options["task_id"] = str(uuid.uuid4()) if random else task_id_for(job, ctx.slot)
        ctx.meta["task_id"] = options["task_id"]
        ctx.logger.info("sending %s (%s) as %s", label, task, options["task_id"])
        self.app.send_task(task, args, kwargs, producer=self.producer, **options)

    # -- beat's loop ------------------------------------------------------------------
    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Start the engine on the first call, then say how long beat may sleep; raise when
        the engine failed for good (beat then stops)."""
        with self._lifecycle:
            if self._core is None:
                self.setup_schedule()
            if (background := self._background) is None:
                assert self._core is not None
                background = BackgroundScheduler(self._core)
                background.start()
                self._background = background
        failed = background.scheduler.failed
        if failed is not None:
            raise RuntimeError(f"anarchon stopped claiming: {failed}") from failed
        if not background.running:
            raise RuntimeError("the anarchon scheduler thread ended unexpectedly")
        return float(min(self.max_interval or TICK_SECONDS, TICK_SECONDS))

    def close(self) -> None:
        """Stop claiming, hand in-flight sends over within ``anarchon_grace_ms``; idempotent,
        never raises (nor does ``BackgroundScheduler.stop``)."""
        with self._lifecycle:
            background, self._background = self._background, None
        if background is not None:
            background.stop()
        self._sender.close()
        try:
            super().close()
        except Exception:
            logger.exception("beat: releasing the publishing connection failed")

    @property
    def info(self) -> str:
        """The banner line: store (masked), namespace and entry count. No I/O.

        A configuration error is only named: the real instance, constructed next, reports
        every problem (the banner's lazy instance has not read the entries)."""
        try:  # builds the store's adapter only: no connection is made
            settings = self._settings or read_settings(self.app)
            store = self._core.backend if self._core else backend_from_url(settings["backend"])
        except ConfigurationError:
            return "anarchon: configuration error (beat logs every problem and stops)"
        count = len(self._core.jobs) if self._core else len(self.app.conf.beat_schedule or {})
        targets = ""
        if self._core is not None:
            held = len(self._core.targets)
            targets = f", {held} task{'' if held == 1 else 's'} for stored definitions"
        return (
            f"anarchon: store {mask_url(settings['backend'])}{local_note(store)}, namespace "
            f"{settings['namespace']!r}, {count} entr{'y' if count == 1 else 'ies'}{targets}"
        )


def _did_you_mean(name: str, names: Sequence[str]) -> str:
    """``"did you mean 'x'? "`` for the closest of ``names``, or ``""``."""
    close = difflib.get_close_matches(name, names, n=1)
    return f"did you mean {close[0]!r}? " if close else ""
