"""What the Redis strategies share: the connection, layout record, keys and script calls.

:class:`RedisBackend` is the public base class (re-exported by
:mod:`anarchon_core.backends.redis`, which documents the strategies); calling it builds
the subclass of the chosen strategy. Driver retries are off: a command that may have
run is never resent blindly (a repeated ``XADD`` would read as a lost claim); the
engine retries with the same token, which every strategy recognises.

Script calls (:meth:`RedisBackend._eval`: a claim, a finish …; ``_eval_batch``: a
heartbeat …) are coalesced: each round trip costs far more client CPU (pool, timeouts,
socket wake-ups) than a command in it, so the calls issued while a pipeline is in
flight queue up and leave together in the next one. A lone call still leaves at the
end of the current event-loop iteration: there is no timer, so an idle store adds no
latency. One queue keeps the calls in the order they were made (a heartbeat issued
after a finish cannot overtake it), and their callers resume in that order. Claims are
the exception (``_eval_alone``): each request is a round trip of its own, so that a
stalled reply on the queue's connection cannot hold them past their horizon.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, ClassVar, Self, TypeVar, cast

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...backend import SCHEMA_VERSION, Backend, InstanceInfo, instance_json
from ...errors import (
    BackendError,
    BackendUnavailable,
    CapabilityError,
    ConfigurationError,
    SchemaVersionError,
)
from ...records import HistoryQuery
from ._lua import INSTANCES, REGISTER, LuaScript
from ._url import DEFAULT_URL, parse_url

__all__ = [
    "SCRIPT_BATCH",
    "Call",
    "RedisBackend",
    "command",
    "execute",
    "newest_slot",
    "queue",
    "server_version",
]

#: Oldest server whose commands every strategy uses (``XTRIM MINID``, exclusive ranges).
MIN_SERVER = (6, 2)
#: Connection defaults (``?max_connections=``, ``?socket_timeout=`` … override them).
POOL_SIZE = 50
POOL_WAIT_S = 5.0
SOCKET_TIMEOUT_S = 5.0
#: Commands per coalesced pipeline, at most (a larger ``_eval_batch`` still goes whole):
#: bounds how long one reply takes to read while the calls behind it wait.
MAX_BATCH = 256
#: Claims or finishes decided by one batch script, at most (a batch of more is several
#: scripts in one round trip): bounds how long one script holds the server, about ten
#: commands per claim.
SCRIPT_BATCH = 100

_TRANSIENT_REPLIES = ("LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "BUSY")

T = TypeVar("T")
logger = logging.getLogger("anarchon.backends.redis")
Call = tuple[LuaScript, Sequence[str], Sequence[str | int]]
#: One command of a pipeline, with the script it runs (``EVALSHA``), if any.
Command = tuple[LuaScript | None, Sequence[str | int]]


@dataclass(slots=True)
class _Queued:
    """A coalesced script call waiting for its round trip: its commands and its caller."""

    commands: list[Command]  # plain commands first (the index ``SADD``), then scripts
    future: asyncio.Future[Any]
    scripts_from: int  # where the scripts' replies start: the plain commands' are dropped
    single: bool  # one script (its reply) or a batch (the list of its scripts' replies)


class RedisBackend(Backend):
    """A Redis or Valkey store; ``strategy`` picks how claims are decided (see module doc).

    ``url`` may carry ``?strategy=`` and ``?prefix=`` (the keyword arguments win only when
    the URL does not set them differently) and redis-py's connection parameters
    (``socket_timeout``, ``client_name``, ``ssl_*`` …). Every key starts with
    ``prefix + ":"``, so several deployments can share one database.
    """

    strategy: ClassVar[str] = "lease"
    #: The class of each strategy, filled as the strategies are defined (they import
    #: this module, never the other way round).
    by_strategy: ClassVar[dict[str, type[RedisBackend]]] = {}
    name = "redis"
    #: Scripts this strategy runs; loaded at open, reloaded after ``NOSCRIPT``.
    scripts: ClassVar[tuple[LuaScript, ...]] = ()

    def __new__(
        cls, url: str = DEFAULT_URL, *, strategy: str | None = None, prefix: str | None = None
    ) -> Self:
        target: type[RedisBackend] = cls
        if cls is RedisBackend:
            target = RedisBackend.by_strategy[parse_url(url, strategy, prefix).strategy]
        return cast(Self, object.__new__(target))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "strategy" in vars(cls):  # a concrete strategy, not a shared base of some
            RedisBackend.by_strategy[cls.strategy] = cls

    def __init__(
        self, url: str = DEFAULT_URL, *, strategy: str | None = None, prefix: str | None = None
    ) -> None:
        # RedisBackend(...) has already picked this class from the URL and ``strategy``.
        settings = parse_url(url, strategy or type(self).strategy, prefix)
        if settings.strategy != type(self).strategy:
            raise ConfigurationError(
                f"{type(self).__name__} implements strategy {type(self).strategy!r}, "
                f"not {settings.strategy!r}: use RedisBackend(url, strategy=...)"
            )
        self.prefix = settings.prefix
        self.name = f"redis?strategy={settings.strategy}"
        self._settings = settings
        self._client: Redis | None = None
        self._indexed: set[str] = set()  # jobs known to be in the jobs index
        self._queued: list[_Queued] = []  # script calls waiting for the next round trip
        self._flusher: asyncio.Task[None] | None = None  # sends them; one pipeline at a time
        #: Pipelines sent (tests observe the coalescing with it).
        self.round_trips = 0
        self.server = "a server whose version is unknown (INFO refused)"
        self.server_version: tuple[int, ...] | None = None
        #: The server runs Redis Cluster (``INFO cluster``): every script is given keys of
        #: one hash slot only (see :meth:`_groups`).
        self.cluster = False

    @classmethod
    def from_url(cls, url: str) -> RedisBackend:
        """``redis://…`` or ``rediss://…`` with ``?strategy=`` and ``?prefix=``."""
        return cls(url)

    def describe(self) -> str:
        return self._settings.describe

    # -- keys --------------------------------------------------------------------
    # Per-job keys carry the job as a Redis Cluster hash tag, so a script that touches
    # several keys of one job stays within one hash slot.
    def _base(self, job: str) -> str:
        return f"{self.prefix}:{{{job}}}:"

    def _key(self, job: str, suffix: str) -> str:
        return f"{self.prefix}:{{{job}}}:{suffix}"

    @property
    def _layout_key(self) -> str:
        return f"{self.prefix}:layout"

    @property
    def _jobs_key(self) -> str:
        return f"{self.prefix}:jobs"

    # -- life cycle --------------------------------------------------------------
    async def open(self) -> None:
        """Connect, check the server and the layout record, load the scripts."""
        if self._client is not None:
            return
        # A bounded pool that waits for a free connection (up to ``POOL_WAIT_S``) instead
        # of failing a burst of concurrent calls; URL parameters override these defaults.
        pool = BlockingConnectionPool.from_url(
            self._settings.driver_url,
            max_connections=POOL_SIZE,
            timeout=POOL_WAIT_S,
            decode_responses=True,
            retry=Retry(NoBackoff(), 0),  # see the module doc: never resend blindly
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=SOCKET_TIMEOUT_S,
            client_name="anarchon",
        )
        client = Redis.from_pool(pool)
        try:
            with self._errors():
                await self._check_server(client)
                await self._check_cluster(client)
                await self._check_layout(client)
                pipe = client.pipeline(transaction=False)
                for script in (*self.scripts, REGISTER, INSTANCES):
                    queue(pipe, "SCRIPT", "LOAD", script.source)
                await execute(pipe)
                await self._opened(client)
        except BaseException:
            await client.aclose()
            raise
        self._client = client

    async def close(self) -> None:
        """Stop sending coalesced calls (their callers get ``BackendUnavailable``), disconnect."""
        client, self._client = self._client, None
        flusher, self._flusher = self._flusher, None
        if flusher is not None and not flusher.done():
            flusher.cancel()
            # wait() and not ``await flusher``: a cancellation of close() itself must surface.
            await asyncio.wait([flusher])
        # A flusher cancelled before its first step never ran: fail what it left queued.
        self._fail(self._queued, self._closed)
        self._queued.clear()
        if client is not None:
            await client.aclose()

    async def _check_server(self, client: Redis) -> None:
        """Refuse a server too old for this strategy, naming its version."""
        try:
            info = await command(client, "INFO", "server")
        except ResponseError:  # INFO renamed or denied (managed services): trust the server
            return
        version, self.server = server_version(info)
        self.server_version = version
        if version is not None and version < MIN_SERVER:
            raise CapabilityError(
                f"{self.describe()} runs {self.server}; the Redis backend needs Redis "
                f">= {MIN_SERVER[0]}.{MIN_SERVER[1]} or Valkey"
            )
        self.setting_warnings = tuple(await self._settings_that_break_guarantees(client))

    async def _settings_that_break_guarantees(self, client: Redis) -> list[str]:
        """Server settings that break the guarantees (read where CONFIG/INFO allow)."""
        found = []
        persistence: Any = None
        config: Any = None
        with contextlib.suppress(ResponseError):  # renamed or denied on managed services
            persistence = await command(client, "INFO", "persistence")
        with contextlib.suppress(ResponseError):
            config = await command(client, "CONFIG", "GET", "maxmemory-policy")
        policy = config.get("maxmemory-policy") if isinstance(config, dict) else None
        if policy not in (None, "noeviction"):
            found.append(
                f"{self.describe()}: maxmemory-policy is {policy!r}: Redis may evict run "
                "records or leases, and a slot may then run twice; set maxmemory-policy "
                "noeviction"
            )
        if isinstance(persistence, dict) and not persistence.get("aof_enabled"):
            found.append(
                f"{self.describe()}: AOF persistence is off: a restart forgets recorded claims "
                "(and leases), so a slot still within its horizon may run again; set "
                "appendonly yes"
            )
        return found

    async def _check_cluster(self, client: Redis) -> None:
        """Note whether the server runs Redis Cluster (batch scripts are then cut by hash slot)."""
        with contextlib.suppress(ResponseError):  # renamed or denied: assume no cluster
            info = await command(client, "INFO", "cluster")
            self.cluster = isinstance(info, dict) and str(info.get("cluster_enabled")) == "1"

    async def _check_layout(self, client: Redis) -> None:
        """Record the layout version and strategy once; refuse a newer layout or a mix."""
        pipe = client.pipeline(transaction=True)
        queue(pipe, "HSETNX", self._layout_key, "version", SCHEMA_VERSION)
        queue(pipe, "HSETNX", self._layout_key, "strategy", self.strategy)
        queue(pipe, "HMGET", self._layout_key, "version", "strategy")
        *_, (version, strategy) = await execute(pipe)
        try:
            stored = int(version)
        except (TypeError, ValueError):
            raise BackendError(
                f"the Redis store {self.describe()} holds an unreadable layout version "
                f"{version!r} in {self._layout_key!r}"
            ) from None
        if stored > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"the Redis store {self.describe()} holds layout version {stored}, newer than "
                f"version {SCHEMA_VERSION} known to this anarchon: upgrade anarchon to use it"
            )
        if strategy != self.strategy:
            raise ConfigurationError(
                f"the keys under prefix {self.prefix!r} in {self.describe()} were written by "
                f"strategy {strategy!r}, not {self.strategy!r}: every instance must use one "
                f"strategy (a mix could run a slot twice); use ?strategy={strategy} or "
                f"another ?prefix="
            )

    async def _opened(self, client: Redis) -> None:
        """Hook for strategies that prepare more at open."""

    # -- calls -------------------------------------------------------------------
    @property
    def client(self) -> Redis:
        """The open client (benchmarks issue raw commands on it)."""
        if self._client is None:
            raise BackendError(f"{self.describe()} is not open: await open() first")
        return self._client

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Convert driver errors at the boundary: unavailable (retried) or a store error."""
        try:
            yield
        except RedisError as exc:
            if isinstance(exc, RedisConnectionError):
                self._indexed.clear()  # a restarted server may have lost the index
            raise self._convert(exc) from exc

    def _convert(self, exc: RedisError) -> BackendError:
        message = f"Redis store {self.describe()}: {exc}"
        if isinstance(exc, AuthenticationError | AuthorizationError):
            return BackendError(message)  # will not mend by waiting: raised at start
        transient = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, BusyLoadingError)
        if isinstance(exc, transient) or str(exc).startswith(_TRANSIENT_REPLIES):
            return BackendUnavailable(message)
        return BackendError(message)

    async def _eval(
        self,
        script: LuaScript,
        keys: Sequence[str],
        args: Sequence[str | int],
        *,
        before: Sequence[Sequence[str | int]] = (),
    ) -> Any:
        """One script (after plain commands ``before``), coalesced with concurrent calls.

        The call joins the queue that the store's flusher task sends, one pipeline at a
        time (see the module doc). Its reply or error is its own: another call's error
        does not fail it; a connection failure fails every call of its round trip. A
        caller cancelled while waiting just stops waiting; its script may still run (a
        cancelled call is ambiguous in the contract). Awaiting a plain future cannot
        swallow that cancellation, unlike the driver's calls (see ``_keep_cancellation``).
        """
        commands: list[Command] = [(None, command) for command in before]
        commands.append((script, ("EVALSHA", script.sha, len(keys), *keys, *args)))
        return await self._enqueue(commands, len(before), single=True)

    async def _eval_batch(
        self, calls: Sequence[Call], *, before: Sequence[Sequence[str | int]] = ()
    ) -> list[Any]:
        """Several scripts (after plain commands ``before``) in one pipelined round trip.

        Each script is atomic on its own; the batch is not (the scripts may touch
        different jobs, which Redis Cluster keeps on different nodes). The batch is
        queued and coalesced like :meth:`_eval`; its first error fails the whole batch.
        """
        if not calls and not before:
            return []
        commands: list[Command] = [(None, command) for command in before]
        for script, keys, args in calls:
            commands.append((script, ("EVALSHA", script.sha, len(keys), *keys, *args)))
        result: list[Any] = await self._enqueue(commands, len(before), single=False)
        return result

    async def _eval_alone(
        self, calls: Sequence[Call], *, before: Sequence[Sequence[str | int]] = ()
    ) -> list[Any]:
        """Like :meth:`_eval_batch`, in a round trip of its own instead of the queue.

        Claims go this way: a reply delayed on the queue's pipeline (a slow network, a
        stalled connection) would hold every claim queued behind it, possibly past the
        claims' horizon. Alone, each claim request takes a pool connection of its own,
        and a retry of one that stalls goes out on another.
        """
        self.client  # noqa: B018 - refuse at once when not open
        commands: list[Command] = [(None, command) for command in before]
        for script, keys, args in calls:
            commands.append((script, ("EVALSHA", script.sha, len(keys), *keys, *args)))
        call = _Queued(commands, asyncio.get_running_loop().create_future(), len(before), False)
        await self._send([call])
        result: list[Any] = await call.future
        return result

    async def _enqueue(self, commands: list[Command], scripts_from: int, *, single: bool) -> Any:
        """Queue commands for the flusher (started if idle) and wait for their replies."""
        self.client  # noqa: B018 - refuse at once when not open
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queued.append(_Queued(commands, future, scripts_from, single))
        if self._flusher is None or self._flusher.done():  # done: cancelled before it ran
            # A task runs from the next loop iteration on: the calls issued in this one
            # join the first batch.
            self._flusher = loop.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        """Send the queued calls, about ``MAX_BATCH`` commands per pipeline, until none are left.

        While one pipeline is in flight, new calls queue up for the next: under load the
        batches grow by themselves.
        """
        queued = self._queued
        batch: list[_Queued] = []
        try:
            while queued:
                taken = size = 0
                while taken < len(queued) and size < MAX_BATCH:
                    size += len(queued[taken].commands)
                    taken += 1
                batch = [call for call in queued[:taken] if not call.future.done()]
                del queued[:taken]
                if batch:
                    await self._send(batch)
        except BaseException as exc:  # cancelled by close(), or a bug: fail every waiter
            unexpected = partial(_same, exc)
            cancelled = isinstance(exc, asyncio.CancelledError)
            self._fail([*batch, *queued], self._closed if cancelled else unexpected)
            queued.clear()
            raise
        finally:
            if self._flusher is asyncio.current_task():
                self._flusher = None

    async def _send(self, batch: Sequence[_Queued]) -> None:
        """One pipeline of coalesced calls; each caller gets its reply or its error."""
        commands = [command for call in batch for command in call.commands]
        try:
            replies = await self._pipeline(self.client, commands)
        except BackendError:  # closed
            self._fail(batch, self._closed)
            return
        except RedisError as exc:  # the connection failed: every call of it is ambiguous
            self._fail(batch, partial(self._failure, exc))
            return
        at = 0
        for call in batch:
            mine = replies[at : at + len(call.commands)]
            at += len(call.commands)
            if call.future.done():  # its caller was cancelled
                continue
            error = next((reply for reply in mine if isinstance(reply, Exception)), None)
            if error is None:
                start = call.scripts_from
                call.future.set_result(mine[start] if call.single else mine[start:])
            else:
                call.future.set_exception(self._failure(error))

    def _closed(self) -> BaseException:
        return BackendUnavailable(f"Redis store {self.describe()} was closed during the call")

    @staticmethod
    def _fail(calls: Sequence[_Queued], error: Callable[[], BaseException]) -> None:
        """Fail the callers still waiting, each with its own exception (raising one
        instance in several tasks would chain their tracebacks together)."""
        for call in calls:
            if not call.future.done():
                call.future.set_exception(error())

    def _failure(self, exc: BaseException) -> BaseException:
        """What a caller raises for a driver error: as :meth:`_errors` would convert it."""
        if not isinstance(exc, RedisError):
            return exc
        if isinstance(exc, RedisConnectionError):
            self._indexed.clear()  # a restarted server may have lost the index
        converted = self._convert(exc)
        converted.__cause__ = exc
        return converted

    async def _pipeline(self, client: Redis, commands: Sequence[Command]) -> list[Any]:
        """Commands in one pipelined round trip: their replies, errors in place.

        A script the server does not know (``NOSCRIPT``: it restarted or flushed its
        scripts) did not run: those scripts are loaded and only their calls run again.
        """
        pipe = client.pipeline(transaction=False)
        for _, args in commands:
            queue(pipe, *args)
        self.round_trips += 1
        replies = await execute(pipe, raise_on_error=False)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            retry = client.pipeline(transaction=False)
            for source in {
                script.source for i in missing if (script := commands[i][0]) is not None
            }:
                queue(retry, "SCRIPT", "LOAD", source)
            for i in missing:
                queue(retry, *commands[i][1])
            self.round_trips += 1
            again = await execute(retry, raise_on_error=False)
            for i, reply in zip(missing, again[-len(missing) :], strict=True):
                replies[i] = reply
        return replies

    def _index_commands(self, job: str) -> list[Sequence[str]]:
        """``SADD`` to the jobs index, sent with a job's first write in this process.

        The index lists every job for history and prune across jobs. It is a plain set
        outside the jobs' hash slots, so it cannot be written inside their scripts; it
        is pipelined in the same round trip instead (re-adding a member writes nothing).
        """
        return self._index_many([job])

    def _index_many(self, jobs: Iterable[str]) -> list[Sequence[str]]:
        """One ``SADD`` of the jobs not yet indexed by this process (see above), or none."""
        new = [job for job in dict.fromkeys(jobs) if job not in self._indexed]
        return [("SADD", self._jobs_key, *new)] if new else []

    def _groups(self, jobs: Sequence[str], size: int = SCRIPT_BATCH) -> list[list[int]]:
        """The positions of ``jobs`` cut into groups of at most ``size``, one batch script each.

        Positions stay in order inside a group, and the groups are sent in order in one
        round trip. On Redis Cluster every key of a script must be in one hash slot, so
        a group holds the jobs of one slot only (all keys of a job share its slot); the
        requests of one job are then still in one group, in order, and requests of
        different jobs never see each other.
        """
        if not self.cluster:
            return [list(range(at, min(at + size, len(jobs)))) for at in range(0, len(jobs), size)]
        by_slot: dict[int, list[int]] = {}
        for at, job in enumerate(jobs):
            by_slot.setdefault(key_slot(self._key(job, "").encode()), []).append(at)
        return [
            group[at : at + size] for group in by_slot.values() for at in range(0, len(group), size)
        ]

    async def _jobs(self) -> list[str]:
        with self._errors():
            members = await command(self.client, "SMEMBERS", self._jobs_key)
        return sorted(members)

    # -- the instance registry (every strategy) --------------------------------------
    @property
    def _instances_key(self) -> str:
        return f"{self.prefix}:instances"

    async def register(self, info: InstanceInfo, ttl_ms: int) -> None:
        text = instance_json(replace(info, last_seen=0))  # the store sets last_seen
        await self._eval(REGISTER, [self._instances_key], [info.instance_id, ttl_ms, text])

    async def unregister(self, instance_id: str) -> None:
        with self._errors():
            await command(self.client, "HDEL", self._instances_key, instance_id)

    async def instances(self) -> list[InstanceInfo]:
        reply = await self._eval(INSTANCES, [self._instances_key], [])
        live = [
            replace(InstanceInfo.from_json(json.loads(reply[i + 1])), last_seen=int(reply[i]))
            for i in range(0, len(reply), 2)
        ]
        return sorted(live, key=lambda info: info.instance_id)

    async def now_ms(self) -> int:
        with self._errors():
            seconds, micros = await command(self.client, "TIME")
        return int(seconds) * 1000 + int(micros) // 1000


def newest_slot(query: HistoryQuery, job: str) -> tuple[int, bool] | None:
    """The upper end of ``job``'s slots that ``query`` may return: ``(slot, inclusive)``.

    ``until`` is exclusive. The cursor's own slot stays in range for its job (the lower
    attempts) and for jobs that sort before it (``(s, job, a) < (s, cursor job, …)``),
    and is out of range for the others. ``None``: no upper end.
    """
    ends: list[tuple[int, bool]] = []
    if query.until is not None:
        ends.append((query.until, False))
    if query.before is not None:
        slot, cursor_job, _ = query.before
        ends.append((slot, job <= cursor_job))
    return min(ends) if ends else None  # at one slot, exclusive (False) is the tighter


def server_version(info: dict[str, Any]) -> tuple[tuple[int, ...] | None, str]:
    """``(version, description)`` from ``INFO server``; Valkey is named as Valkey.

    Valkey reports a frozen ``redis_version`` (7.2.4) for compatibility and its own
    version in ``valkey_version``.
    """
    if info.get("server_name") == "valkey" or "valkey_version" in info:
        valkey = str(info.get("valkey_version", "?"))
        return _version(str(info.get("redis_version", ""))), f"Valkey {valkey}"
    redis_version = str(info.get("redis_version", "?"))
    return _version(redis_version), f"Redis {redis_version}"


def _version(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in text.split(".")[:3])
    except ValueError:
        return None


async def command(client: Redis, *args: str | int) -> Any:
    """Send one command (redis-py leaves ``Redis.execute_command`` untyped)."""
    return await _keep_cancellation(client.execute_command(*args))  # type: ignore[no-untyped-call]


async def execute(pipe: Pipeline, *, raise_on_error: bool = True) -> list[Any]:
    """Send a pipeline; its replies (exceptions in place when ``raise_on_error`` is off)."""
    return await _keep_cancellation(pipe.execute(raise_on_error=raise_on_error))


async def _keep_cancellation(call: Awaitable[T]) -> T:
    """Await a driver call, re-raising a cancellation the driver swallowed.

    On Python < 3.12 ``asyncio.wait_for`` (which redis-py uses to write commands)
    returns normally when the task is cancelled just as the write completes, losing
    the cancellation; a scheduler stopping its loops would then wait forever. A cancel
    request that arrived during the call and did not surface is raised here.
    """
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    result = await call
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError
    return result


def _same(exc: BaseException) -> BaseException:
    return exc


def queue(pipe: Pipeline, *args: str | int) -> None:
    """Queue a command on a pipeline."""
    pipe.execute_command(*args)
