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

``claim_many`` declares the batch's queues spread over several channels of their own
(``nowait``, the last of each part waited for: its answer follows every earlier declare
of its channel; the broker creates the queues of different channels in parallel), then
publishes every claim on a confirm channel that never declares, at most
:data:`MAX_IN_FLIGHT` unconfirmed, and takes the confirms as they come. A declare
refused for another ``x-expires`` closes only its declare channel; the declares after
it are sent again on a new one. When one claim of a batch fails, the batch fails (no
answer is known for any), but the confirms that did arrive are remembered by token, so
the retry with the same tokens answers ``won`` for them instead of losing those runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aio_pika
import aiormq.exceptions as amqp_errors
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.abc import AbstractChannel as RawChannel
from pamqp.commands import Basic

from ..backend import (
    SCHEMA_VERSION,
    Backend,
    Capabilities,
    Claim,
    ClaimRequest,
    wall_clock_ms,
)
from ..durations import format_duration_ms
from ..errors import BackendError, BackendUnavailable, ConfigurationError, SchemaVersionError
from ..names import validate_job_name
from ..records import HistoryQuery, Outcome, RunRecord
from ..redact import brief, brief_url, redact_text, redact_url, userinfo_problem
from ._local_clock import RECONNECT_MAX_S, RECONNECT_MIN_S, duration_option, judge_locally

__all__ = ["RabbitMQBackend"]

logger = logging.getLogger("anarchon.backends.rabbitmq")

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_PREFIX = "anarchon."
DEFAULT_MARGIN_MS = 60_000
DEFAULT_TIMEOUT_MS = 5_000
DEFAULT_HEARTBEAT_S = "15"
#: Bounds of the URL options: ``timeout`` and ``margin`` (ms), ``heartbeat`` (s), ``name``.
MAX_TIMEOUT_MS = 3_600_000
MAX_MARGIN_MS = 86_400_000
MAX_HEARTBEAT_S = 3600
MAX_NAME = 255
_SECONDS = re.compile(r"[0-9]{1,5}")
#: The driver's options, each with its check and the form it accepts (aiormq would read
#: ``heartbeat=abc`` as 0, heartbeats off, and ``no_verify_ssl=false`` as "do not verify").
_DRIVER_CHECKS: dict[str, tuple[Callable[[str], bool], str]] = {
    "heartbeat": (
        lambda v: bool(_SECONDS.fullmatch(v)) and int(v) <= MAX_HEARTBEAT_S,
        f"int seconds from 0 (heartbeats off) to {MAX_HEARTBEAT_S}, e.g. heartbeat=15",
    ),
    "name": (
        lambda v: 0 < len(v) <= MAX_NAME and v.isprintable(),
        f"1-{MAX_NAME} printable characters",
    ),
    "cafile": (lambda v: 0 < len(v) <= 4096, "a file path"),
    "capath": (lambda v: 0 < len(v) <= 4096, "a directory path"),
    "keyfile": (lambda v: 0 < len(v) <= 4096, "a file path"),
    "certfile": (lambda v: 0 < len(v) <= 4096, "a file path"),
    "no_verify_ssl": (lambda v: v in ("0", "1"), "0 (verify the certificate) or 1"),
}
_TLS_OPTIONS = ("cafile", "capath", "keyfile", "certfile", "no_verify_ssl")
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
#: At most this many claims of one ``claim_many`` are declared or unconfirmed at a time.
MAX_IN_FLIGHT = 256
#: Channels a ``claim_many`` spreads its declares over (the broker creates queues of
#: different channels in parallel); their publishes share one confirm channel.
DECLARE_CHANNELS = 8
PUBLISH_CHANNEL = -1
#: Tokens of won claims whose answer did not reach the caller (their batch failed).
_MAX_REMEMBERED = 10_000
#: Reconnect attempts back off from this delay, doubling up to the cap (seconds).
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
        self.margin_ms = duration_option(
            "RabbitMQ",
            "margin",
            options.get("margin"),
            margin_ms,
            DEFAULT_MARGIN_MS,
            low=0,
            high=MAX_MARGIN_MS,
        )
        self.timeout_ms = duration_option(
            "RabbitMQ",
            "timeout",
            options.get("timeout"),
            timeout_ms,
            DEFAULT_TIMEOUT_MS,
            low=1,
            high=MAX_TIMEOUT_MS,
        )
        self._url = connection_url
        self._clock = clock
        self._connection: AbstractConnection | None = None
        self._channel: RawChannel | None = None
        self._batch_channels: dict[int, tuple[AbstractConnection, RawChannel]] = {}
        self._unanswered: OrderedDict[str, str] = OrderedDict()  # token -> queue
        self._lock = asyncio.Lock()
        self._declaring = asyncio.Lock()  # one batch declares at a time: see _declare_batch
        self._window = asyncio.Semaphore(MAX_IN_FLIGHT)  # unconfirmed claims of batches
        self._reconnect_delay = RECONNECT_MIN_S
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
        return redact_url(_with_query(self._url, own))

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
        self._declaring = asyncio.Lock()
        self._window = asyncio.Semaphore(MAX_IN_FLIGHT)
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
        judged = judge_locally(request, now, request.horizon_ms)
        if judged is not None:
            return judged
        queue = self.queue_name(request.job, request.slot)
        body = _claim_body(request, now)
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
        return self._verdict(queue, request.token, won, now)

    def _verdict(self, queue: str, token: str, confirmed: bool, now: int) -> Claim:
        """Won when confirmed, or refused after this token's own confirm (a retry of a
        failed batch: the confirm arrived but its answer never reached the caller)."""
        if confirmed or self._unanswered.get(token) == queue:
            return Claim(Outcome.WON, 1, now)
        return Claim(Outcome.TAKEN, store_now=now)

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        """Claim a batch: its declares pipelined, then its publishes, confirms taken together.

        Each claim is decided as alone, in order (one channel keeps the publishes in
        order, so of two claims of one run the first wins). Past its horizon or early, a
        claim is answered without being sent. At most :data:`MAX_IN_FLIGHT` claims are
        unconfirmed at a time, each given ``timeout`` from its send. If any claim fails,
        the batch raises once every claim has ended, and the confirms that did arrive
        are remembered by token: the retry answers ``won`` for them.
        """
        now = self._clock()
        answers = [judge_locally(request, now, request.horizon_ms) for request in requests]
        sends = [
            (i, self.queue_name(request.job, request.slot), request)
            for i, request in enumerate(requests)
            if answers[i] is None
        ]
        if not sends:
            return [answer for answer in answers if answer is not None]
        queues = [(queue, self.queue_expiry_ms(request.horizon_ms)) for _, queue, request in sends]
        try:
            await self._declare_batch(queues)
        except TimeoutError as exc:
            await self._drop_connection()
            raise BackendUnavailable(
                f"RabbitMQ did not answer the declares of {len(queues)} run queues within "
                f"{format_duration_ms(self.timeout_ms)}; nothing was published"
            ) from exc
        except _TRANSIENT as exc:
            raise self._unavailable(f"declaring {len(queues)} run queues", exc) from exc
        confirmed = await self._publish_batch(
            [(queue, _claim_body(request, now)) for _, queue, request in sends]
        )
        failed = [result for result in confirmed if isinstance(result, BaseException)]
        if failed:
            for (_, queue, request), result in zip(sends, confirmed, strict=True):
                if result is True:
                    _remember(self._unanswered, request.token, queue)
            raise await self._batch_error(failed, len(sends))
        for (i, queue, request), result in zip(sends, confirmed, strict=True):
            answers[i] = self._verdict(queue, request.token, result is True, now)
        return [answer for answer in answers if answer is not None]

    async def _declare_batch(self, queues: list[tuple[str, int]]) -> None:
        """Declare every run queue, spread over :data:`DECLARE_CHANNELS` channels.

        A channel handles its declares one after the other, and creating a durable queue
        takes the broker milliseconds, so the batch's queues are split between several
        channels (the broker creates them in parallel). Batches declare one at a time.
        """
        share = -(-len(queues) // DECLARE_CHANNELS)
        async with self._declaring:
            await _all_or_first_error(
                [
                    self._declare_on(n, queues[n * share : (n + 1) * share])
                    for n in range(DECLARE_CHANNELS)
                    if queues[n * share : (n + 1) * share]
                ]
            )

    async def _declare_on(self, number: int, queues: list[tuple[str, int]]) -> None:
        """Declare ``queues`` on declare channel ``number``, a part of the window per round trip.

        ``nowait`` declares and a last one waited for: the broker handles a channel's
        frames in order, so its answer means every earlier declare took effect. A queue
        that exists with another ``x-expires`` closes the channel (the declares sent
        after it are dropped): those are declared again on a new channel, and the claim
        is published to the existing queue, as :meth:`claim` does.
        """
        step = max(MAX_IN_FLIGHT // DECLARE_CHANNELS, 1)
        start = 0
        while start < len(queues):
            chunk = queues[start : start + step]
            channel = await self._batch_channel(number)
            try:
                async with asyncio.timeout(self.timeout_ms / 1000):
                    for queue, expires_ms in chunk[:-1]:
                        await channel.queue_declare(
                            queue,
                            durable=True,
                            arguments=_queue_arguments(expires_ms),
                            nowait=True,
                        )
                    queue, expires_ms = chunk[-1]
                    await channel.queue_declare(
                        queue, durable=True, arguments=_queue_arguments(expires_ms)
                    )
            except (
                amqp_errors.ChannelPreconditionFailed,
                amqp_errors.ChannelInvalidStateError,
            ) as exc:
                refused = await _close_reason(channel, exc)
                text = str(refused)
                at = next((n for n, (q, _) in enumerate(chunk) if f"'{q}'" in text), None)
                if at is None or "x-expires" not in text:
                    raise refused from None
                logger.warning(
                    "queue %r exists with another x-expires than %d ms: the instances "
                    "disagree on its horizon or margin; claiming it without redeclaring",
                    chunk[at][0],
                    chunk[at][1],
                )
                start += at + 1
                continue
            start += len(chunk)

    async def _publish_batch(self, claims: list[tuple[str, bytes]]) -> list[bool | BaseException]:
        """Publish each claim to its queue; per claim: confirmed (won), refused, or the error.

        Every publish has ended (answered, failed or timed out) when this returns, so a
        retry of the batch never races with a copy of itself still in flight.
        """
        try:
            channel = await self._batch_channel(PUBLISH_CHANNEL)
        except _TRANSIENT as exc:
            return [exc] * len(claims)
        window, timeout = self._window, self.timeout_ms / 1000

        async def one(queue: str, body: bytes) -> bool:
            async with window:
                async with asyncio.timeout(timeout):
                    return await _publish(channel, queue, body)

        results = await asyncio.gather(
            *(one(queue, body) for queue, body in claims), return_exceptions=True
        )
        return [
            # A publish cut short by its channel closing ends cancelled: not the caller's
            # cancellation (gather would raise that), so the channel's failure.
            ConnectionError("the channel closed")
            if isinstance(result, asyncio.CancelledError)
            else result
            for result in results
        ]

    async def _batch_error(self, failed: list[BaseException], sent: int) -> BaseException:
        """The one error a failed batch raises (its first claim's failure)."""
        if any(isinstance(exc, TimeoutError) for exc in failed):
            await self._drop_connection()
            return BackendUnavailable(
                f"RabbitMQ did not confirm {len(failed)} of {sent} claims within "
                f"{format_duration_ms(self.timeout_ms)}: unless a retry wins them, those runs "
                f"are treated as lost (at most once)"
            )
        first = failed[0]
        if isinstance(first, _TRANSIENT):
            return self._unavailable(f"{len(failed)} of {sent} claims", first)
        return first

    async def _declare_and_publish(self, queue: str, expires_ms: int, body: bytes) -> bool:
        channel = await self._claim_channel()
        await channel.queue_declare(
            queue, durable=True, arguments=_queue_arguments(expires_ms), nowait=True
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
                        f"RabbitMQ at {self.describe()}: the connection closed: "
                        f"{_text(exc, self._url)}"
                    ) from exc
                channel = self._channel = await opened.get_underlay_channel()
            return channel

    async def _batch_channel(self, number: int) -> RawChannel:
        """A channel of batches: :data:`PUBLISH_CHANNEL` for their publishes, else one of
        the :data:`DECLARE_CHANNELS` for their declares.

        Apart from the channel of single claims, so that a declare refused in a batch
        closes no channel with publishes in flight: a lost confirm loses a run.
        """
        held = self._batch_channels.get(number)
        if held is not None and held[0] is self._connection and not held[1].is_closed:
            return held[1]
        async with self._lock:
            held = self._batch_channels.get(number)
            if held is not None and held[0] is self._connection and not held[1].is_closed:
                return held[1]
            connection = await self._connect(first=False)
            confirms = number == PUBLISH_CHANNEL
            try:
                opened = await connection.channel(
                    publisher_confirms=confirms, on_return_raises=confirms
                )
            except RuntimeError as exc:  # closed between the check and the call
                raise BackendUnavailable(
                    f"RabbitMQ at {self.describe()}: the connection closed: {_text(exc, self._url)}"
                ) from exc
            channel = await opened.get_underlay_channel()
            self._batch_channels[number] = (connection, channel)
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
            self._reconnect_delay = min(self._reconnect_delay * 2, RECONNECT_MAX_S)
            if not isinstance(exc, Exception):
                raise
            error = self._connect_error(exc)
            self._last_error = str(error)
            raise error from exc
        if not first:
            logger.info("reconnected to RabbitMQ at %s", self.describe())
        self._reconnect_delay = RECONNECT_MIN_S
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
                f"({_text(exc.args[0] if exc.args else exc, self._url)}): check the user and "
                f"password in the URL"
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
            return BackendUnavailable(f"{where} cannot be reached: {_describe(exc, self._url)}")
        return BackendError(f"{where}: {_describe(exc, self._url)}")

    def _unavailable(self, what: str, exc: BaseException) -> BackendError:
        if isinstance(exc, amqp_errors.ChannelAccessRefused):
            return BackendError(
                f"RabbitMQ at {self.describe()} refused {what}: the user needs 'configure' "
                f"permission on names starting with {self.prefix!r} and 'write' permission on "
                f"'amq.default' ({_text(exc, self._url)})"
            )
        return BackendUnavailable(
            f"RabbitMQ at {self.describe()} failed {what}: {_describe(exc, self._url)}"
        )


def _alive(connection: AbstractConnection) -> bool:
    """Whether the connection still works: aio-pika's own flag misses a broker-side close."""
    transport = connection.transport
    return not connection.is_closed and transport is not None and not transport.connection.is_closed


def _claim_body(request: ClaimRequest, now: int) -> bytes:
    """The claim record a run's queue keeps."""
    return json.dumps(
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


def _queue_arguments(expires_ms: int) -> dict[str, Any]:
    """A run queue's arguments: it accepts one message and expires when unused."""
    return {
        "x-max-length": 1,
        "x-overflow": "reject-publish",
        "x-expires": expires_ms,
        "x-queue-type": "classic",
    }


async def _close_reason(channel: RawChannel, error: BaseException) -> BaseException:
    """Why the broker closed ``channel``: a declare sent after the broker's close but
    before its reason was read fails with "closed"; the reason follows at once."""
    if isinstance(error, amqp_errors.ChannelPreconditionFailed):
        return error
    try:
        async with asyncio.timeout(1):
            await channel.closing
    except TimeoutError:
        return error
    except Exception as reason:  # closed by the broker: its reason
        return reason
    return error


async def _all_or_first_error(calls: list[Coroutine[Any, Any, None]]) -> None:
    """Run ``calls`` concurrently; once all have ended, raise the first error if any."""
    for result in await asyncio.gather(*calls, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result


def _remember(cache: OrderedDict[str, str], key: str, value: str) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _MAX_REMEMBERED:
        cache.popitem(last=False)


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
    """Split ``url`` into the driver's URL and this backend's own options (checked)."""

    def invalid(why: str) -> ConfigurationError:
        return ConfigurationError(f"RabbitMQ URL {brief_url(url)} is not valid: {why}")

    if not isinstance(url, str):
        raise invalid(f"use {_URL_FORM}")
    problem = userinfo_problem(url)
    if problem is not None:
        raise invalid(problem)
    try:
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise invalid(f"use {_URL_FORM}") from None
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise invalid(f"the port must be a number from 1 to 65535; use {_URL_FORM}")
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname or parts.fragment:
        raise invalid(f"use {_URL_FORM}")
    if parts.path.count("/") > 1:
        raise invalid("the path is the virtual host; write '/' inside a vhost name as %2F")
    own: dict[str, str] = {}
    driver: list[tuple[str, str]] = []
    for key, value in pairs:
        if key in own or any(k == key for k, _ in driver):
            raise invalid(f"it repeats option {brief(key)}")
        if key in _OWN_OPTIONS:
            own[key] = value
        elif key in _DRIVER_OPTIONS:
            check, form = _DRIVER_CHECKS[key]
            if not check(value):
                raise invalid(f"option {key}={brief(value)}: give {form}")
            if key in _TLS_OPTIONS and parts.scheme != "amqps":
                raise invalid(f"option {key} is a TLS option: use amqps:// for TLS")
            driver.append((key, value))
        else:
            accepted = ", ".join((*_OWN_OPTIONS, *_DRIVER_OPTIONS))
            raise invalid(f"it has an unknown option {brief(key)}; accepted: {accepted}")
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
            f"RabbitMQ prefix {brief(prefix)} is not valid: use 1-{MAX_PREFIX} characters from "
            f"A-Z a-z 0-9 _ . : - not starting with 'amq.' (reserved by the broker)"
        )
    return prefix


def _connection_name(url: str) -> str:
    name = dict(parse_qsl(urlsplit(url).query)).get("name")
    return name or f"anarchon pid {os.getpid()}"


def _text(exc: object, url: str) -> str:
    """A driver's message without the URL's secrets (aiormq may quote the URL)."""
    return redact_text(str(exc) or repr(exc), url)


def _describe(exc: BaseException, url: str) -> str:
    return f"{type(exc).__name__}: {_text(exc, url)}"
