"""A backend that forwards the contract to another one: the base of store wrappers.

The Django ORM store builds its database's store at ``open()`` and forwards to it; the
fault injector (:mod:`anarchon_core.faults`) puts a store behind a faulty link. Both
forward every contract method, so this is written once: :meth:`DelegatingBackend._through`
is where a wrapper acts on each call, named by its contract method. ``open``,
``close``, ``describe`` and the capabilities stay the wrapper's own.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar

from ..backend import (
    Backend,
    Claim,
    ClaimRequest,
    DueRun,
    FinishRequest,
    InstanceInfo,
    Lease,
    StoredDefinition,
    TakeoverRequest,
)
from ..errors import BackendError
from ..records import HistoryQuery, RunRecord, Status

__all__ = ["DelegatingBackend"]

T = TypeVar("T")


class DelegatingBackend(Backend):
    """Every contract method forwarded to :attr:`inner`, through :meth:`_through`."""

    @property
    @abstractmethod
    def inner(self) -> Backend:
        """The store that answers (raise :class:`BackendError` while there is none)."""

    async def _through(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        """Make the call ``operation`` (a contract method's name) on :attr:`inner`."""
        return await call()

    @property
    def setting_warnings(self) -> tuple[str, ...]:  # type: ignore[override]
        """:attr:`inner`'s (none while there is no inner store)."""
        try:
            return self.inner.setting_warnings
        except BackendError:
            return ()

    async def now_ms(self) -> int:
        return await self._through("now_ms", lambda: self.inner.now_ms())

    async def claim(self, request: ClaimRequest) -> Claim:
        return await self._through("claim", lambda: self.inner.claim(request))

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        return await self._through("claim_many", lambda: self.inner.claim_many(requests))

    async def heartbeat(self, leases: Sequence[Lease], lease_ms: int) -> list[bool]:
        return await self._through("heartbeat", lambda: self.inner.heartbeat(leases, lease_ms))

    async def finish(
        self,
        lease: Lease,
        status: Status,
        *,
        error: str | None = None,
        meta: dict[str, Any] | None = None,
        retry_in_ms: int | None = None,
    ) -> bool:
        return await self._through(
            "finish",
            lambda: self.inner.finish(
                lease, status, error=error, meta=meta, retry_in_ms=retry_in_ms
            ),
        )

    def finish_in_transaction(
        self, conn: Any, lease: Lease, status: Status, *, meta: dict[str, Any] | None = None
    ) -> bool:
        return self.inner.finish_in_transaction(conn, lease, status, meta=meta)

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[bool]:
        return await self._through("finish_many", lambda: self.inner.finish_many(requests))

    async def release(self, lease: Lease) -> bool:
        return await self._through("release", lambda: self.inner.release(lease))

    async def due_runs(self, jobs: Collection[str]) -> list[DueRun]:
        return await self._through("due_runs", lambda: self.inner.due_runs(jobs))

    async def take_over(self, request: TakeoverRequest) -> Claim:
        return await self._through("take_over", lambda: self.inner.take_over(request))

    async def last_scheduled_slot(self, job: str) -> int | None:
        return await self._through(
            "last_scheduled_slot", lambda: self.inner.last_scheduled_slot(job)
        )

    async def history(self, query: HistoryQuery) -> list[RunRecord]:
        return await self._through("history", lambda: self.inner.history(query))

    async def prune(
        self,
        older_than_ms: int,
        *,
        jobs: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> int:
        return await self._through(
            "prune", lambda: self.inner.prune(older_than_ms, jobs=jobs, namespace=namespace)
        )

    async def write_definition(self, job: str, body: str | None, *, expected: int | None) -> int:
        return await self._through(
            "write_definition", lambda: self.inner.write_definition(job, body, expected=expected)
        )

    async def definitions_since(self, version: int) -> list[StoredDefinition]:
        return await self._through(
            "definitions_since", lambda: self.inner.definitions_since(version)
        )

    async def read_definition(self, job: str) -> StoredDefinition | None:
        return await self._through("read_definition", lambda: self.inner.read_definition(job))

    async def definitions_version(self) -> int:
        return await self._through("definitions_version", lambda: self.inner.definitions_version())

    async def set_paused(self, job: str, paused: bool) -> None:
        await self._through("set_paused", lambda: self.inner.set_paused(job, paused))

    async def paused_jobs(self) -> set[str]:
        return await self._through("paused_jobs", lambda: self.inner.paused_jobs())

    async def trigger(self, job: str, requested_by: str) -> int:
        return await self._through("trigger", lambda: self.inner.trigger(job, requested_by))

    async def cancel(self, job: str, slot: int) -> bool:
        return await self._through("cancel", lambda: self.inner.cancel(job, slot))

    async def register(self, info: InstanceInfo, ttl_ms: int) -> None:
        await self._through("register", lambda: self.inner.register(info, ttl_ms))

    async def unregister(self, instance_id: str) -> None:
        await self._through("unregister", lambda: self.inner.unregister(instance_id))

    async def instances(self) -> list[InstanceInfo]:
        return await self._through("instances", lambda: self.inner.instances())
