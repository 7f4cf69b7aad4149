"""What the Redis strategies share: the connection, layout record, keys and script calls.

:class:`RedisBackend` is the public base class (re-exported by
:mod:`anarchon_core.backends.redis`, which documents the strategies); calling it builds
the subclass of the chosen strategy. Driver retries are off: a command that may have
run is never resent blindly (a repeated ``XADD`` would read as a lost claim); the
engine retries with the same token, which every strategy recognises.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, ClassVar, Self, TypeVar, cast

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
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

from ..backend import SCHEMA_VERSION, Backend, InstanceInfo, instance_json
from ..errors import (
    BackendError,
    BackendUnavailable,
    CapabilityError,
    ConfigurationError,
    SchemaVersionError,
)
from ..records import HistoryQuery
from ._redis_lua import INSTANCES, REGISTER, LuaScript
from ._redis_url import DEFAULT_URL, parse_url

__all__ = [
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

_TRANSIENT_REPLIES = ("LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "BUSY")

T = TypeVar("T")
logger = logging.getLogger("anarchon.backends.redis")
Call = tuple[LuaScript, Sequence[str], Sequence[str | int]]


class RedisBackend(Backend):
    """A Redis or Valkey store; ``strategy`` picks how claims are decided (see module doc).

    ``url`` may carry ``?strategy=`` and ``?prefix=`` (the keyword arguments win only when
    the URL does not set them differently) and redis-py's connection parameters
    (``socket_timeout``, ``client_name``, ``ssl_*`` …). Every key starts with
    ``prefix + ":"``, so several deployments can share one database.
    """

    strategy: ClassVar[str] = "lease"
    name = "redis"
    #: Scripts this strategy runs; loaded at open, reloaded after ``NOSCRIPT``.
    scripts: ClassVar[tuple[LuaScript, ...]] = ()

    def __new__(
        cls, url: str = DEFAULT_URL, *, strategy: str | None = None, prefix: str | None = None
    ) -> Self:
        target: type[RedisBackend] = cls
        if cls is RedisBackend:
            from .redis import STRATEGY_CLASSES  # the strategies import this module

            target = STRATEGY_CLASSES[parse_url(url, strategy, prefix).strategy]
        return cast(Self, object.__new__(target))

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
        self.server = "a server whose version is unknown (INFO refused)"
        self.server_version: tuple[int, ...] | None = None

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
        client, self._client = self._client, None
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
        await self._warn_about_settings(client)

    async def _warn_about_settings(self, client: Redis) -> None:
        """Log server settings that break the guarantees (read where CONFIG/INFO allow)."""
        persistence: Any = None
        config: Any = None
        with contextlib.suppress(ResponseError):  # renamed or denied on managed services
            persistence = await command(client, "INFO", "persistence")
        with contextlib.suppress(ResponseError):
            config = await command(client, "CONFIG", "GET", "maxmemory-policy")
        policy = config.get("maxmemory-policy") if isinstance(config, dict) else None
        if policy not in (None, "noeviction"):
            logger.warning(
                "%s: maxmemory-policy is %r: Redis may evict run records or leases, and a "
                "slot may then run twice; set maxmemory-policy noeviction",
                self.describe(),
                policy,
            )
        if isinstance(persistence, dict) and not persistence.get("aof_enabled"):
            logger.warning(
                "%s: AOF persistence is off: a restart forgets recorded claims (and leases), "
                "so a slot still within its horizon may run again; set appendonly yes",
                self.describe(),
            )

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

    async def _eval(self, script: LuaScript, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """One script in one round trip (``EVALSHA``, loading it once after ``NOSCRIPT``)."""
        client = self.client
        with self._errors():
            try:
                return await command(client, "EVALSHA", script.sha, len(keys), *keys, *args)
            except NoScriptError:  # the server restarted or flushed its scripts: nothing ran
                await command(client, "SCRIPT", "LOAD", script.source)
                return await command(client, "EVALSHA", script.sha, len(keys), *keys, *args)

    async def _eval_batch(
        self, calls: Sequence[Call], *, before: Sequence[Sequence[str | int]] = ()
    ) -> list[Any]:
        """Several scripts (after plain commands ``before``) in one pipelined round trip.

        Each script is atomic on its own; the batch is not (the scripts may touch
        different jobs, which Redis Cluster keeps on different nodes).
        """
        if not calls and not before:
            return []
        client = self.client
        with self._errors():
            pipe = client.pipeline(transaction=False)
            for queued in before:
                queue(pipe, *queued)
            for script, keys, args in calls:
                queue(pipe, "EVALSHA", script.sha, len(keys), *keys, *args)
            replies = await execute(pipe, raise_on_error=False)
            _raise_first(replies[: len(before)])
            results = replies[len(before) :]
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if missing:  # those scripts did not run: load them and run them again
                retry = client.pipeline(transaction=False)
                for source in {calls[i][0].source for i in missing}:
                    queue(retry, "SCRIPT", "LOAD", source)
                for i in missing:
                    script, keys, args = calls[i]
                    queue(retry, "EVALSHA", script.sha, len(keys), *keys, *args)
                again = await execute(retry, raise_on_error=False)
                for i, result in zip(missing, again[-len(missing) :], strict=True):
                    results[i] = result
            _raise_first(results)
            return results

    def _index_commands(self, job: str) -> list[Sequence[str]]:
        """``SADD`` to the jobs index, sent with a job's first write in this process.

        The index lists every job for history and prune across jobs. It is a plain set
        outside the jobs' hash slots, so it cannot be written inside their scripts; it
        is pipelined in the same round trip instead (re-adding a member writes nothing).
        """
        return [] if job in self._indexed else [("SADD", self._jobs_key, job)]

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


def queue(pipe: Pipeline, *args: str | int) -> None:
    """Queue a command on a pipeline."""
    pipe.execute_command(*args)


def _raise_first(replies: Sequence[Any]) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
