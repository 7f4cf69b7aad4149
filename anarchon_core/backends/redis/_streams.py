"""The claim-only Redis strategies on streams: ``stream-id`` and ``idmp``.

One stream per job, ``prefix:{job}:stream``; one entry per won claim holding
``token``, ``instance``, ``origin``, ``claimed`` and ``fingerprint``. The stream *is*
the history (every record has status ``claimed``: a stream entry cannot be updated,
so the outcome is not written).

A plain ``XADD`` cannot look at a clock, so the claim horizon and early claims are
judged against the store's clock as estimated from ``TIME`` replies before the write,
and against the ``TIME`` sent in the same round trip after it: an entry that turns out
early is kept (it is ours; the engine repeats the claim at the right time with the same
token, and the repeat recognises it), one that turns out past its horizon is deleted.

A claim is repeated with the same token after a lost reply (the connection dropped
after sending) or an early answer. The backend remembers the tokens it sent recently,
and a repeat also reads the slot's entry, in the same round trip, to tell "mine" from
"taken" (``stream-id`` reads it with every claim: see below). The driver never resends
on its own, so no path can mistake its own earlier write for a rival's.

A ``stream-id`` stream refuses every id up to its top entry, so a slot older than one
already claimed can never be claimed. When the slot's own entry does not exist either,
nobody runs that slot: the claim is answered ``expired``, as one past its horizon
(the engine logs the slot as abandoned and counts ``claims_total{outcome="expired"}``),
not ``taken``, which would say another instance runs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from ...backend import (
    EARLY_TOLERANCE_MS,
    Capabilities,
    Claim,
    ClaimRequest,
    PruneScope,
    wall_clock_ms,
)
from ...errors import CapabilityError
from ...records import HistoryQuery, Origin, Outcome, RunRecord, Status, select_records
from . import _lua as lua
from ._base import RedisBackend, command, execute, newest_slot, queue
from ._url import DEFAULT_URL

__all__ = ["IDMP_PRODUCER", "RedisIdmpBackend", "RedisStreamIdBackend", "idmp_xadd_command"]

#: The producer id of every anarchon claim: one shared dedup domain per job stream.
IDMP_PRODUCER = "anarchon"
#: How long and how many idempotent ids a job's stream remembers (the server's maxima).
IDMP_DURATION_S = 86_400
IDMP_MAX_SIZE = 10_000
_MAX_SENT = 1024  # tokens remembered for repeats
#: What ``_add`` gives for a slot that has no entry and can never have one: a
#: ``stream-id`` claim of a slot older than the stream's top entry, whose own entry does
#: not exist. Nobody runs that slot: it is answered ``expired``, as a slot past its
#: horizon is (logged as abandoned, counted as ``claims_total{outcome="expired"}``).
ABANDONED = "abandoned"


def idmp_xadd_command(key: str, slot: int, fields: Mapping[str, str]) -> list[str]:
    """``XADD key IDMP anarchon <slot> * field value …``: at most one entry per slot."""
    command = ["XADD", key, "IDMP", IDMP_PRODUCER, str(slot), "*"]
    for name, value in fields.items():
        command += [name, value]
    return command


class _StreamBackend(RedisBackend):
    """What both stream strategies share: the clock estimate, history and prune."""

    capabilities = Capabilities(lease=False, store_clock=True, finish=False)

    def __init__(
        self, url: str = DEFAULT_URL, *, strategy: str | None = None, prefix: str | None = None
    ) -> None:
        super().__init__(url, strategy=strategy, prefix=prefix)
        self._skew_ms = 0
        self._sent: dict[str, None] = {}  # recent claim tokens, oldest first

    async def _opened(self, client: Redis) -> None:
        sent = wall_clock_ms()
        self._observe(await command(client, "TIME"), sent)

    def _observe(self, reply: Sequence[Any], sent_ms: int) -> int:
        """The store's now from a ``TIME`` reply; updates the skew estimate."""
        seconds, micros = reply
        now = int(seconds) * 1000 + int(micros) // 1000
        self._skew_ms = now - (sent_ms + wall_clock_ms()) // 2
        return now

    async def claim(self, request: ClaimRequest) -> Claim:
        (claim,) = await self.claim_many([request])
        return claim

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        """Every claim's add in one round trip, each decided as alone, in order.

        A second round trip only deletes entries that turned out past their horizon
        (``idmp``: or reads the entry of a repeated claim's duplicate).
        """
        estimate = wall_clock_ms() + self._skew_ms
        claims: dict[int, Claim] = {}
        sending: list[int] = []
        for at, request in enumerate(requests):
            verdict = _judge(request, estimate)
            if verdict is None:
                sending.append(at)
            else:  # nothing written: the store's clock says no
                claims[at] = Claim(verdict, store_now=estimate)
        batch = [requests[at] for at in sending]
        repeats = [self._repeated(request.token) for request in batch]
        added = await self._add(batch, repeats) if batch else []
        late: list[tuple[str, str]] = []
        for at, request, (entry, now) in zip(sending, batch, added, strict=True):
            if entry is None:
                verdict = Outcome.TAKEN
            elif entry == ABANDONED:  # never claimable: reported as a slot past its horizon
                verdict, entry = Outcome.EXPIRED, None
            else:
                verdict = _judge(request, now)
            if verdict == Outcome.EXPIRED and entry is not None:
                late.append((self._key(request.job, "stream"), entry))
            if verdict is None:
                claims[at] = Claim(Outcome.WON, 1, now)
            else:
                claims[at] = Claim(verdict, store_now=now)
        if late:
            with self._errors():  # written past their horizon: nobody runs them, not even us
                pipe = self.client.pipeline(transaction=False)
                for key, entry in late:
                    queue(pipe, "XDEL", key, entry)
                await execute(pipe)
        return [claims[at] for at in range(len(requests))]

    def _repeated(self, token: str) -> bool:
        """Whether a claim with ``token`` was sent recently (remembering it from now on)."""
        repeat = token in self._sent
        self._sent[token] = None
        while len(self._sent) > _MAX_SENT:
            del self._sent[next(iter(self._sent))]
        return repeat

    async def _add(
        self, requests: Sequence[ClaimRequest], repeats: Sequence[bool]
    ) -> list[tuple[str | None, int]]:
        """Write the claims; per claim ``(entry id if it is ours, store now)``, in order.

        The entry id is :data:`ABANDONED` when the slot has no entry and can never have
        one (``stream-id``: a newer slot of the job is claimed already).
        """
        raise NotImplementedError

    def _fields(self, request: ClaimRequest, claimed: int) -> dict[str, str]:
        return {
            "token": request.token,
            "instance": request.instance_id,
            "origin": str(request.origin),
            "claimed": str(claimed),
            "fingerprint": request.fingerprint,
        }

    # -- history -----------------------------------------------------------------
    async def history(self, query: HistoryQuery) -> list[RunRecord]:
        if query.limit <= 0 or query.status not in (None, Status.CLAIMED):
            return []
        jobs = [query.job] if query.job is not None else await self._jobs()
        found: dict[str, list[RunRecord]] = {job: [] for job in jobs}
        reads = {job: self._history_command(job, query) for job in jobs}
        while reads:  # one round trip for every job still reading
            with self._errors():
                pipe = self.client.pipeline(transaction=False)
                for read in reads.values():
                    queue(pipe, *read)
                replies = await execute(pipe)
            more: dict[str, list[str | int]] = {}
            for (job, read), entries in zip(reads.items(), replies, strict=True):
                for entry_id, fields in entries:
                    if (record := self._record(job, entry_id, fields)) is not None:
                        found[job].append(record)
                follow = self._next_command(read, entries, found[job], query)
                if follow is not None:
                    more[job] = follow
            reads = more
        return select_records((r for records in found.values() for r in records), query)

    def _history_command(self, job: str, query: HistoryQuery) -> list[str | int]:
        raise NotImplementedError

    def _next_command(
        self,
        read: list[str | int],
        entries: Sequence[Any],
        records: list[RunRecord],
        query: HistoryQuery,
    ) -> list[str | int] | None:
        """The read that continues ``read`` when its reply cannot hold the whole page."""
        return None

    def _record(self, job: str, entry_id: str, fields: Mapping[str, str]) -> RunRecord | None:
        raise NotImplementedError

    async def prune(
        self,
        older_than_ms: int,
        *,
        jobs: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> int:
        """Trim each job's stream below ``older_than_ms``, always keeping its latest entry."""
        scope = PruneScope.of(jobs, namespace)
        deleted = 0
        for job in scope.select(await self._jobs()):
            key = self._key(job, "stream")
            with self._errors():
                top = await command(self.client, "XREVRANGE", key, "+", "-", "COUNT", 1)
                if not top:
                    continue
                latest = _ms(top[0][0])
                threshold = min(older_than_ms, latest)
                trimmed = await command(self.client, "XTRIM", key, "MINID", "=", f"{threshold}-0")
            deleted += int(trimmed)
        return deleted


class RedisStreamIdBackend(_StreamBackend):
    """``strategy=stream-id``: ``XADD`` with the slot as the explicit entry id ``<slot>-0``.

    The stream refuses an id equal to or older than its top entry, so exactly one add
    per slot succeeds, and a slot older than one already claimed can never be claimed:
    such a slot without an entry of its own is abandoned (answered ``expired``). The
    slot's entry is read in the same round trip as the add, so a loss is still one
    round trip. Trimming keeps that top id, so prune cannot reopen a slot.
    """

    strategy = "stream-id"

    async def _add(
        self, requests: Sequence[ClaimRequest], repeats: Sequence[bool]
    ) -> list[tuple[str | None, int]]:
        """One pipeline (not a transaction): ``TIME``, then per claim ``XADD`` and ``XRANGE``."""
        index = self._index_many(request.job for request in requests)
        claimed = wall_clock_ms() + self._skew_ms
        with self._errors():
            pipe = self.client.pipeline(transaction=False)
            for queued in index:
                queue(pipe, *queued)
            queue(pipe, "TIME")
            for request in requests:
                key, entry = self._key(request.job, "stream"), f"{request.slot}-0"
                queue(pipe, "XADD", key, entry, *_flat(self._fields(request, claimed)))
                # The slot's entry, whoever added it: ours (a repeat after a lost reply),
                # another instance's (taken), or none at all (abandoned, see below).
                queue(pipe, "XRANGE", key, entry, entry)
            sent = wall_clock_ms()
            replies = await execute(pipe, raise_on_error=False)
            replies = replies[len(index) :]
            if isinstance(replies[0], Exception):
                raise replies[0]
            now = self._observe(replies[0], sent)
            results: list[tuple[str | None, int]] = []
            for n, request in enumerate(requests):
                added, found = replies[2 * n + 1], replies[2 * n + 2]
                if isinstance(added, ResponseError) and "smaller" in str(added):
                    if isinstance(found, Exception):
                        raise found
                    if not found:  # a newer slot is claimed: no add of this one can succeed
                        added = ABANDONED
                    elif found[0][1].get("token") == request.token:
                        added = f"{request.slot}-0"  # ours: a lost reply, or kept as early
                    else:
                        added = None
                elif isinstance(added, Exception):
                    raise added
                results.append((None if added is None else str(added), now))
        if index:
            self._indexed.update(request.job for request in requests)
        return results

    def _history_command(self, job: str, query: HistoryQuery) -> list[str | int]:
        # Entry ids are slots: the range is exact but for the cursor's own slot, whose one
        # entry may be after the cursor; one entry more keeps the page full then.
        end = newest_slot(query, job)
        top = "+" if end is None else f"{'' if end[1] else '('}{end[0]}-0"
        bottom = "-" if query.since is None else f"{query.since}-0"
        count = query.limit + (0 if query.before is None else 1)
        return ["XREVRANGE", self._key(job, "stream"), top, bottom, "COUNT", count]

    def _record(self, job: str, entry_id: str, fields: Mapping[str, str]) -> RunRecord | None:
        claimed = int(fields["claimed"]) if "claimed" in fields else None
        return RunRecord(
            job,
            _ms(entry_id),
            1,
            Origin(fields.get("origin", Origin.SCHEDULE)),
            Status.CLAIMED,
            fields.get("instance"),
            claimed,
            claimed,
            None,
        )


class RedisIdmpBackend(_StreamBackend):
    """``strategy=idmp``: ``XADD … IDMP anarchon <slot> *`` (Redis ≥ 8.6).

    The server remembers each (producer, idempotent id) for ``IDMP-DURATION`` (set to
    its maximum, 24 h) and at most ``IDMP-MAXSIZE`` (10,000) ids per stream; a second
    add of a remembered slot returns the first entry's id and adds nothing. Untested
    against a live Redis 8.6 (none is available to the test suite).
    """

    strategy = "idmp"
    scripts = (lua.IDMP_SETUP,)

    def __init__(
        self, url: str = DEFAULT_URL, *, strategy: str | None = None, prefix: str | None = None
    ) -> None:
        super().__init__(url, strategy=strategy, prefix=prefix)
        self._configured: set[str] = set()  # job streams set up by this process

    async def _check_server(self, client: Redis) -> None:
        await super()._check_server(client)
        version = self.server_version
        if self.server.startswith("Valkey") or version is None or version < (8, 6):
            raise CapabilityError(
                f"strategy 'idmp' needs Redis >= 8.6 (XADD ... IDMP); {self.describe()} runs "
                f"{self.server}. Strategies that work on it: lease (the default), stream-id, "
                f"script"
            )

    async def _add(
        self, requests: Sequence[ClaimRequest], repeats: Sequence[bool]
    ) -> list[tuple[str | None, int]]:
        """One transaction: ``TIME``, then per claim the add and its stream's top entry.

        Each add is followed by the read of its stream's top entry with nothing in
        between, so the claim knows whether its own add wrote that entry. On Redis
        Cluster a transaction holds keys of one hash slot: one per slot, sent together.
        """
        new = [r.job for r in requests if r.job not in self._configured]
        if new:  # once per job and process: a round trip more
            await self._eval_batch(
                [
                    (lua.IDMP_SETUP, [self._key(job, "stream")], [IDMP_DURATION_S, IDMP_MAX_SIZE])
                    for job in dict.fromkeys(new)
                ],
                before=self._index_many(new),
            )
            self._configured.update(new)
            self._indexed.update(new)
        claimed = wall_clock_ms() + self._skew_ms
        groups = self._groups([request.job for request in requests], max(len(requests), 1))
        with self._errors():
            answers = await asyncio.gather(
                *(self._transaction([requests[at] for at in group], claimed) for group in groups),
                return_exceptions=True,  # every transaction ends before an error is raised
            )
            replies: list[tuple[int, list[tuple[Any, Any]]]] = []
            for answer in answers:
                if isinstance(answer, BaseException):
                    raise answer
                replies.append(answer)
        results: dict[int, tuple[str | None, int]] = {}
        duplicates: dict[int, str] = {}  # repeats whose add returned an older entry
        for group, (now, adds) in zip(groups, replies, strict=True):
            for at, (entry, top) in zip(group, adds, strict=True):
                mine = False
                if top and top[0][0] == entry:
                    mine = top[0][1].get("token") == requests[at].token
                elif repeats[at]:  # a duplicate of an older entry: ours if it has our token
                    duplicates[at] = str(entry)
                results[at] = ((str(entry) if mine else None), now)
        if duplicates:
            with self._errors():
                pipe = self.client.pipeline(transaction=False)
                for at, entry in duplicates.items():
                    queue(pipe, "XRANGE", self._key(requests[at].job, "stream"), entry, entry)
                found = await execute(pipe)
            for (at, entry), entries in zip(duplicates.items(), found, strict=True):
                if entries and entries[0][1].get("token") == requests[at].token:
                    results[at] = (entry, results[at][1])
        return [results[at] for at in range(len(requests))]

    async def _transaction(
        self, requests: Sequence[ClaimRequest], claimed: int
    ) -> tuple[int, list[tuple[Any, Any]]]:
        """``(store now, [(entry id, top entry after it)] per claim)`` of one transaction."""
        pipe = self.client.pipeline(transaction=True)
        queue(pipe, "TIME")
        for request in requests:
            key = self._key(request.job, "stream")
            queue(pipe, *idmp_xadd_command(key, request.slot, self._fields(request, claimed)))
            queue(pipe, "XREVRANGE", key, "+", "-", "COUNT", 1)
        sent = wall_clock_ms()
        clock, *rest = await execute(pipe)
        return self._observe(clock, sent), list(zip(rest[::2], rest[1::2], strict=True))

    def _history_command(self, job: str, query: HistoryQuery) -> list[str | int]:
        # Entry ids are arrival times; a claim arrives at most EARLY_TOLERANCE_MS early,
        # but any time later (catch-up), so only the bottom of the range is known.
        bottom = "-" if query.since is None else str(max(query.since - EARLY_TOLERANCE_MS, 0))
        return ["XREVRANGE", self._key(job, "stream"), "+", bottom, "COUNT", query.limit + 1]

    def _next_command(
        self,
        read: list[str | int],
        entries: Sequence[Any],
        records: list[RunRecord],
        query: HistoryQuery,
    ) -> list[str | int] | None:
        """Read on (twice as many) until no older entry can belong to the page.

        Arrival order is not slot order, but an entry that arrived at ``t`` holds a slot
        of at most ``t + EARLY_TOLERANCE_MS``: once the page's last slot is newer than
        that for the last entry read, the entries not read yet all sort after the page.
        """
        _, key, _, bottom, _, count = read
        if len(entries) < int(count):
            return None  # the range is exhausted
        last = entries[-1][0]
        page = select_records(records, query)
        if len(page) == query.limit and page[-1].slot > _ms(last) + EARLY_TOLERANCE_MS:
            return None
        return ["XREVRANGE", key, f"({last}", bottom, "COUNT", 2 * int(count)]

    def _record(self, job: str, entry_id: str, fields: Mapping[str, str]) -> RunRecord | None:
        if "slot" not in fields:
            return None
        claimed = _ms(entry_id)  # the server's clock at the add
        return RunRecord(
            job,
            int(fields["slot"]),
            1,
            Origin(fields.get("origin", Origin.SCHEDULE)),
            Status.CLAIMED,
            fields.get("instance"),
            claimed,
            claimed,
            None,
        )

    def _fields(self, request: ClaimRequest, claimed: int) -> dict[str, str]:
        return {"slot": str(request.slot), **super()._fields(request, claimed)}


def _judge(request: ClaimRequest, now: int) -> Outcome | None:
    """The claim horizon and the early rule at the store's ``now``; None: may claim."""
    if request.slot > now + EARLY_TOLERANCE_MS:
        return Outcome.EARLY
    if request.slot < now - request.horizon_ms:
        return Outcome.EXPIRED
    return None


def _ms(entry_id: str) -> int:
    """The milliseconds part of a stream entry id (``<ms>-<seq>``)."""
    return int(entry_id.split("-")[0])


def _flat(fields: Mapping[str, str]) -> list[str]:
    return [part for pair in fields.items() for part in pair]
