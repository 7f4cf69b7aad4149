"""The public ``Scheduler``: job definitions, configuration, and its life cycle.

Every replica builds the same scheduler with the same jobs; the store decides which
replica runs each slot. This module only validates and holds configuration; the
running state lives in :mod:`anarchon_core.engine` between ``start()`` and ``stop()``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import os
import secrets
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar, overload

from . import operations, stored_jobs
from .backend import LEASE_BACKENDS, Backend, InstanceInfo, local_note, wall_clock_ms
from .backends import DEFAULT_URL, backend_from_url
from .definitions import Definition, validate_target
from .durations import MAX_DURATION_MS, parse_duration_ms, validate_ms
from .engine import Engine, EngineConfig
from .engine.candidates import DEFAULT_CANDIDATES, MAX_CANDIDATES, check_candidates
from .errors import CapabilityError, ConfigurationError, SchedulerStateError
from .job import Handler, Job, JobOptions, check_retries, validate_option_keys
from .names import store_name, validate_namespace
from .records import HistoryQuery, RunRecord, Status
from .redact import brief
from .schedules import Cron, Every, Schedule
from .telemetry import Telemetry

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider
    from prometheus_client import CollectorRegistry

__all__ = [
    "DEFAULT_CANDIDATES",
    "MAX_CANDIDATES",
    "MAX_HEARTBEAT_MS",
    "MAX_INSTANCE_ID_LENGTH",
    "Scheduler",
    "check_candidates",
]

H = TypeVar("H", bound=Handler)
T = TypeVar("T")

logger = logging.getLogger("anarchon")

#: The longest ``instance_id``: it is stored with every history record.
MAX_INSTANCE_ID_LENGTH = 200
#: The longest heartbeat: the default lease (3 heartbeats) must be a valid duration.
MAX_HEARTBEAT_MS = MAX_DURATION_MS // 3

#: Options that only lease backends honour; naming one explicitly on a claim-only
#: backend is an error at start (the defaults degrade silently, as documented).
LEASE_ONLY_OPTIONS = {"catch_up": "none", "overlap": "allow"}


def default_instance_id() -> str:
    """``{hostname}:{pid}:{6 random hex}``: pid 1 repeats across container restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def env_enabled() -> bool:
    """``ANARCHON_ENABLED=0`` disables a process: one-off containers, shells, CI."""
    return os.environ.get("ANARCHON_ENABLED", "1").strip().lower() not in ("0", "false", "no")


class Scheduler:
    """Holds named jobs and runs each of their slots on exactly one instance.

    ``backend`` is a :class:`Backend`, a URL, or ``None`` for ``$ANARCHON_BACKEND``
    (else the embedded default ``sqlite:///anarchon.sqlite3``). Keyword arguments set
    the defaults of every job (``jitter_ms``, ``timeout_ms``, ``catch_up``,
    ``catch_up_window``, ``max_attempts``, ``retries``, ``retry_backoff_ms``,
    ``overlap``, ``misfire_grace_ms``); each job may override them.

    With ``prometheus_client`` installed the scheduler's events are metrics in
    ``metrics_registry`` (default: the process's registry), and with
    ``opentelemetry-api`` every handler call is a span of ``tracer_provider``
    (default: the global one); see :mod:`anarchon_core.telemetry`.

    ``candidates`` is how many instances claim each run (``None``: every instance):
    on lease stores the live instances of the registry are ranked per run by a hash,
    the top ``candidates`` claim at the slot and the next one after the jitter window
    (see ``docs/concepts.md``). Claim-only stores have no registry: every instance
    claims there.

    ``sync_code_jobs`` (default on): at start, once the store opens, store the code jobs
    as ``owner='code'`` definitions (see :meth:`sync_code_jobs`), where the dashboards,
    the API and the command line read their schedules and options: the registry lists
    each job's name and fingerprint only. Only changed definitions are written; a store
    that keeps no definitions is skipped, and an outage is logged, neither stops the
    start. Turn it off for a process that should not write to the job table.

    ``clock`` is the wall clock the engine reads, in epoch ms (default: the system's).
    Sleeps and self-fencing follow the event loop's clock, so a test that runs the loop
    on virtual time passes a clock derived from it (:class:`anarchon_core.testing.LoopClock`).
    """

    def __init__(
        self,
        backend: Backend | str | None = None,
        *,
        namespace: str | None = None,
        instance_id: str | None = None,
        heartbeat_ms: int = 2000,
        lease_ms: int | None = None,
        history_retention: str | dt.timedelta = "7d",
        grace_ms: int = 10_000,
        candidates: int | None = DEFAULT_CANDIDATES,
        enabled: bool | None = None,
        sync_code_jobs: bool = True,
        metrics_registry: CollectorRegistry | None = None,
        tracer_provider: TracerProvider | None = None,
        clock: Callable[[], int] | None = None,
        **job_defaults: Any,
    ) -> None:
        if backend is None:
            backend = os.environ.get("ANARCHON_BACKEND") or DEFAULT_URL
        self.backend: Backend = (
            backend if isinstance(backend, Backend) else backend_from_url(backend)
        )
        self.namespace = validate_namespace(namespace)
        given = _instance_id(instance_id)
        self.instance_id = given or default_instance_id()
        #: The pid that minted the default instance id (None when the id was given).
        self._minted_by: int | None = None if given else os.getpid()
        # The default lease is 3 heartbeats, and it must fit the duration bound too.
        self.heartbeat_ms = validate_ms(
            heartbeat_ms, "heartbeat_ms", minimum=1, maximum=MAX_HEARTBEAT_MS
        )
        self.lease_ms = (
            3 * self.heartbeat_ms
            if lease_ms is None
            else validate_ms(lease_ms, "lease_ms", minimum=1, optional=True)
        )
        if self.lease_ms < 2 * self.heartbeat_ms:
            raise ConfigurationError(
                f"lease_ms = {self.lease_ms} is not valid: it must be at least 2 × heartbeat_ms "
                f"({2 * self.heartbeat_ms}) so that one late heartbeat does not lose the run"
            )
        self.history_retention_ms = parse_duration_ms(history_retention, what="history_retention")
        self.grace_ms = validate_ms(grace_ms, "grace_ms")
        self.candidates = check_candidates(candidates)
        self.enabled = env_enabled() if enabled is None else bool(enabled)
        if not isinstance(sync_code_jobs, bool):
            raise ConfigurationError(
                f"sync_code_jobs {brief(sync_code_jobs)} is not valid: give True or False"
            )
        #: Whether a start stores the code jobs as ``owner='code'`` definitions.
        self.sync_at_start = sync_code_jobs
        checked = validate_option_keys(job_defaults, "Scheduler")
        self._defaults = check_retries(JobOptions(**checked), "Scheduler")
        self._explicit_defaults = frozenset(checked)
        self._jobs: dict[str, Job] = {}
        #: Handlers that stored definitions may name, by target name.
        self._targets: dict[str, Callable[..., Any]] = {}
        #: The targets called as ``handler(ctx, definition)``.
        self._whole_definition: set[str] = set()
        #: Checks of the definitions that name a target, by target name.
        self._target_checks: dict[str, Callable[[Definition], object]] = {}
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        self.metrics_registry = metrics_registry
        self.tracer_provider = tracer_provider
        if clock is not None and not callable(clock):
            raise ConfigurationError(
                f"clock {brief(clock)} is not valid: give a function that returns epoch ms"
            )
        self.clock: Callable[[], int] = clock or wall_clock_ms
        self._telemetry: Telemetry | None = None

    def __repr__(self) -> str:
        return (
            f"<Scheduler {self.backend.describe()} instance={self.instance_id!r} "
            f"jobs={len(self._jobs)}{' running' if self.running else ''}>"
        )

    def configure(
        self, *, backend: Backend | str | None = None, instance_id: str | None = None
    ) -> None:
        """Replace the store or the instance id before ``start()`` (the CLI's overrides).

        :raises SchedulerStateError: the scheduler is running.
        """
        with self._lock:
            if self._engine is not None:
                raise SchedulerStateError(f"cannot reconfigure {self!r}: stop() it first")
            if backend is not None:
                self.backend = (
                    backend if isinstance(backend, Backend) else backend_from_url(backend)
                )
            if instance_id is not None:
                self.instance_id = _instance_id(instance_id) or self.instance_id
                self._minted_by = None

    # -- definitions ---------------------------------------------------------------
    @property
    def jobs(self) -> Mapping[str, Job]:
        """The defined jobs by name (read-only)."""
        return MappingProxyType(self._jobs)

    #: Keyword options of ``every()``/``cron()``/``add_job()`` that an adapter's
    #: :meth:`prepare_handler` takes (the core passes them to it, unchecked).
    adapter_options: frozenset[str] = frozenset()

    def prepare_handler(
        self, name: str, handler: Handler | None, options: Mapping[str, Any]
    ) -> Handler | None:
        """The handler job ``name`` runs: an adapter's hook, given the handler (``None`` in
        the decorator form, before the function is known) and its own options.

        An adapter wraps ``handler`` here (Django closes stale connections around each
        run), makes one from its options (Django's ``task=``), or refuses a bad option
        with a :class:`ConfigurationError`. Returning ``None`` for a ``None`` handler
        keeps the decorator form, which calls this again with the decorated function.
        The core's own: ``handler`` unchanged.
        """
        return handler

    def add_job(
        self, name: str, schedule: Schedule, handler: Handler | None = None, **options: Any
    ) -> Job:
        """Define a job from a :class:`Schedule` object; the decorators call this."""
        own = self._adapter_options(options)
        ready = self.prepare_handler(name, handler, own)
        if ready is None:
            raise ConfigurationError(f"job {brief(name)}: give a handler (a function taking ctx)")
        return self._add(name, schedule, ready, options)

    def _adapter_options(self, options: dict[str, Any]) -> dict[str, Any]:
        return {key: options.pop(key) for key in self.adapter_options & options.keys()}

    def _add(self, name: str, schedule: Schedule, handler: Handler, options: dict[str, Any]) -> Job:
        if not isinstance(schedule, Schedule):
            raise ConfigurationError(
                f"job {brief(name)}: schedule {brief(schedule)} is not valid: "
                "give Every(...) or Cron(...)"
            )
        job = Job.define(
            name,
            schedule,
            handler,
            namespace=self.namespace,
            defaults=self._defaults,
            explicit_defaults=self._explicit_defaults,
            options=options,
        )
        with self._lock:
            if self._engine is not None:
                raise SchedulerStateError(
                    f"cannot add job {name!r} to a running scheduler: define jobs before start()"
                )
            if name in self._jobs:
                raise ConfigurationError(
                    f"job name {name!r} is defined twice: job names must be unique"
                )
            self._jobs[name] = job
        return job

    @overload
    def every(
        self,
        name: str,
        interval: str | dt.timedelta,
        handler: None = None,
        *,
        offset: str | dt.timedelta | None = None,
        **options: Any,
    ) -> Callable[[H], H]: ...
    @overload
    def every(
        self,
        name: str,
        interval: str | dt.timedelta,
        handler: H,
        *,
        offset: str | dt.timedelta | None = None,
        **options: Any,
    ) -> Job: ...

    def every(
        self,
        name: str,
        interval: str | dt.timedelta,
        handler: Handler | None = None,
        *,
        offset: str | dt.timedelta | None = None,
        **options: Any,
    ) -> Job | Callable[[H], H]:
        """Run ``handler`` on the epoch grid of ``interval`` (a decorator without handler)."""
        return self._define(name, Every(interval, offset), handler, options)

    @overload
    def cron(
        self,
        name: str,
        expression: str,
        handler: None = None,
        *,
        tz: str = "UTC",
        day_or: bool = True,
        **options: Any,
    ) -> Callable[[H], H]: ...
    @overload
    def cron(
        self,
        name: str,
        expression: str,
        handler: H,
        *,
        tz: str = "UTC",
        day_or: bool = True,
        **options: Any,
    ) -> Job: ...

    def cron(
        self,
        name: str,
        expression: str,
        handler: Handler | None = None,
        *,
        tz: str = "UTC",
        day_or: bool = True,
        **options: Any,
    ) -> Job | Callable[[H], H]:
        """Run ``handler`` on a cron expression in ``tz`` (a decorator without handler)."""
        return self._define(name, Cron(expression, tz, day_or=day_or), handler, options)

    def _define(
        self, name: str, schedule: Schedule, handler: Handler | None, options: dict[str, Any]
    ) -> Job | Callable[[H], H]:
        own = self._adapter_options(options)
        ready = self.prepare_handler(name, handler, own)
        if ready is not None:
            return self._add(name, schedule, ready, options)
        Job.define(  # validate now, so a bad option fails at the decorator line
            name,
            schedule,
            _placeholder_handler,
            namespace=self.namespace,
            defaults=self._defaults,
            explicit_defaults=self._explicit_defaults,
            options=options,
        )

        def decorate(fn: H) -> H:
            self._add(name, schedule, self.prepare_handler(name, fn, own) or fn, options)
            return fn

        return decorate

    # -- targets: what stored definitions may run --------------------------------------
    @property
    def targets(self) -> Mapping[str, Callable[..., Any]]:
        """The registered targets by name (read-only)."""
        return MappingProxyType(self._targets)

    def add_target(
        self,
        name: str,
        handler: Callable[..., Any],
        *,
        takes_definition: bool = False,
        check: Callable[[Definition], object] | None = None,
    ) -> None:
        """Let stored definitions run ``handler(ctx, *args, **kwargs)`` as target ``name``.

        A store never supplies code: a definition names one of these, and runs only on
        the instances that registered it (each publishes its targets in the registry).
        ``takes_definition``: called as ``handler(ctx, definition)`` instead, for an
        adapter that reads more than the arguments (Celery's send options in
        ``definition.target_options``).

        ``check(definition)`` is called when this instance plans a definition that names
        the target (each version, as soon as it reads it): a :class:`ConfigurationError`
        it raises is logged at once as a warning, and each run of that version fails
        with it (recorded in the history) instead of calling the handler.

        :raises ConfigurationError: a bad name, a handler that takes no ``ctx``, a name
            registered twice, or a running scheduler.
        """
        validate_target(name)
        if not callable(handler):
            raise ConfigurationError(
                f"target {name!r}: handler {brief(handler)} is not callable: give a function "
                "taking ctx and the definition's args and kwargs"
            )
        if check is not None and not callable(check):
            raise ConfigurationError(
                f"target {name!r}: check {brief(check)} is not callable: give a function "
                "taking the definition"
            )
        with self._lock:
            if self._engine is not None:
                raise SchedulerStateError(
                    f"cannot add target {name!r} to a running scheduler: add targets before start()"
                )
            if name in self._targets:
                raise ConfigurationError(f"target {name!r} is registered twice: names are unique")
            self._targets[name] = handler
            if takes_definition:
                self._whole_definition.add(name)
            if check is not None:
                self._target_checks[name] = check

    def target(self, name: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add_target`::

        @scheduler.target("reports.send")
        def send_report(ctx, report_id, *, fmt="pdf"): ...
        """

        def decorate(fn: T) -> T:
            self.add_target(name, fn)  # type: ignore[arg-type]
            return fn

        return decorate

    def _build_stored(self, definition: Definition) -> Job:
        """The job a stored definition runs here, or why it cannot (for the engine)."""
        if definition.name in self._jobs:
            raise ConfigurationError(
                f"it has the name of a code job of this scheduler; the code job runs and "
                f"the stored definition {definition.name!r} is ignored here"
            )
        target = self._targets.get(definition.target)
        if target is None:
            held = ", ".join(sorted(self._targets)) or "none"
            handler: Handler = stored_jobs.missing_target(definition.target, held)
        elif (refused := self._refused(definition)) is not None:
            handler = refused
        else:
            if definition.target in self._whole_definition:
                bound = stored_jobs.bind_target(target, (definition,), {})
            else:
                bound = stored_jobs.bind_target(target, definition.args, definition.kwargs)
            handler = self.prepare_handler(definition.name, bound, {}) or bound
        job = Job.define(
            definition.name,
            definition.effective_schedule,
            handler,
            namespace=self.namespace,
            defaults=self._defaults,
            explicit_defaults=self._explicit_defaults,
            options=definition.options,
        )
        return dataclasses.replace(
            job,
            version=definition.version,
            fingerprint=definition.fingerprint(),
            missing_target=None if target is not None else definition.target,
        )

    def _refused(self, definition: Definition) -> Handler | None:
        """A handler that fails with the target's check's refusal of ``definition``
        (logged now, once per version), or ``None``: the check accepts it (or none)."""
        check = self._target_checks.get(definition.target)
        if check is None:
            return None
        try:
            check(definition)
        except ConfigurationError as exc:
            logger.warning(
                "stored job %s (version %d) cannot run as it is: %s; each of its runs "
                "fails with this error until the definition is corrected",
                store_name(self.namespace, definition.name),
                definition.version,
                exc,
                extra={
                    "job": definition.name,
                    "slot": None,
                    "attempt": None,
                    "instance": self.instance_id,
                },
            )
            return stored_jobs.refusing(exc)
        return None

    # -- stored definitions ----------------------------------------------------------
    # Each acts on the shared store, from any instance, running or not; every running
    # instance of the namespace follows the change within one heartbeat.

    async def add_definition(self, definition: Definition) -> Definition:
        """Store a new definition in this scheduler's namespace; returns it with its version.

        :raises ConflictError: one of that name exists.
        :raises ConfigurationError: it would shadow a code job (of this scheduler, or of a
            live instance).
        """
        if definition.name in self._jobs:
            raise ConfigurationError(
                f"definition {definition.name!r} would shadow the code job of that name: a "
                "stored definition never does; choose another name"
            )
        return await self._with_store(
            lambda backend: stored_jobs.add_definition(backend, definition, self.namespace)
        )

    async def update_definition(self, definition: Definition) -> Definition:
        """Replace the stored definition at ``definition.version`` (the version you read).

        :raises ConflictError: it changed since (read it again and redo the change).
        """
        return await self._with_store(
            lambda backend: stored_jobs.update_definition(backend, definition, self.namespace)
        )

    async def remove_definition(self, name: str, *, version: int) -> None:
        """Remove the stored definition ``name`` at ``version``: no slot of it runs after.

        :raises ConflictError: it changed since ``version`` was read.
        """
        await self._with_store(
            lambda backend: stored_jobs.remove_definition(backend, name, version, self.namespace)
        )

    async def get_definition(self, name: str) -> Definition | None:
        """The stored definition ``name`` of this namespace, or ``None``."""
        return await self._with_store(
            lambda backend: stored_jobs.get_definition(backend, name, self.namespace)
        )

    async def definitions(self) -> list[Definition]:
        """Every stored definition of this namespace, by name."""
        return await self._with_store(
            lambda backend: stored_jobs.definitions(backend, self.namespace)
        )

    async def sync_code_jobs(self) -> stored_jobs.SyncReport:
        """Store this scheduler's code jobs as ``owner='code'`` definitions (so that
        dashboards list and pause them) and remove those whose job left the code."""
        return await self._with_store(
            lambda backend: stored_jobs.sync_code_jobs(backend, self._jobs, self.namespace)
        )

    async def _sync_at_start(self) -> stored_jobs.SyncReport:
        """The start's sync, on the store the engine opened."""
        return await stored_jobs.sync_code_jobs(self.backend, self._jobs, self.namespace)

    # -- life cycle ----------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._engine is not None

    @property
    def failed(self) -> BaseException | None:
        """Why the store turned out unusable after a background start (bad credentials,
        a newer schema), or ``None``: the scheduler then claims nothing, and a host (a
        beat, a health check) should stop or report it. An outage is not a failure."""
        return self._engine.failed if self._engine else None

    @property
    def skew_ms(self) -> int:
        """The last measured clock skew, store − local, in ms (0 before the first claim)."""
        return self._engine.skew_ms if self._engine else 0

    @property
    def stats(self) -> Mapping[str, int]:
        """Counters of this instance since its last start (claims by outcome, runs by status…).

        Kept after ``stop()`` until the next ``start()``.
        """
        return dict(self._telemetry.stats) if self._telemetry else {}

    async def start(self) -> None:
        """Start claiming slots on the running event loop.

        :raises SchedulerStateError: already running.
        :raises CapabilityError: a lease-only option was asked of a claim-only backend.
        """
        with self._lock:
            if self._engine is not None:
                raise SchedulerStateError(f"{self!r} is already running: stop() it first")
            self.validate()
            if self._minted_by not in (None, os.getpid()):
                # Built before a fork (gunicorn --preload, celery worker -B): the default id
                # names the parent's pid, and every child would share it.
                self.instance_id, self._minted_by = default_instance_id(), os.getpid()
            self._telemetry = Telemetry(
                registry=self.metrics_registry, tracer_provider=self.tracer_provider
            )
            engine = Engine(
                self.backend,
                self._jobs,
                EngineConfig(
                    instance_id=self.instance_id,
                    heartbeat_ms=self.heartbeat_ms,
                    lease_ms=self.lease_ms,
                    history_retention_ms=self.history_retention_ms,
                    candidates=self.candidates,
                    logger=logger,
                    clock=self.clock,
                    telemetry=self._telemetry,
                    targets=frozenset(self._targets),
                ),
                namespace=self.namespace,
                build=self._build_stored if self._targets else None,
                sync=self._sync_at_start if self.sync_at_start else None,
            )
            self._engine = engine
        if not self.enabled:
            logger.info(
                "anarchon disabled (ANARCHON_ENABLED=0 or enabled=False): not claiming",
                extra={"job": None, "slot": None, "attempt": None, "instance": self.instance_id},
            )
            return
        try:
            await engine.start()
        except BaseException:
            self._engine = None
            raise
        logger.info(
            "anarchon started: %d job(s) on %s as %s%s%s",
            len(self._jobs),
            self.backend.describe(),
            self.instance_id,
            local_note(self.backend),
            "" if engine.opened else "; the store is unreachable: claiming starts when it answers",
            extra={"job": None, "slot": None, "attempt": None, "instance": self.instance_id},
        )

    async def stop(self, grace_ms: int | None = None) -> None:
        """Stop claiming; wait up to ``grace_ms`` for runs, then hand the rest over.

        Idempotent. A stopped scheduler may be started again.
        """
        engine = self._engine
        if engine is None:
            return
        try:
            if self.enabled:
                await engine.stop(self.grace_ms if grace_ms is None else grace_ms)
        finally:
            self._engine = None

    def run(self, *, grace_ms: int | None = None) -> None:
        """Run in the foreground until SIGINT or SIGTERM, then stop gracefully; a second
        signal during the stop hands the running runs over at once.

        The signal handlers are installed before the store is opened, so a SIGTERM
        that arrives during start-up also ends in a graceful stop. Called from a thread
        other than the main one, it installs none and runs until the loop is stopped.
        """
        asyncio.run(self._run_until_signalled(grace_ms))

    async def _run_until_signalled(self, grace_ms: int | None) -> None:
        """The first SIGINT or SIGTERM stops; a second one, during the stop's grace,
        hands the running runs over at once instead of waiting for them."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        installed = []

        def signalled() -> None:
            if not stop.is_set():
                stop.set()
                where = {"job": None, "slot": None, "attempt": None, "instance": self.instance_id}
                logger.info("stopping (a second Ctrl-C hands running runs over now)", extra=where)
            elif self._engine is not None:
                self._engine.hurry()

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, signalled)
                installed.append(sig)
        engine: Engine | None = None
        try:
            await self.start()
            engine = self._engine
            if engine is not None:  # a loop that dies ends the run, after the stop
                await _first_of(stop.wait(), engine.failed_event.wait())
            else:
                await stop.wait()
        finally:
            try:
                await self.stop(grace_ms)  # a second signal hurries it (handlers stay)
            finally:
                for sig in installed:
                    loop.remove_signal_handler(sig)
        if engine is not None and engine.failed is not None:
            raise SchedulerStateError(
                f"anarchon stopped claiming: {engine.failed}"
            ) from engine.failed

    def validate(self) -> None:
        """Refuse now what ``start()`` would refuse: a lease-only option (takeovers,
        overlap, catch-up) on a claim-only store. Adapters call it when they build the
        scheduler, so that a bad configuration fails at start-up, with its job's name.

        :raises CapabilityError: naming the job, the option and the accepted values.
        """
        if self.backend.capabilities.lease:
            return
        for job in self._jobs.values():
            options = job.options
            if "max_attempts" in job.explicit and options.max_attempts > 1 + options.retries:
                raise CapabilityError(
                    f"job {job.name!r}: max_attempts={options.max_attempts} allows takeovers, "
                    f"which need a lease backend; the {self.backend.name} backend "
                    f"({self.backend.describe()}) is claim-only and "
                    f"retries only inside the winning process (max_attempts <= 1 + retries = "
                    f"{1 + options.retries}), or use a lease backend: {LEASE_BACKENDS}"
                )
            for option, allowed in LEASE_ONLY_OPTIONS.items():
                value = getattr(job.options, option)
                if option in job.explicit and value != allowed:
                    raise CapabilityError(
                        f"job {job.name!r}: {option}={value!r} needs a lease backend; the "
                        f"{self.backend.name} backend ({self.backend.describe()}) is claim-only "
                        f"(use {allowed!r} or a lease backend: {LEASE_BACKENDS})"
                    )
            if "catch_up_window_ms" in job.explicit:
                raise CapabilityError(
                    f"job {job.name!r}: catch_up_window is for catch-up, which needs a lease "
                    f"backend; the {self.backend.name} backend ({self.backend.describe()}) is "
                    f"claim-only (use a lease backend: {LEASE_BACKENDS})"
                )

    # -- operations and reading ----------------------------------------------------
    # Every one acts on the shared store, so it works from any instance, running or not.
    # ``job`` is a job of this scheduler, or any store name (namespace included).

    async def pause(self, job: str, *, force: bool = False) -> None:
        """Pause ``job`` on every instance from its next slot (recorded ``paused``).

        :raises UnknownJobError: ``job`` is not one of this scheduler's and the store
            knows nothing of it (``force`` pauses it anyway).
        """
        name, known = self._stored(job), force or job in self._jobs
        await self._with_store(lambda backend: operations.pause(backend, name, force=known))

    async def resume(self, job: str, *, force: bool = False) -> None:
        """Resume ``job`` on every instance from its next slot.

        :raises UnknownJobError: as :meth:`pause`.
        """
        name, known = self._stored(job), force or job in self._jobs
        await self._with_store(lambda backend: operations.resume(backend, name, force=known))

    async def trigger(self, job: str) -> int:
        """Run ``job`` once now on exactly one live instance that has it; returns the slot.

        :raises NoLiveInstanceError: no live instance has the job.
        """
        return await self._with_store(
            lambda backend: operations.trigger(
                backend, self._stored(job), requested_by=self.instance_id
            )
        )

    async def cancel(self, job: str, slot: int) -> bool:
        """Cancel a pending or running run of ``job``; ``False`` if there is none."""
        return await self._with_store(
            lambda backend: operations.cancel(backend, self._stored(job), slot)
        )

    async def instances(self) -> list[InstanceInfo]:
        """The live instances of the cluster (of every service sharing the store)."""
        return await self._with_store(operations.instances)

    async def history(
        self,
        *,
        job: str | None = None,
        status: Status | str | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        """Recent history records from the store, newest first."""
        name = None if job is None else self._stored(job)
        wanted = None if status is None else _status(status)
        query = HistoryQuery(job=name, status=wanted, limit=limit)
        return await self._with_store(lambda backend: backend.history(query))

    def _stored(self, job: str) -> str:
        return self._jobs[job].store_name if job in self._jobs else job

    async def _with_store(self, call: Callable[[Backend], Awaitable[T]]) -> T:
        if self._engine is not None and self.enabled:
            return await call(self.backend)
        await self.backend.open()  # not running (or stop() closed it): open for this call
        try:
            return await call(self.backend)
        finally:
            await self.backend.close()


def _placeholder_handler(ctx: Any) -> None:
    """Stands in for the decorated function while its options are validated."""


def _status(value: str) -> Status:
    try:
        return Status(value)
    except ValueError:
        words = ", ".join(s.value for s in Status)
        raise ConfigurationError(
            f"status {brief(value)} is not valid: use one of {words}"
        ) from None


def _instance_id(value: object) -> str | None:
    if value is not None and (
        not isinstance(value, str) or not value.strip() or len(value) > MAX_INSTANCE_ID_LENGTH
    ):
        raise ConfigurationError(
            f"instance_id {brief(value)} is not valid: give a non-empty string of at most "
            f"{MAX_INSTANCE_ID_LENGTH} characters"
        )
    return value


async def _first_of(*waits: Awaitable[Any]) -> None:
    """Return when the first of ``waits`` is done, cancelling the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
