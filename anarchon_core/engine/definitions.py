"""Stored job definitions, followed while the engine runs.

The engine reads every definition of its namespace once at start, then the changes
only: each poll reads the store's version counter (one small read) and, when it moved,
the definitions changed since the version already seen. A change reloads that one
definition, never the whole table. A poll runs every heartbeat, and at once when the
store notifies a change (where it can: Redis pub/sub, the memory store) or a claim is
answered ``STALE`` (this instance planned with a version the store no longer holds).

Polling bounds how late a replica follows a change (one heartbeat); it does not bound
correctness: the store refuses the claims of a superseded version the moment the
change commits, whatever a replica has read.

A definition is planned here only if it is enabled, owned by the store (code-owned
ones are this or another scheduler's code jobs), names a target this instance holds
and does not share its name with one of this scheduler's code jobs; otherwise it is
not planned, and the reason is logged once per version.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..backend import Backend, StoredDefinition
from ..definitions import Definition
from ..errors import CapabilityError, ConfigurationError, ConflictError
from ..job import Job
from ..schedules import At
from .support import EngineConfig, EngineLog

__all__ = ["Follower", "in_namespace"]

#: A build turns a definition into a job this instance runs, or raises a
#: :class:`ConfigurationError` saying why it cannot (the target is not held here…).
Build = Callable[[Definition], Job]
#: Called with a store name and its new job (``None``: no longer planned here).
OnChange = Callable[[str, Job | None], None]


def in_namespace(store_name: str, namespace: str | None) -> str | None:
    """The definition name of ``store_name`` if it belongs to ``namespace``, else ``None``.

    Definition names hold no ``:``, so the namespace of a stored definition is exact:
    ``ns:name`` belongs to ``ns`` only, and a name without ``:`` to no namespace.
    """
    if namespace is None:
        return None if ":" in store_name else store_name
    prefix = f"{namespace}:"
    if not store_name.startswith(prefix) or ":" in store_name[len(prefix) :]:
        return None
    return store_name[len(prefix) :]


class Follower:
    """Keeps the engine's stored jobs in step with the store's definitions."""

    def __init__(
        self,
        backend: Backend,
        config: EngineConfig,
        log: EngineLog,
        *,
        namespace: str | None,
        build: Build,
        on_change: OnChange,
    ) -> None:
        self.backend = backend
        self.config = config
        self.log = log
        self.namespace = namespace
        self._build = build
        self._on_change = on_change
        #: The newest version read; every change up to it has been applied.
        self.seen = 0
        #: The store names of the definitions planned here, with their versions.
        self.planned: dict[str, int] = {}
        #: Whether the store keeps definitions (``False`` after its refusal).
        self.kept = True
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Read the changes now (a claim was answered ``STALE``)."""
        self._wake.set()

    async def load(self) -> None:
        """Read every definition once (at start); a store that keeps none is noted."""
        try:
            await self._read()
        except CapabilityError:
            self.kept = False
        except Exception as exc:  # an outage: the loop reads them when the store answers
            self.config.telemetry.store_error("definitions")
            self.log.warn("could not read the stored job definitions (retrying): %s", exc)

    async def listen(self) -> None:
        """Wake the poll at each change the store notifies (where it can): a lost
        notification is caught by the next poll, an outage retried after a heartbeat."""
        while self.kept:
            try:
                await self.backend.watch_definitions(self.wake)
            except CapabilityError:
                return
            except Exception as exc:
                self.log.warn("lost the store's notifications of definition changes: %s", exc)
            await asyncio.sleep(self.config.heartbeat_ms / 1000)

    async def loop(self) -> None:
        """Poll the store's version counter every heartbeat, or at once when woken."""
        while self.kept:
            try:
                async with asyncio.timeout(self.config.heartbeat_ms / 1000):
                    await self._wake.wait()
            except TimeoutError:
                pass
            if not self.kept:
                return
            self._wake.clear()
            try:
                if await self.backend.definitions_version() != self.seen:
                    await self._read()
            except CapabilityError:
                return
            except Exception as exc:
                self.config.telemetry.store_error("definitions")
                self.log.warn("could not read the stored job definitions: %s", exc)

    async def retire_one_offs(self, older_than: int) -> int:
        """Remove this namespace's store-owned one-offs whose slot is older than
        ``older_than`` (epoch ms) and that are not marked ``keep``; returns how many.
        Every instance may try: a removal made meanwhile by another is a conflict,
        skipped."""
        retired = 0
        for change in await self.backend.definitions_since(0):
            if change.body is None or in_namespace(change.job, self.namespace) is None:
                continue
            try:
                definition = Definition.from_body(change.body, change.version)
            except (ConfigurationError, ValueError):
                continue
            schedule = definition.schedule
            if (
                definition.owner != "store"
                or definition.keep
                or not isinstance(schedule, At)
                or schedule.at_ms >= older_than
            ):
                continue
            try:
                await self.backend.write_definition(change.job, None, expected=change.version)
            except ConflictError:
                continue
            retired += 1
        return retired

    async def _read(self) -> None:
        changes = await self.backend.definitions_since(self.seen)
        for change in changes:
            self._apply(change)
            self.seen = max(self.seen, change.version)

    def _apply(self, change: StoredDefinition) -> None:
        name = in_namespace(change.job, self.namespace)
        if name is None:
            return
        job, why = self._job_of(change)
        if job is None:
            if change.job in self.planned:
                del self.planned[change.job]
                self.log.info("stored job %s is no longer planned here: %s", change.job, why)
                self._on_change(change.job, None)
            elif why:
                self.log.info("stored job %s is not planned here: %s", change.job, why)
            return
        verb = "changed" if change.job in self.planned else "planned"
        self.planned[change.job] = change.version
        unheld = (
            f"; its target {job.missing_target!r} is not registered here: this instance "
            "runs it only to record a failure while no live instance holds the target"
            if job.missing_target is not None
            else ""
        )
        self.log.info("stored job %s %s (version %d)%s", change.job, verb, change.version, unheld)
        self._on_change(change.job, job)

    def _job_of(self, change: StoredDefinition) -> tuple[Job | None, str]:
        """The job to plan for ``change``, or why there is none."""
        if change.body is None:
            return None, "removed"
        try:
            definition = Definition.from_body(change.body, change.version)
        except (ConfigurationError, ValueError) as exc:
            self.log.warn("stored definition %s is not valid: %s", change.job, exc)
            return None, f"not valid ({exc})"
        if definition.owner == "code":
            return None, ""  # a scheduler's code job, synced for the dashboards
        if not definition.enabled:
            reason = f": {definition.reason}" if definition.reason else ""
            return None, f"disabled{reason}"
        try:
            return self._build(definition), ""
        except ConfigurationError as exc:
            self.log.warn("stored job %s cannot run here: %s", change.job, exc)
            return None, str(exc)
