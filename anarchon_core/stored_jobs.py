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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .backend import Backend
from .definitions import Definition
from .durations import format_duration_ms
from .engine.definitions import in_namespace
from .errors import CapabilityError, ConfigurationError, ConflictError
from .job import Handler, Job, JobOptions
from .names import store_name
from .schedules import Cron, Every

__all__ = [
    "SyncReport",
    "add_definition",
    "bind_target",
    "code_definition",
    "definitions",
    "get_definition",
    "remove_definition",
    "sync_code_jobs",
    "update_definition",
]


def _key(definition_name: str, namespace: str | None) -> str:
    return store_name(namespace, definition_name)


async def definitions(backend: Backend, namespace: str | None) -> list[Definition]:
    """The stored definitions of ``namespace`` (removed ones left out), by name."""
    latest: dict[str, Definition | None] = {}
    for stored in await backend.definitions_since(0):
        if in_namespace(stored.job, namespace) is None:
            continue
        body = stored.body
        latest[stored.job] = None if body is None else Definition.from_body(body, stored.version)
    return sorted((d for d in latest.values() if d is not None), key=lambda d: d.name)


async def get_definition(backend: Backend, name: str, namespace: str | None) -> Definition | None:
    """The stored definition ``name`` of ``namespace``, or ``None``."""
    key = _key(name, namespace)
    found = None
    for stored in await backend.definitions_since(0):
        if stored.job == key:
            found = stored
    if found is None or found.body is None:
        return None
    return Definition.from_body(found.body, found.version)


async def add_definition(
    backend: Backend, definition: Definition, namespace: str | None
) -> Definition:
    """Store a new definition; returns it with the version the store issued.

    :raises ConflictError: a definition of that name exists (a code job's included).
    :raises ConfigurationError: a live instance runs a code job of that name: a stored
        definition never shadows a code job.
    """
    if definition.owner != "store":
        raise ConfigurationError(
            f"definition {definition.name!r}: owner 'code' is for synced code jobs; "
            "add a definition with owner 'store'"
        )
    key = _key(definition.name, namespace)
    await _refuse_shadowing(backend, key)
    try:
        version = await backend.write_definition(key, definition.body(), expected=0)
    except ConflictError as exc:
        raise ConflictError(
            f"definition {key!r} exists already (version {exc.current}): change it with "
            "update, naming the version you read",
            current=exc.current,
        ) from None
    return definition.with_version(version)


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
    try:
        version = await backend.write_definition(
            key, definition.body(), expected=definition.version
        )
    except ConflictError as exc:
        raise _stale(key, definition.version, exc) from None
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
    try:
        await backend.write_definition(key, None, expected=version)
    except ConflictError as exc:
        raise _stale(key, version, exc) from None


def _stale(key: str, version: int, exc: ConflictError) -> ConflictError:
    held = f"version {exc.current}" if exc.current else "no definition"
    return ConflictError(
        f"definition {key!r} changed since it was read: you read version {version}, the "
        f"store holds {held}; read it again and redo the change",
        current=exc.current,
    )


async def _refuse_shadowing(backend: Backend, key: str) -> None:
    """Refuse a name that a live instance runs as a code job."""
    try:
        live = await backend.instances()
    except CapabilityError:  # no registry: the store cannot say
        return
    for info in live:
        spec = info.jobs.get(key)
        if spec is not None and spec.get("version") is None:
            raise ConfigurationError(
                f"definition {key!r} would shadow the code job of that name on instance "
                f"{info.instance_id}: a stored definition never does; choose another name"
            )


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
    """Code jobs whose schedule is not an Every or a Cron (a custom schedule)."""


def code_definition(job: Job) -> Definition | None:
    """The ``owner='code'`` definition of a code job (``None``: a custom schedule)."""
    if not isinstance(job.schedule, (Every, Cron)):
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
    pause them, and remove the code-owned definitions whose job left the code.

    A code job takes its name over from a store-owned definition (a code job always
    runs; the definition would be ignored). Replicas of two code versions that both
    sync (a rolling deploy) undo each other's removals until the deploy completes.
    """
    report = SyncReport()
    stored = {d.name: d for d in await definitions(backend, namespace)}
    for name, job in sorted(jobs.items()):
        wanted = code_definition(job)
        if wanted is None:
            report.not_storable.append(name)
            continue
        have = stored.get(name)
        key = _key(name, namespace)
        if have is None:
            await backend.write_definition(key, wanted.body(), expected=0)
            report.created.append(name)
        elif have.owner == "code" and have.same_content(wanted):
            report.unchanged.append(name)
        else:
            await backend.write_definition(key, wanted.body(), expected=have.version)
            (report.updated if have.owner == "code" else report.replaced).append(name)
    for name, have in sorted(stored.items()):
        if have.owner == "code" and name not in jobs:
            await backend.write_definition(_key(name, namespace), None, expected=have.version)
            report.removed.append(name)
    return report


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
    try:
        line = inspect.getsourcelines(target)[1]
    except (OSError, TypeError):
        line = None
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or type(target).__name__
    return f"{module}:{line} ({qualname})" if line else f"{module} ({qualname})"
