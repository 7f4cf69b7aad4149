"""The Redis strategies that keep a run record per ``(job, slot)``: ``lease`` and ``script``.

Per job (``B`` = ``prefix:{job}:``, one Redis Cluster hash slot):

=================  ======  ==============================================================
``B run:<slot>``   hash    the run: ``origin``, ``state`` (``pending``, ``running``,
                           ``waiting``, ``claimed`` or a terminal status), ``attempt``,
                           ``token``, ``retry_at``, ``fp``, ``requested_by`` (manual runs)
                           and, per attempt ``n``, its history record ``n:status``,
                           ``n:instance``, ``n:claimed``, ``n:started``, ``n:finished``,
                           ``n:error``, ``n:meta``. No TTL: kept until pruned.
``B lease:<slot>`` string  the holder's token with a TTL of ``lease_ms`` (lease only): the
                           lease is live while the key exists.
``B open``         set     slots whose run is pending, running or waiting (lease only).
``B slots``        zset    every slot with a history record (score = slot): history, prune.
``B job``          hash    ``paused`` and ``last`` (the latest scheduled slot: catch-up).
``B definition``   hash    the job's stored definition (lease only): ``version`` (issued
                           by the store's counter) and ``body`` (its JSON text; a removal
                           keeps the version without a body, a tombstone).
=================  ======  ==============================================================

Per store (lease only): ``prefix:definitions:version`` (string), the counter that issues
definition versions (``INCR``), and ``prefix:definitions:log`` (sorted set), every job
with a stored definition or tombstone, scored by its version: what
``definitions_since`` reads.

Every operation is one of the Lua scripts in :mod:`._lua`, which mirror the
in-memory reference backend; this module only names keys and parses replies.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Collection, Sequence
from typing import Any, ClassVar, Literal

from ...backend import (
    Capabilities,
    Claim,
    ClaimRequest,
    DueRun,
    FinishRequest,
    Lease,
    PruneScope,
    StoredDefinition,
    TakeoverRequest,
    bound_error,
    meta_json,
)
from ...errors import ConflictError
from ...records import HistoryQuery, Origin, Outcome, RunRecord, Status, select_records
from . import _lua as lua
from ._base import Call, RedisBackend, command, execute, newest_slot, queue

__all__ = ["RedisLeaseBackend", "RedisScriptBackend"]

_REASONS: dict[str, Literal["expired", "retry", "manual"]] = {
    "expired": "expired",
    "retry": "retry",
    "manual": "manual",
}
PRUNE_BATCH = 500  # runs looked at per prune script: bounds how long one blocks Redis
SWEEP_BATCH = 1000  # jobs per sweep script: an idle job costs it a 32nd of an EXISTS


class _RunsBackend(RedisBackend):
    """What ``lease`` and ``script`` share: the run record, history, prune and pausing."""

    #: The state of a run whose attempt has no outcome yet.
    open_state: ClassVar[str] = "running"

    async def set_paused(self, job: str, paused: bool) -> None:
        """Pause or resume ``job``: claims of a paused job record ``paused`` and run nothing."""
        key = self._key(job, "job")
        command = ("HSET", key, "paused", "1") if paused else ("HDEL", key, "paused")
        await self._eval_batch([], before=[*self._index_commands(job), command])
        self._indexed.add(job)

    async def paused_jobs(self) -> set[str]:
        jobs = await self._jobs()
        with self._errors():
            pipe = self.client.pipeline(transaction=False)
            for job in jobs:
                queue(pipe, "HGET", self._key(job, "job"), "paused")
            flags = await execute(pipe)
        return {job for job, flag in zip(jobs, flags, strict=True) if flag == "1"}

    async def claim(self, request: ClaimRequest) -> Claim:
        (claim,) = await self.claim_many([request])
        return claim

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        """Every claim in one round trip: one script decides a group of claims in order.

        Groups hold up to ``SCRIPT_BATCH`` claims (on Redis Cluster, of one hash slot);
        the jobs' index entries go in the same round trip. A lone claim is a group of
        one. Claims are not queued behind other calls (see ``_eval_alone``).
        """
        if not requests:
            return []
        groups = self._groups([request.job for request in requests])
        calls = [self._claim_call([requests[at] for at in group]) for group in groups]
        index = self._index_many(request.job for request in requests)
        replies = await self._eval_alone(calls, before=index)
        if index:
            self._indexed.update(request.job for request in requests)
        claims: dict[int, Claim] = {}
        for group, reply in zip(groups, replies, strict=True):
            now = int(reply[0])
            for n, at in enumerate(group):
                claims[at] = Claim(Outcome(reply[2 * n + 1]), int(reply[2 * n + 2]), now)
        return [claims[at] for at in range(len(requests))]

    def _claim_call(self, requests: Sequence[ClaimRequest]) -> Call:
        """The script call deciding ``requests`` (jobs of one hash slot on Redis Cluster)."""
        raise NotImplementedError

    async def finish(
        self,
        lease: Lease,
        status: Status,
        *,
        error: str | None = None,
        meta: dict[str, Any] | None = None,
        retry_in_ms: int | None = None,
    ) -> bool:
        (done,) = await self.finish_many([FinishRequest(lease, status, error, meta, retry_in_ms)])
        return done

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[bool]:
        """Every finish in one round trip, grouped into scripts as :meth:`claim_many` is."""
        if not requests:
            return []
        groups = self._groups([request.lease.job for request in requests])
        calls = [self._finish_call([requests[at] for at in group]) for group in groups]
        done = [False] * len(requests)
        for group, reply in zip(groups, await self._eval_batch(calls), strict=True):
            for at, verdict in zip(group, reply, strict=True):
                done[at] = bool(verdict)
        return done

    def _finish_call(self, requests: Sequence[FinishRequest]) -> Call:
        keys: list[str] = []
        args: list[str | int] = []
        lease_backend = self.capabilities.lease
        for request in requests:
            lease, retry_in_ms = request.lease, request.retry_in_ms
            error = bound_error(request.error)
            job, slot = lease.job, lease.slot
            keys += [
                self._key(job, f"run:{slot}"),
                self._key(job, f"lease:{slot}"),
                self._key(job, "open"),
            ]
            args += [
                lease.attempt,
                lease.token,
                str(request.status),
                "0" if error is None else "1",
                error or "",
                meta_json(request.meta) if request.meta else "",
                "" if retry_in_ms is None or not lease_backend else str(retry_in_ms),
                slot,
                self.open_state,
            ]
        return lua.FINISH, keys, args

    # -- history -----------------------------------------------------------------
    async def history(self, query: HistoryQuery) -> list[RunRecord]:
        if query.limit <= 0:
            return []
        jobs = [query.job] if query.job is not None else await self._jobs()
        calls = [self._history_call(job, query) for job in jobs]
        records: list[RunRecord] = []
        for job, reply in zip(jobs, await self._eval_batch(calls), strict=True):
            for i in range(0, len(reply), 2):
                records.extend(run_records(job, int(reply[i]), reply[i + 1]))
        return select_records(records, query)

    def _history_call(self, job: str, query: HistoryQuery) -> Call:
        """The script reading the newest runs of ``job`` holding ``limit`` of the records asked.

        The cursor's own slot may hold records after it (its job's higher attempts): the
        script is told which, so that it does not count them and stop a page short.
        """
        end = newest_slot(query, job)
        top = "+inf" if end is None else f"{'' if end[1] else '('}{end[0]}"
        bottom = "-inf" if query.since is None else str(query.since)
        status = "" if query.status is None else str(query.status)
        cut: list[str | int] = ["", ""]
        if query.before is not None and query.before[1] == job:
            cut = [query.before[0], query.before[2]]
        args = [self._base(job), top, bottom, status, query.limit, *cut]
        return lua.HISTORY, [self._key(job, "slots")], args

    async def prune(
        self,
        older_than_ms: int,
        *,
        jobs: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> int:
        scope = PruneScope.of(jobs, namespace)
        deleted = 0
        for job in scope.select(await self._jobs()):
            cursor = "-inf"
            while True:
                count, last, seen = await self._eval(
                    lua.PRUNE,
                    [self._key(job, "slots"), self._key(job, "open"), self._key(job, "job")],
                    [self._base(job), older_than_ms, cursor, PRUNE_BATCH],
                )
                deleted += int(count)
                if int(seen) < PRUNE_BATCH or last is None:
                    break
                cursor = f"({last}"
        return deleted


class RedisLeaseBackend(_RunsBackend):
    """``strategy=lease``: a lease backend; every operation is one Lua script.

    The lease is the key ``lease:<slot>`` with a server-side TTL: expiry is judged by
    the store's clock, and a TTL only ever deletes the lease, never the run record.
    """

    strategy = "lease"
    capabilities = Capabilities(lease=True, store_clock=True, finish=True)
    scripts = (
        lua.CLAIM_LEASE,
        lua.HEARTBEAT,
        lua.FINISH,
        lua.RELEASE,
        lua.TAKE_OVER,
        lua.DUE_RUNS,
        lua.TRIGGER,
        lua.CANCEL,
        lua.HISTORY,
        lua.PRUNE,
        lua.WRITE_DEFINITION,
        lua.DEFINITIONS_SINCE,
    )

    def _claim_call(self, requests: Sequence[ClaimRequest]) -> Call:
        keys: list[str] = []
        args: list[str | int] = []
        for request in requests:
            job, slot = request.job, request.slot
            keys += [
                self._key(job, f"run:{slot}"),
                self._key(job, f"lease:{slot}"),
                self._key(job, "job"),
                self._key(job, "open"),
                self._key(job, "slots"),
            ]
            args += [
                slot,
                request.token,
                request.instance_id,
                request.lease_ms,
                request.horizon_ms,
                int(request.skip_overlap),
                str(request.origin),
                request.fingerprint,
                self._base(job),
                "" if request.version is None else request.version,
            ]
        return lua.CLAIM_LEASE, keys, args

    async def heartbeat(self, leases: Sequence[Lease], lease_ms: int) -> list[bool]:
        calls: list[Call] = [
            (
                lua.HEARTBEAT,
                [
                    self._key(lease.job, f"run:{lease.slot}"),
                    self._key(lease.job, f"lease:{lease.slot}"),
                ],
                [lease.attempt, lease.token, lease_ms],
            )
            for lease in leases
        ]
        return [bool(reply) for reply in await self._eval_batch(calls)]

    async def release(self, lease: Lease) -> bool:
        job, slot = lease.job, lease.slot
        reply = await self._eval(
            lua.RELEASE,
            [self._key(job, f"run:{slot}"), self._key(job, f"lease:{slot}")],
            [lease.attempt, lease.token],
        )
        return bool(reply)

    async def due_runs(self, jobs: Collection[str]) -> list[DueRun]:
        """One sweep script for up to ``SWEEP_BATCH`` jobs (on Redis Cluster, per hash slot)."""
        names = sorted(set(jobs))
        groups = self._groups(names, SWEEP_BATCH)
        calls: list[Call] = [
            (
                lua.DUE_RUNS,
                [self._key(names[at], "open") for at in group],
                [self._base(names[at]) for at in group],
            )
            for group in groups
        ]
        due: list[DueRun] = []
        for group, reply in zip(groups, await self._eval_batch(calls), strict=True):
            for i in range(0, len(reply), 5):
                position, slot, attempt, origin, reason = reply[i : i + 5]
                job = names[group[int(position) - 1]]
                due.append(DueRun(job, int(slot), int(attempt), Origin(origin), _REASONS[reason]))
        due.sort(key=lambda d: (d.slot, d.job))
        return due

    async def take_over(self, request: TakeoverRequest) -> Claim:
        job, slot = request.job, request.slot
        outcome, attempt, now = await self._eval(
            lua.TAKE_OVER,
            [
                self._key(job, f"run:{slot}"),
                self._key(job, f"lease:{slot}"),
                self._key(job, "open"),
                self._key(job, "slots"),
            ],
            [
                slot,
                request.attempt,
                request.token,
                request.instance_id,
                request.lease_ms,
                request.horizon_ms,
                request.max_attempts,
                int(request.skip_overlap),
                self._base(job),
            ],
        )
        return Claim(Outcome(outcome), int(attempt), int(now))

    async def last_scheduled_slot(self, job: str) -> int | None:
        with self._errors():
            last = await command(self.client, "HGET", self._key(job, "job"), "last")
        return None if last is None else int(last)

    # -- job definitions -------------------------------------------------------------
    # The definition lives beside the job's other keys (``B definition``), so the claim
    # script reads it in the job's hash slot; the counter and the change log are one key
    # each for the whole store.
    @property
    def _definitions_version_key(self) -> str:
        return f"{self.prefix}:definitions:version"

    @property
    def _definitions_log_key(self) -> str:
        return f"{self.prefix}:definitions:log"

    async def write_definition(self, job: str, body: str | None, *, expected: int | None) -> int:
        """One script: the version check, ``INCR`` of the counter, the job's key, the log.

        Its keys lie in several hash slots (the job's, the counter's, the log's): one
        server only, not Redis Cluster yet (see ``WRITE_DEFINITION``).
        """
        verdict, version = await self._eval(
            lua.WRITE_DEFINITION,
            [
                self._key(job, "definition"),
                self._definitions_version_key,
                self._definitions_log_key,
            ],
            [
                job,
                "" if expected is None else expected,
                "0" if body is None else "1",
                body or "",
                self._definitions_channel,
            ],
        )
        if verdict == "conflict":
            current = int(version)
            raise ConflictError(
                f"definition {job!r} is at version {current}, not {expected}", current=current
            )
        return int(version)

    async def definitions_since(self, version: int) -> list[StoredDefinition]:
        """One script reads the log after ``version`` and each job's definition with it."""
        before, _, after = self._key("\0", "definition").partition("\0")  # around the job
        reply = await self._eval(
            lua.DEFINITIONS_SINCE, [self._definitions_log_key], [version, before, after]
        )
        return [
            StoredDefinition(reply[i], int(reply[i + 1]), reply[i + 2])
            for i in range(0, len(reply), 3)
        ]

    @property
    def _definitions_channel(self) -> str:
        return f"{self._definitions_log_key}:changed"

    async def watch_definitions(self, changed: Callable[[], None]) -> None:
        """Pub/sub on the channel every definition write publishes to, on a connection
        of its own; ``changed()`` once subscribed (changes made while not listening)."""
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            with self._errors():
                await pubsub.subscribe(self._definitions_channel)
                changed()
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None:
                        changed()
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    async def read_definition(self, job: str) -> StoredDefinition | None:
        """One ``HMGET`` of the job's definition hash (a tombstone has no body)."""
        with self._errors():
            version, body = await command(
                self.client, "HMGET", self._key(job, "definition"), "version", "body"
            )
        return None if body is None else StoredDefinition(job, int(version), body)

    async def definitions_version(self) -> int:
        with self._errors():
            version = await command(self.client, "GET", self._definitions_version_key)
        return 0 if version is None else int(version)

    # -- operations ----------------------------------------------------------------
    async def trigger(self, job: str, requested_by: str) -> int:
        call: Call = (lua.TRIGGER, [self._key(job, "open")], [self._base(job), requested_by])
        (slot,) = await self._eval_batch([call], before=self._index_commands(job))
        self._indexed.add(job)
        return int(slot)

    async def cancel(self, job: str, slot: int) -> bool:
        reply = await self._eval(
            lua.CANCEL,
            [
                self._key(job, f"run:{slot}"),
                self._key(job, f"lease:{slot}"),
                self._key(job, "open"),
                self._key(job, "slots"),
            ],
            [slot],
        )
        return bool(reply)


class RedisScriptBackend(_RunsBackend):
    """``strategy=script``: claim-only; one Lua script records the claim atomically.

    The run record is the lease strategy's, without a lease: the claim records
    ``claimed`` and the finish (fenced by the claim's token) ``success`` or ``failed``.
    """

    strategy = "script"
    capabilities = Capabilities(lease=False, store_clock=True, finish=True)
    open_state = "claimed"
    scripts = (lua.CLAIM_SCRIPT, lua.FINISH, lua.HISTORY, lua.PRUNE)

    def _claim_call(self, requests: Sequence[ClaimRequest]) -> Call:
        keys: list[str] = []
        args: list[str | int] = []
        for request in requests:
            job, slot = request.job, request.slot
            keys += [self._key(job, f"run:{slot}"), self._key(job, "job"), self._key(job, "slots")]
            args += [
                slot,
                request.token,
                request.instance_id,
                request.horizon_ms,
                str(request.origin),
                request.fingerprint,
            ]
        return lua.CLAIM_SCRIPT, keys, args


def run_records(job: str, slot: int, flat: Sequence[str]) -> list[RunRecord]:
    """The history records held in one run hash (``HGETALL`` reply, flat)."""
    fields = dict(zip(flat[::2], flat[1::2], strict=True))
    origin = Origin(fields.get("origin", Origin.SCHEDULE))
    records = []
    for field, status in fields.items():
        if not field.endswith(":status"):
            continue
        n = field[: -len(":status")]
        meta = fields.get(f"{n}:meta")
        records.append(
            RunRecord(
                job,
                slot,
                int(n),
                origin,
                Status(status),
                fields.get(f"{n}:instance"),
                _ms(fields.get(f"{n}:claimed")),
                _ms(fields.get(f"{n}:started")),
                _ms(fields.get(f"{n}:finished")),
                fields.get(f"{n}:error"),
                json.loads(meta) if meta else {},
            )
        )
    return records


def _ms(value: str | None) -> int | None:
    return None if value is None else int(value)
