"""Adding, changing and removing stored definitions over a backend, and syncing code jobs.

Plain functions of an open :class:`~anarchon_core.backend.Backend`, shared by the
``Scheduler`` methods, the JSON API and the command line, as
:mod:`anarchon_core.operations` is for pause and trigger. A definition's store name is
``{namespace}:{name}`` (or its name, without a namespace); definition names hold no
``:``, so the namespace of a stored definition is never ambiguous.

Every change names the version it read (optimistic concurrency): the store refuses a
stale one with :class:`~anarchon_core.errors.ConflictError` and writes nothing.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .backend import Backend, InstanceInfo, StoredDefinition
from .definitions import Definition
from .durations import format_duration_ms
from .engine.definitions import in_namespace
from .errors import CapabilityError, ConfigurationError, ConflictError, MissingTargetError
from .job import Handler, Job, JobOptions
from .names import store_name, validate_namespace
from .schedules import Cron, Every

__all__ = [
    "Plan",
    "SyncReport",
    "add_definition",
    "apply_plan",
    "bind_target",
    "code_definition",
    "current",
    "definitions",
    "export_file",
    "get_definition",
    "live_instances",
    "missing_target",
    "plan_apply",
    "read_file_definitions",
    "refuse_listed",
    "refusing",
    "remove_definition",
    "sync_code_jobs",
    "update_definition",
    "write_at",
    "write_new",
]


def _key(definition_name: str, namespace: str | None) -> str:
    return store_name(namespace, definition_name)


async def current(backend: Backend) -> dict[str, StoredDefinition]:
    """Every definition the store holds, by store name (removed ones left out): one
    read of the whole table, as :meth:`Backend.definitions_since` of 0 gives it (each
    job once, in its current state).

    :raises CapabilityError: the store keeps no definitions.
    """
    return {d.job: d for d in await backend.definitions_since(0) if d.body is not None}


async def definitions(backend: Backend, namespace: str | None) -> list[Definition]:
    """The stored definitions of ``namespace`` (removed ones left out), by name."""
    found = [
        Definition.from_body(d.body, d.version)
        for job, d in (await current(backend)).items()
        if d.body is not None and in_namespace(job, namespace) is not None
    ]
    return sorted(found, key=lambda d: d.name)


async def get_definition(backend: Backend, name: str, namespace: str | None) -> Definition | None:
    """The stored definition ``name`` of ``namespace``, or ``None``."""
    return await _latest_definition(backend, _key(name, namespace))


async def add_definition(
    backend: Backend, definition: Definition, namespace: str | None
) -> Definition:
    """Store a new definition; returns it with the version the store issued.

    :raises ConflictError: a definition of that name exists.
    :raises ConfigurationError: it would shadow a code job: the stored definition of that
        name is a code job's, or a live instance runs a code job of that name.
    """
    if definition.owner != "store":
        raise ConfigurationError(
            f"definition {definition.name!r}: owner 'code' is for synced code jobs; "
            "add a definition with owner 'store'"
        )
    key = _key(definition.name, namespace)
    await _refuse_shadowing(backend, key)
    return await write_new(backend, key, definition)


async def update_definition(
    backend: Backend, definition: Definition, namespace: str | None
) -> Definition:
    """Replace the stored definition whose version is ``definition.version``.

    :raises ConflictError: the store holds another version (someone changed it since it
        was read): read it again and redo the change.
    :raises ConfigurationError: the stored one is a code job's (change it in the code).
    """
    if definition.version <= 0:
        raise ConfigurationError(
            f"definition {definition.name!r}: give the version you read (it is "
            f"{definition.version}); to create one, use add"
        )
    key = _key(definition.name, namespace)
    current = await get_definition(backend, definition.name, namespace)
    if current is not None and current.owner == "code" and definition.owner != "code":
        raise ConfigurationError(
            f"definition {key!r} is a code job's (owner 'code'): change it in the code"
        )
    version = await write_at(backend, key, definition.body(), definition.version)
    return definition.with_version(version)


async def remove_definition(
    backend: Backend, name: str, version: int, namespace: str | None
) -> None:
    """Remove the stored definition ``name`` at ``version``; its slots stop at once.

    :raises ConflictError: the store holds another version (or none).
    :raises ConfigurationError: it is a code job's (remove the job from the code).
    """
    key = _key(name, namespace)
    current = await get_definition(backend, name, namespace)
    if current is not None and current.owner == "code":
        raise ConfigurationError(
            f"definition {key!r} is a code job's (owner 'code'): remove the job from the code"
        )
    await write_at(backend, key, None, version)


async def write_new(backend: Backend, key: str, definition: Definition) -> Definition:
    """Write a new definition (it must not exist); it, with the version issued. No other
    check: :func:`add_definition` makes them, or a caller that read the row itself."""
    try:
        version = await backend.write_definition(key, definition.body(), expected=0)
    except ConflictError as exc:
        raise ConflictError(
            f"definition {key!r} exists already (version {exc.current}): change it with "
            "update, naming the version you read",
            current=exc.current,
        ) from None
    return definition.with_version(version)


async def write_at(backend: Backend, key: str, body: str | None, version: int) -> int:
    """Write (``None``: remove) the definition ``key`` read at ``version``; the version
    issued, or a :class:`ConflictError` saying it changed since it was read. The owner is
    not checked: :func:`update_definition` does, or a caller that read the row itself."""
    try:
        return await backend.write_definition(key, body, expected=version)
    except ConflictError as exc:
        held = f"version {exc.current}" if exc.current else "no definition"
        raise ConflictError(
            f"definition {key!r} changed since it was read: you read version {version}, the "
            f"store holds {held}; read it again and redo the change",
            current=exc.current,
        ) from None


async def _refuse_shadowing(backend: Backend, key: str) -> None:
    """Refuse a name that is a code job's: its stored definition is owned by ``code``, or
    a live instance lists a job of that name that the store keeps no definition of.

    A registry entry lists each job's name and fingerprint only, so the stored
    definitions tell a code job from a stored one: an instance runs a stored job only
    while its definition is in the store (it stops at its removal), so a listed name
    whose stored definition is missing, or owned by ``code``, is a code job. (A
    definition removed less than a heartbeat ago may still be listed by an instance that
    has not followed the removal yet: adding it again is refused until it has.)
    """
    try:
        stored = await _latest_definition(backend, key)
    except CapabilityError:  # a store that keeps no definitions: every listed job is code
        stored = None
    if stored is not None and stored.owner == "code":
        raise ConfigurationError(
            f"definition {key!r} would shadow the code job of that name (its stored copy, "
            "owner 'code'): a stored definition never does; choose another name"
        )
    if stored is None:  # else a stored job: the write answers that it exists
        refuse_listed(key, await live_instances(backend))


def refuse_listed(key: str, live: list[InstanceInfo]) -> None:
    """Refuse ``key``, which the store keeps no definition of, if a live instance lists
    it: then it is a code job."""
    for info in live:
        if key in info.jobs:
            raise ConfigurationError(
                f"definition {key!r} would shadow the code job of that name on instance "
                f"{info.instance_id}: a stored definition never does; choose another name"
            )


async def _latest_definition(backend: Backend, key: str) -> Definition | None:
    """The stored definition of the store name ``key`` (``None``: none, or removed): one
    read of that definition (:meth:`Backend.read_definition`)."""
    found = await backend.read_definition(key)
    if found is None or found.body is None:
        return None
    return Definition.from_body(found.body, found.version)


def bind_target(
    target: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Handler:
    """The handler of a stored job: ``target(ctx, *args, **kwargs)``, async if it is."""
    frozen = dict(kwargs)
    if inspect.iscoroutinefunction(target):

        async def run_async(ctx: Any) -> Any:
            return await target(ctx, *args, **frozen)

        return run_async

    def run(ctx: Any) -> Any:
        return target(ctx, *args, **frozen)

    return run


def missing_target(target: str, held: str) -> Handler:
    """The handler of a definition whose target this instance lacks: it runs only when no
    live instance holds the target, and fails saying so."""

    def run(ctx: Any) -> None:
        raise MissingTargetError(
            f"target {target!r} is registered on no live instance (this one has: {held}); "
            f"register it in code (@scheduler.target({target!r})) on the instances that "
            "should run it"
        )

    return run


def refusing(error: ConfigurationError) -> Handler:
    """The handler of a definition its target's check refused: each run fails with the
    refusal (a new instance of it, so that records never share a traceback)."""
    text = str(error)

    def run(ctx: Any) -> None:
        raise ConfigurationError(text)

    return run


# -- code jobs in the store ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SyncReport:
    """What :func:`sync_code_jobs` did, by definition name."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    """Store-owned definitions that a code job of the same name took over."""
    not_storable: list[str] = field(default_factory=list)
    """Code jobs whose schedule is not an Every or a Cron (a custom schedule), or whose
    name holds ``:``: the dashboards show them without a schedule."""
    kept: list[str] = field(default_factory=list)
    """Code-owned definitions of jobs this code does not have that a live instance still
    lists (another service in the namespace, or replicas of another deploy): kept."""
    raced: list[str] = field(default_factory=list)
    """Code jobs left to another replica syncing at the same time: not stored yet when
    this one read them again, or stored in another version (replicas of another
    deploy, whose copy stands until a later start)."""

    def changes(self) -> str:
        """What the sync changed in the store, as one line ('' for nothing)."""
        parts = [
            f"{what} {', '.join(names)}"
            for what, names in (
                ("created", self.created),
                ("updated", self.updated),
                ("replaced", self.replaced),
                ("removed", self.removed),
            )
            if names
        ]
        return "; ".join(parts)


def code_definition(job: Job) -> Definition | None:
    """The ``owner='code'`` definition of a code job (``None``: not storable, a custom
    schedule or a name that holds ``:``, which a definition's may not)."""
    if not isinstance(job.schedule, (Every, Cron)) or ":" in job.name:
        return None
    source = _source(job.handler)
    return Definition.create(
        job.name,
        job.schedule,
        job.name,
        options=_options(job.options),
        description=f"code job {source}" if source else "code job",
        owner="code",
    )


async def sync_code_jobs(
    backend: Backend, jobs: Mapping[str, Job], namespace: str | None
) -> SyncReport:
    """Store every code job as an ``owner='code'`` definition, so that dashboards show and
    pause them, and remove the code-owned definitions whose job left the code (those that
    no live instance lists: another service's code jobs in the namespace stay). Only a
    definition whose content differs is written, one write per definition.

    A code job takes its name over from a store-owned definition (a code job always
    runs; the definition would be ignored). Replicas that start together race on the
    same writes: a write refused with :class:`ConflictError` means another replica is
    syncing (the writes go in name order, so the replica that wrote last is still
    writing and completes the sync). The refused one stops writing, reads the
    definitions again once and accepts what they hold: its remaining jobs are
    ``unchanged`` where the store holds its version, :attr:`SyncReport.raced` where it
    holds none yet or another (replicas of another deploy: the stored copy is theirs
    until a later start). Identical replicas thus write each definition once, with at
    most one refused write and one read more each, whatever their number.

    :raises CapabilityError: the store keeps no definitions.
    """
    report = SyncReport()
    stored = await _held(backend, namespace)
    wanted: dict[str, str] = {}
    for name, job in sorted(jobs.items()):
        definition = code_definition(job)
        if definition is None:
            report.not_storable.append(name)
        else:
            wanted[name] = definition.body()
    listed: set[str] | None = None
    changes: list[tuple[str, str | None]] = [*wanted.items()]
    for name, held in sorted(stored.items()):
        if held.owner != "code" or name in jobs:
            continue
        if listed is None:
            listed = await _listed(backend)
        if _key(name, namespace) in listed:
            report.kept.append(name)  # another live instance runs it (another service)
        else:
            changes.append((name, None))
    for at, (name, body) in enumerate(changes):
        have = stored.get(name)
        verdict = _verdict(have, body)
        if verdict == "unchanged":
            if body is not None:
                report.unchanged.append(name)
            continue
        try:
            await backend.write_definition(
                _key(name, namespace), body, expected=0 if have is None else have.version
            )
        except ConflictError:  # another replica is syncing: accept what it writes
            latest = await _held(backend, namespace)
            for rest, rest_body in changes[at:]:
                if rest_body is None:
                    continue  # a removal: the other replica's sync decides it
                same = _verdict(latest.get(rest), rest_body) == "unchanged"
                (report.unchanged if same else report.raced).append(rest)
            return report
        getattr(report, verdict).append(name)
    return report


@dataclass(frozen=True, slots=True)
class _Held:
    """A stored definition as a sync compares it: its text, not a checked Definition (a
    sync at every start reads every definition of the namespace)."""

    version: int
    body: str
    owner: str


async def _held(backend: Backend, namespace: str | None) -> dict[str, _Held]:
    """The stored definitions of ``namespace`` by name (removed ones left out)."""
    held = {}
    for job, stored in (await current(backend)).items():
        name = in_namespace(job, namespace)
        if name is None or stored.body is None:
            continue
        try:
            data = json.loads(stored.body)
        except ValueError:
            data = None
        owner = data.get("owner", "store") if isinstance(data, dict) else "store"
        held[name] = _Held(stored.version, stored.body, owner)
    return held


def _verdict(have: _Held | None, body: str | None) -> str:
    """What writing ``body`` (``None``: removing a code-owned definition) over ``have``
    is: the :class:`SyncReport` list it goes to. Bodies are compared as text: a code
    job's is written by :meth:`Definition.body`, which is canonical."""
    if body is None:
        return "unchanged" if have is None or have.owner != "code" else "removed"
    if have is None:
        return "created"
    if have.owner == "code" and have.body == body:
        return "unchanged"
    return "updated" if have.owner == "code" else "replaced"


async def live_instances(backend: Backend) -> list[InstanceInfo]:
    """The live instances (none where the store has no registry: it cannot say)."""
    try:
        return await backend.instances()
    except CapabilityError:
        return []


async def _listed(backend: Backend) -> set[str]:
    """The store names the live instances list (none where the store has no registry)."""
    return {name for info in await live_instances(backend) for name in info.jobs}


def _options(options: JobOptions) -> dict[str, Any]:
    """A job's resolved options by their public names."""
    out: dict[str, Any] = {}
    for f in fields(options):
        value = getattr(options, f.name)
        if f.name == "catch_up_window_ms":
            out["catch_up_window"] = format_duration_ms(value)
        else:
            out[f.name] = value
    return out


def _source(handler: Any) -> str:
    """``module:line (qualname)`` of a handler, or '' where Python cannot tell."""
    target = inspect.unwrap(handler)
    line = getattr(getattr(target, "__code__", None), "co_firstlineno", None)
    if line is None:  # not a function: a callable object, a partial…
        try:
            line = inspect.getsourcelines(target)[1]
        except (OSError, TypeError):
            line = None
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or type(target).__name__
    return f"{module}:{line} ({qualname})" if line else f"{module} ({qualname})"


# -- converging the store to a file -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Plan:
    """What :func:`apply_plan` changes to make the store-owned definitions of a namespace
    those of a file: the definitions to create, to update (with the version read) and
    to remove. Code-owned definitions are never touched."""

    create: list[Definition] = field(default_factory=list)
    update: list[Definition] = field(default_factory=list)
    remove: list[Definition] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.remove)

    def lines(self) -> list[str]:
        """The plan as a diff, one line per definition (``+`` create, ``~`` update,
        ``-`` remove)."""
        out = [f"+ {d.name}: {d.effective_schedule.describe()} -> {d.target}" for d in self.create]
        out += [f"~ {d.name}: {d.effective_schedule.describe()} -> {d.target}" for d in self.update]
        out += [f"- {d.name} (version {d.version})" for d in self.remove]
        return out


def plan_apply(current: list[Definition], wanted: list[Definition], *, prune: bool = True) -> Plan:
    """The changes that turn ``current`` (read from the store) into ``wanted``.

    :raises ConfigurationError: ``wanted`` names a definition twice, or one that is a
        code job's in the store.
    """
    names = [d.name for d in wanted]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigurationError(f"the file defines {', '.join(twice)} more than once")
    have = {d.name: d for d in current}
    plan = Plan()
    for definition in wanted:
        old = have.get(definition.name)
        if old is None:
            plan.create.append(definition)
        elif old.owner == "code":
            raise ConfigurationError(
                f"definition {definition.name!r} is a code job's in the store: leave it out "
                "of the file (or remove the job from the code)"
            )
        elif old.same_content(definition):
            plan.unchanged.append(definition.name)
        else:
            plan.update.append(definition.with_version(old.version))
    if prune:
        keep = set(names)
        plan.remove.extend(d for d in current if d.owner == "store" and d.name not in keep)
    return plan


async def apply_plan(backend: Backend, plan: Plan, namespace: str | None) -> None:
    """Make the changes of ``plan``, each naming the version it was planned with: a
    definition changed meanwhile is refused (:class:`ConflictError`) and the rest of the
    plan is not applied.

    The plan was made from one read of the store (:func:`plan_apply` refused its
    code-owned definitions), so the writes need no read of their own: a definition
    created or changed since is refused by its version, and only the registry is read
    once, for the names a live instance runs as code jobs."""
    live = await live_instances(backend) if plan.create else []
    for definition in plan.create:
        key = _key(definition.name, namespace)
        refuse_listed(key, live)
        await write_new(backend, key, definition)
    for definition in plan.update:
        await write_at(
            backend, _key(definition.name, namespace), definition.body(), definition.version
        )
    for definition in plan.remove:
        await write_at(backend, _key(definition.name, namespace), None, definition.version)


def read_file_definitions(data: object) -> tuple[str | None, list[Definition]]:
    """The namespace and definitions of a parsed file: ``{"namespace": …, "definitions":
    [...]}`` or a bare list of definitions (the form :func:`export_file` writes)."""
    namespace = None
    items = data
    if isinstance(data, Mapping):
        unknown = set(data) - {"namespace", "definitions"}
        if unknown:
            raise ConfigurationError(
                f"unknown key(s) {', '.join(sorted(map(str, unknown)))} at the top of the "
                "file: give 'definitions' (a list) and optionally 'namespace'"
            )
        namespace = data.get("namespace")
        if namespace is not None:
            validate_namespace(namespace)
        items = data.get("definitions", [])
    if not isinstance(items, list):
        raise ConfigurationError(
            "the file holds no list of definitions: give {'definitions': [...]} or a list"
        )
    definitions = []
    for item in items:
        if isinstance(item, Mapping) and item.get("version"):
            item = {k: v for k, v in item.items() if k != "version"}
        definitions.append(Definition.from_json(item))
    return namespace, definitions


def export_file(definitions: list[Definition], namespace: str | None) -> dict[str, Any]:
    """The file form of ``definitions`` (no versions: a file states what should be)."""
    items = []
    for definition in definitions:
        data = definition.to_json()
        del data["version"]
        items.append({k: v for k, v in data.items() if v not in (None, [], {}, "")})
    out: dict[str, Any] = {"definitions": items}
    if namespace is not None:
        out = {"namespace": namespace, **out}
    return out
