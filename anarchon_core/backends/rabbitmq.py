"""The RabbitMQ claim-only backend: one durable queue per run that accepts one message.

The claim of ``(job, slot)`` declares a durable classic queue named after the run with
``x-max-length=1`` and ``x-overflow=reject-publish`` and publishes one persistent
message to it on a channel in publisher-confirm mode. The queue process is the one
place that decides: the first message fills the queue and is confirmed (``basic.ack``:
won), every later one is refused (``basic.nack``: taken). The declare is sent with
``nowait`` right before the publish on the same channel, and AMQP keeps a channel's
frames in order, so a claim costs one round trip on both paths.

Why this and not a stream with publisher de-duplication: de-duplication is a feature
of the stream protocol, not of AMQP 0-9-1, it confirms a duplicate exactly like a
first write (a loser could not tell it lost), and a stream never forgets a publisher.

Nothing piles up: each queue carries ``x-expires`` = the claim horizon plus a margin,
so the broker deletes it once nobody has declared it for that long. Until then every
late claim finds the full queue; past the horizon claims are refused before they
reach the broker (by the local clock: RabbitMQ shows clients no clock of its own). A
confirmed win was written to disk (persistent message, durable queue), so it survives
a broker restart. A claim whose confirm never arrives is treated as lost: the message
cannot be read back without making room in the queue for another winner (a
``basic.get`` holds it unacknowledged, and classic queues do not count those against
``x-max-length``), so a retry that is refused leaves the run to nobody (at most once).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aio_pika
import aiormq.exceptions as amqp_errors
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.abc import AbstractChannel as RawChannel
from pamqp.commands import Basic

from ..backend import (
    EARLY_TOLERANCE_MS,
    SCHEMA_VERSION,
    Backend,
    Capabilities,
    Claim,
    ClaimRequest,
    wall_clock_ms,
)
from ..durations import format_duration_ms, parse_duration_ms
from ..errors import BackendError, BackendUnavailable, ConfigurationError, SchemaVersionError
from ..names import validate_job_name
from ..records import HistoryQuery, Outcome, RunRecord
from . import mask_url

__all__ = ["RabbitMQBackend"]

logger = logging.getLogger("anarchon.backends.rabbitmq")

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_PREFIX = "anarchon."
DEFAULT_MARGIN_MS = 60_000
DEFAULT_TIMEOUT_MS = 5_000
DEFAULT_HEARTBEAT_S = "15"
#: A queue name is at most 255 bytes: prefix (32) + job (200) + "@" + slot (20 digits).
MAX_PREFIX = 32
_PREFIX = re.compile(r"[A-Za-z0-9_.:-]{1,32}")
#: The URL options this backend reads; the others are passed to the driver (aiormq).
_OWN_OPTIONS = ("prefix", "margin", "timeout")
_DRIVER_OPTIONS = ("heartbeat", "name", "cafile", "capath", "keyfile", "certfile", "no_verify_ssl")
_URL_FORM = (
    "amqp://USER:PASSWORD@HOST[:PORT]/[VHOST][?prefix=&margin=&timeout=&heartbeat=&name=] "
    "(amqps:// for TLS, with cafile=, certfile=, keyfile=, no_verify_ssl=)"
)
#: Reconnect attempts back off from this delay, doubling up to the cap (seconds).
_RECONNECT_MIN_S, _RECONNECT_MAX_S = 0.1, 5.0
#: Errors of the broker or the connection that a retry may cure.
_TRANSIENT = (
    amqp_errors.AMQPError,
    ConnectionError,
    OSError,
    amqp_errors.ChannelInvalidStateError,  # a RuntimeError: a channel of a closed connection
)


class RabbitMQBackend(Backend):
    """Claim-only: exactly one winner per run, decided by a one-message queue.

    ``url`` may carry ``prefix`` (queue and marker names start with it), ``margin``
    (queue expiry beyond the claim horizon: covers clock skew between instances) and
    ``timeout`` (for connecting and for each claim); keyword arguments override them.
    The remaining query options go to the driver (``heartbeat``, ``name`` and TLS files).
    """

    capabilities = Capabilities(lease=False, store_clock=False, finish=False)
    name = "rabbitmq"

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        prefix: str | None = None,
        margin_ms: int | None = None,
        timeout_ms: int | None = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        connection_url, options = _parse_url(url)
        self.prefix = _validate_prefix(
            options.get("prefix", DEFAULT_PREFIX) if prefix is None else prefix
        )
        self.margin_ms = _duration_option(
            "margin", options.get("margin"), margin_ms, DEFAULT_MARGIN_MS, allow_zero=True
        )
        self.timeout_ms = _duration_option(
            "timeout", options.get("timeout"), timeout_ms, DEFAULT_TIMEOUT_MS
        )
        self._url = connection_url
        self._clock = clock
        self._connection: AbstractConnection | None = None
        self._channel: RawChannel | None = None
        self._lock = asyncio.Lock()
        self._reconnect_delay = _RECONNECT_MIN_S
        self._reconnect_at = 0.0
        self._last_error = ""
        self._closed = False

    @classmethod
    def from_url(cls, url: str) -> RabbitMQBackend:
        """``amqp://user:password@host:5672/vhost?prefix=&margin=&timeout=`` (amqps: TLS)."""
        return cls(url)

    def describe(self) -> str:
        own = []
        if self.prefix != DEFAULT_PREFIX:
            own.append(("prefix", self.prefix))
        if self.margin_ms != DEFAULT_MARGIN_MS:
            own.append(("margin", format_duration_ms(self.margin_ms)))
        if self.timeout_ms != DEFAULT_TIMEOUT_MS:
            own.append(("timeout", format_duration_ms(self.timeout_ms)))
        return mask_url(_with_query(self._url, own))

    # -- names -------------------------------------------------------------------
    def queue_name(self, job: str, slot: int) -> str:
        """The run's queue: ``{prefix}{job}@{slot}``; ``@`` never occurs in a job name."""
        validate_job_name(job, what="job name in the store")
        return f"{self.prefix}{job}@{slot}"

    def layout_marker(self, version: int) -> str:
        """The durable exchange that records that layout ``version`` uses this prefix."""
        return f"{self.prefix}layout.v{version}"

    def queue_expiry_ms(self, horizon_ms: int) -> int:
        """``x-expires`` of a run's queue: horizon plus margin, rounded up to a second."""
        return max(math.ceil((max(horizon_ms, 0) + self.margin_ms) / 1000), 1) * 1000

    # -- life cycle --------------------------------------------------------------
    async def open(self) -> None:
        """Connect, record the layout marker and refuse a newer layout under this prefix."""
        self._closed = False
        self._lock = asyncio.Lock()  # of this event loop: a backend may be reopened in another
        async with self._lock:
            connection = await self._connect(first=True)
        try:
            async with asyncio.timeout(self.timeout_ms / 1000):
                await self._check_layout(connection)
        except SchemaVersionError:
            await self.close()
            raise
        except (TimeoutError, *_TRANSIENT) as exc:
            await self.close()
            raise self._unavailable("recording the layout marker", exc) from exc

    async def _check_layout(self, connection: AbstractConnection) -> None:
        channel: AbstractChannel = await connection.channel(publisher_confirms=False)
        try:
            for version in range(1, SCHEMA_VERSION + 1):
                await channel.declare_exchange(
                    self.layout_marker(version), aio_pika.ExchangeType.FANOUT, durable=True
                )
            newer = self.layout_marker(SCHEMA_VERSION + 1)
            try:
                await channel.declare_exchange(newer, passive=True)
            except amqp_errors.ChannelNotFoundEntity:
                return
            raise SchemaVersionError(
                f"RabbitMQ at {self.describe()} holds the marker exchange {newer!r}: a newer "
                f"anarchon (layout {SCHEMA_VERSION + 1}) claims runs under the prefix "
                f"{self.prefix!r}; this version knows layout {SCHEMA_VERSION}: upgrade it"
            )
        finally:
            if not channel.is_closed:
                await channel.close()

    async def close(self) -> None:
        self._closed = True
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and not connection.is_closed:
            try:
                await connection.close()
            except _TRANSIENT as exc:  # already broken: nothing left to release
                logger.debug("closing the RabbitMQ connection failed: %s", exc)

    async def now_ms(self) -> int:
        return self._clock()

    # -- the claim ---------------------------------------------------------------
    async def claim(self, request: ClaimRequest) -> Claim:
        now = self._clock()
        if request.slot < now - request.horizon_ms:
            return Claim(Outcome.EXPIRED, store_now=now)
        if request.slot > now + EARLY_TOLERANCE_MS:
            return Claim(Outcome.EARLY, store_now=now)
        queue = self.queue_name(request.job, request.slot)
        body = json.dumps(
            {
                "layout": SCHEMA_VERSION,
                "job": request.job,
                "slot": request.slot,
                "origin": str(request.origin),
                "token": request.token,
                "instance_id": request.instance_id,
                "claimed_at": now,
                "fingerprint": request.fingerprint,
            },
            separators=(",", ":"),
        ).encode()
        try:
            async with asyncio.timeout(self.timeout_ms / 1000):
                won = await self._declare_and_publish(
                    queue, self.queue_expiry_ms(request.horizon_ms), body
                )
        except TimeoutError as exc:
            await self._drop_connection()
            raise BackendUnavailable(
                f"RabbitMQ did not confirm the claim of {queue!r} within "
                f"{format_duration_ms(self.timeout_ms)}: unless a retry wins it, the run "
                f"is treated as lost (at most once)"
            ) from exc
        except _TRANSIENT as exc:
            raise self._unavailable(f"claiming {queue!r}", exc) from exc
        if won:
            return Claim(Outcome.WON, 1, now)
        return Claim(Outcome.TAKEN, store_now=now)

    async def _declare_and_publish(self, queue: str, expires_ms: int, body: bytes) -> bool:
        channel = await self._claim_channel()
        await channel.queue_declare(
            queue,
            durable=True,
            arguments={
                "x-max-length": 1,
                "x-overflow": "reject-publish",
                "x-expires": expires_ms,
                "x-queue-type": "classic",
            },
            nowait=True,
        )
        try:
            return await _publish(channel, queue, body)
        except amqp_errors.ChannelPreconditionFailed as exc:
            if f"'{queue}'" not in str(exc) or "x-expires" not in str(exc):
                raise
        # The queue exists with another expiry: instances disagree on this run's horizon
        # (a rolling deploy changed the schedule or the margin). It is still the one
        # queue of the run, so publishing to it alone decides the claim the same way.
        logger.warning(
            "queue %r exists with another x-expires than %d ms: the instances disagree "
            "on its horizon or margin; claiming it without redeclaring",
            queue,
            expires_ms,
        )
        return await _publish(await self._claim_channel(), queue, body)

    # -- history -----------------------------------------------------------------
    async def history(self, query: HistoryQuery) -> list[RunRecord]:
        """Nothing: a run's queue cannot be listed or read without risking its claim."""
        return []

    # -- connection ------------------------------------------------------------------
    async def _claim_channel(self) -> RawChannel:
        channel = self._channel
        if channel is not None and not channel.is_closed:
            return channel
        async with self._lock:
            channel = self._channel
            if channel is None or channel.is_closed:
                connection = await self._connect(first=False)
                try:
                    opened = await connection.channel(
                        publisher_confirms=True, on_return_raises=True
                    )
                except RuntimeError as exc:  # closed between the check and the call
                    raise BackendUnavailable(
                        f"RabbitMQ at {self.describe()}: the connection closed: {exc}"
                    ) from exc
                channel = self._channel = await opened.get_underlay_channel()
            return channel

    async def _connect(self, *, first: bool) -> AbstractConnection:
        """The live connection, reconnecting at most once per backoff delay."""
        connection = self._connection
        if connection is not None and _alive(connection):
            return connection
        if connection is not None:  # closed by the broker or the network: release it
            await self._drop_connection()
        if self._closed and not first:
            raise BackendUnavailable(f"the RabbitMQ backend for {self.describe()} is closed")
        wait = self._reconnect_at - time.monotonic()
        if not first and wait > 0:
            raise BackendUnavailable(
                f"RabbitMQ at {self.describe()} is unreachable ({self._last_error}); "
                f"reconnecting in {wait:.1f} s"
            )
        try:
            connection = await aio_pika.connect(
                self._url,
                timeout=self.timeout_ms / 1000,
                client_properties={"connection_name": _connection_name(self._url)},
            )
        except BaseException as exc:
            self._reconnect_at = time.monotonic() + self._reconnect_delay
            self._reconnect_delay = min(self._reconnect_delay * 2, _RECONNECT_MAX_S)
            if not isinstance(exc, Exception):
                raise
            error = self._connect_error(exc)
            self._last_error = str(error)
            raise error from exc
        if not first:
            logger.info("reconnected to RabbitMQ at %s", self.describe())
        self._reconnect_delay = _RECONNECT_MIN_S
        self._connection = connection
        return connection

    async def _drop_connection(self) -> None:
        """Forget a connection that stopped answering; the next call opens a new one."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            try:
                async with asyncio.timeout(1):
                    await connection.close()
            except (TimeoutError, *_TRANSIENT):
                pass

    def _connect_error(self, exc: Exception) -> BackendError:
        where = f"RabbitMQ at {self.describe()}"
        parts = urlsplit(self._url)
        if isinstance(
            exc, amqp_errors.ProbableAuthenticationError | amqp_errors.AuthenticationError
        ):
            return BackendError(
                f"{where} refused the credentials of user {parts.username or 'guest'!r} "
                f"({exc.args[0] if exc.args else exc}): check the user and password in the URL"
            )
        if isinstance(exc, amqp_errors.InvalidFrameError | amqp_errors.ConnectionNotAllowed):
            vhost = parts.path[1:] or "/"
            return BackendError(
                f"{where} closed the connection while opening virtual host {vhost!r}: it does "
                f"not exist or user {parts.username or 'guest'!r} has no access to it"
            )
        if isinstance(exc, TimeoutError):
            return BackendUnavailable(
                f"{where} did not answer within {format_duration_ms(self.timeout_ms)}"
            )
        if isinstance(exc, _TRANSIENT):
            return BackendUnavailable(f"{where} cannot be reached: {_describe(exc)}")
        return BackendError(f"{where}: {type(exc).__name__}: {exc}")

    def _unavailable(self, what: str, exc: BaseException) -> BackendError:
        if isinstance(exc, amqp_errors.ChannelAccessRefused):
            return BackendError(
                f"RabbitMQ at {self.describe()} refused {what}: the user needs 'configure' "
                f"permission on names starting with {self.prefix!r} and 'write' permission on "
                f"'amq.default' ({exc})"
            )
        return BackendUnavailable(f"RabbitMQ at {self.describe()} failed {what}: {_describe(exc)}")


def _alive(connection: AbstractConnection) -> bool:
    """Whether the connection still works: aio-pika's own flag misses a broker-side close."""
    transport = connection.transport
    return not connection.is_closed and transport is not None and not transport.connection.is_closed


async def _publish(channel: RawChannel, queue: str, body: bytes) -> bool:
    """Publish the claim to ``queue``; True when the broker confirmed it (the winner)."""
    try:
        await channel.basic_publish(
            body,
            routing_key=queue,
            mandatory=True,
            properties=Basic.Properties(
                delivery_mode=2, content_type="application/json", app_id="anarchon"
            ),
        )
    except amqp_errors.PublishError:
        return False  # returned unroutable: the queue is gone, nobody may win it any more
    except amqp_errors.DeliveryError:
        return False  # basic.nack: the queue already holds the winner's message
    return True


def _parse_url(url: str) -> tuple[str, dict[str, str]]:
    """Split ``url`` into the driver's URL and this backend's own options."""
    if not isinstance(url, str):
        raise ConfigurationError(f"RabbitMQ URL {url!r} is not valid: use {_URL_FORM}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise ConfigurationError(
            f"RabbitMQ URL {mask_url(url)!r} is not valid ({exc}): use {_URL_FORM}"
        ) from exc
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname or parts.fragment:
        raise ConfigurationError(f"RabbitMQ URL {mask_url(url)!r} is not valid: use {_URL_FORM}")
    if parts.path.count("/") > 1:
        raise ConfigurationError(
            f"RabbitMQ URL {mask_url(url)!r} is not valid: the path is the virtual host; "
            f"write '/' inside a vhost name as %2F"
        )
    own: dict[str, str] = {}
    driver: list[tuple[str, str]] = []
    for key, value in pairs:
        if key in own or any(k == key for k, _ in driver):
            raise ConfigurationError(f"RabbitMQ URL {mask_url(url)!r} repeats option {key!r}")
        if key in _OWN_OPTIONS:
            own[key] = value
        elif key in _DRIVER_OPTIONS:
            driver.append((key, value))
        else:
            accepted = ", ".join((*_OWN_OPTIONS, *_DRIVER_OPTIONS))
            raise ConfigurationError(
                f"RabbitMQ URL {mask_url(url)!r} has an unknown option {key!r}; "
                f"accepted: {accepted}"
            )
    if not any(k == "heartbeat" for k, _ in driver):
        driver.append(("heartbeat", DEFAULT_HEARTBEAT_S))
    path = parts.path or "/"
    return urlunsplit(parts._replace(path=path, query=urlencode(driver), fragment="")), own


def _with_query(url: str, extra: list[tuple[str, str]]) -> str:
    parts = urlsplit(url)
    query = [
        (k, v) for k, v in parse_qsl(parts.query) if k != "heartbeat" or v != DEFAULT_HEARTBEAT_S
    ]
    return urlunsplit(parts._replace(query=urlencode([*query, *extra])))


def _validate_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix) or prefix.startswith("amq."):
        raise ConfigurationError(
            f"RabbitMQ prefix {prefix!r} is not valid: use 1-{MAX_PREFIX} characters from "
            f"A-Z a-z 0-9 _ . : - not starting with 'amq.' (reserved by the broker)"
        )
    return prefix


def _duration_option(
    key: str, text: str | None, value: int | None, default: int, *, allow_zero: bool = False
) -> int:
    if value is not None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < (0 if allow_zero else 1)
        ):
            raise ConfigurationError(
                f"RabbitMQ option {key}_ms={value!r} is not valid: give milliseconds as an int "
                f"{'>= 0' if allow_zero else '> 0'}"
            )
        return value
    if text is None:
        return default
    return parse_duration_ms(text, what=f"RabbitMQ URL option {key}", allow_zero=allow_zero)


def _connection_name(url: str) -> str:
    name = dict(parse_qsl(urlsplit(url).query)).get("name")
    return name or f"anarchon pid {os.getpid()}"


def _describe(exc: BaseException) -> str:
    text = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {text}"
