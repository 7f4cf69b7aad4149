"""The NATS JetStream claim-only backend: one key-value entry per run, created once.

The claim of ``(job, slot)`` creates the key ``c.{job}.{slot}`` in a JetStream
key-value bucket: a publish with ``Nats-Expected-Last-Subject-Sequence: 0``, which the
stream's leader accepts only while the key has no entry. Exactly one creator gets the
acknowledgement (won); every other one gets "wrong last sequence" (taken). One round
trip on both paths.

Why KV create and not publish de-duplication by message id: de-duplication answers a
duplicate with an acknowledgement too (flagged ``duplicate``, but only inside the
stream's duplicate window, two minutes by default), so a late loser would be told it
won; the expected-sequence check has no window. The entry also holds the claim's
token (a claim whose answer was lost is resolved by reading it back) and later the
run's outcome (``success``/``failed``), so this store keeps a history.

The bucket's ``max_age`` (``ttl``, 24 h by default) removes old entries, so nothing
piles up; a claim is refused before it is sent once its slot is older than the claim
horizon, and never later than ``max_age − margin``, so no entry can expire while its
slot may still be claimed. JetStream shows clients no clock, so the local clock
judges the horizon. The bucket is created idempotently by the first instance; its
description records the layout version (``anarchon claim records, layout 1``).

``claim_many`` sends every create of a batch before awaiting any acknowledgement
(each with a reply subject of its own, at most :data:`MAX_IN_FLIGHT` unacknowledged,
see :class:`_Pipeline`), then decides each
claim from its own answer exactly as :meth:`NatsBackend.claim` does. When one claim of
a batch fails, the batch fails and every claim in it counts as unanswered: the retry
with the same tokens reads back (or knows locally) which of them it won.

**Job definitions** live in a second bucket, ``{bucket}_definitions`` (created
idempotently at open beside the claim bucket, so a store of the previous release gains
it with no manual step; its description records ``anarchon job definitions, layout
1``). It has no max age (a definition and the tombstone of a removed one stay until
overwritten), one entry per key, and no direct gets (reads go to the stream's leader,
not to a follower that may lag). One key per job, ``d.{encoded job}``. A definition's
version is its entry's revision: the bucket stream's sequence, one counter for the
whole bucket, issued by the stream's leader in the order it stores the writes, so
every change gets a higher version than every change stored before it. A create is an
update expecting revision 0 (or, over a tombstone, the tombstone's revision), an edit
an update expecting the version read, and the server checks that in the same step as
the write; a removal is a delete marker (the tombstone, with a revision of its own)
guarded the same way. :meth:`NatsBackend.definitions_since` reads the bucket with an
ordered consumer from ``version + 1``, counting what is left itself;
:meth:`NatsBackend.definitions_version` is the stream's last sequence.

**A claim's version is not checked atomically with its create.** The definition and the
run are two keys, and JetStream checks an expected sequence only on the subject written.
A claim with a ``version`` therefore reads the definition's revision first (one more
round trip; a claim without a version reads nothing) and is answered ``STALE`` without
being sent when it differs. A change committed between that read and the create is not
seen: a replica that has not yet seen the change can win one slot of the old schedule,
within a window of one round trip. The lease stores check the version in the same
transaction or script as the claim and have no such window.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import random
import re
import string
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client, Server
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from ..backend import (
    SCHEMA_VERSION,
    Backend,
    Capabilities,
    Claim,
    ClaimRequest,
    Lease,
    StoredDefinition,
    bound_error,
    wall_clock_ms,
)
from ..durations import format_duration_ms
from ..errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    ConflictError,
    SchemaVersionError,
)
from ..names import validate_job_name
from ..records import HistoryQuery, Origin, Outcome, RunRecord, Status, select_records
from ..redact import brief, brief_url, redact_text, userinfo_problem
from ._local_clock import RECONNECT_MAX_S, RECONNECT_MIN_S, duration_option, judge_locally

__all__ = ["NatsBackend", "decode_job", "encode_job"]

logger = logging.getLogger("anarchon.backends.nats")

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_BUCKET = "anarchon"
DEFAULT_TTL_MS = 86_400_000
DEFAULT_MARGIN_MS = 60_000
DEFAULT_TIMEOUT_MS = 5_000
DESCRIPTION = "anarchon claim records, layout {version}"
_LAYOUT = re.compile(r"anarchon claim records, layout (\d+)")
DEFINITIONS_DESCRIPTION = "anarchon job definitions, layout {version}"
_DEFINITIONS_LAYOUT = re.compile(r"anarchon job definitions, layout (\d+)")
#: The definitions bucket is the claim bucket's name plus this.
DEFINITIONS_SUFFIX = "_definitions"
_BUCKET = re.compile(r"[A-Za-z0-9_-]{1,64}")
_OPTIONS = ("bucket", "ttl", "margin", "timeout", "replicas", "name")
#: The lowest and highest ``ttl``, ``margin`` and ``timeout`` (ms); the longest ``name``.
_BOUNDS = {"ttl": (1, 365 * 86_400_000), "margin": (0, 86_400_000), "timeout": (1, 3_600_000)}
MAX_NAME = 255
_URL_FORM = (
    "nats://[USER:PASSWORD@ or TOKEN@]HOST[:PORT][,HOST2[:PORT2]...]"
    "[?bucket=&ttl=&margin=&timeout=&replicas=&name=]"
)
#: Characters a job name keeps in a key; the others (``.`` ``:``) become ``=XX`` (hex).
_KEY_SAFE = frozenset(string.ascii_letters + string.digits + "_-")
_ESCAPE = re.compile(r"=([0-9A-F]{2})")
#: Tokens of claims whose answer was lost, so that a retry can read the entry back.
_MAX_REMEMBERED = 10_000
#: At most this many creates of ``claim_many`` (of one connection) are unacknowledged.
MAX_IN_FLIGHT = 256
#: JetStream's "wrong last sequence" error codes (the key already has an entry).
_WRONG_SEQUENCE = (10071, 10164)
#: The header of a key-value delete (or purge) marker: a removed definition's tombstone.
_KV_OPERATION = "KV-Operation"
_STREAM_IN_USE = 10058
#: Reconnect back-off: from this delay (seconds), doubling per failed attempt, capped.
_TRANSIENT = (nats.errors.Error, OSError, TimeoutError)
_HAS_RECONNECT_HANDLER = (
    "reconnect_to_server_handler" in inspect.signature(Client.connect).parameters
)


def encode_job(job: str) -> str:
    """A job name as one NATS key token: ``billing:sync.daily`` → ``billing=3Async=2Edaily``.

    NATS keys allow ``[-/_=.A-Za-z0-9]`` and use ``.`` as a token separator, so ``.``
    and ``:`` are escaped as ``=`` plus two hex digits; ``=`` never occurs in a job name,
    which keeps the encoding one-to-one.
    """
    validate_job_name(job, what="job name in the store")
    return "".join(c if c in _KEY_SAFE else f"={ord(c):02X}" for c in job)


def decode_job(token: str) -> str:
    """The inverse of :func:`encode_job`."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), token)


@dataclass(frozen=True, slots=True)
class _Won:
    """A claim this backend won: the entry's revision makes the finish one round trip."""

    token: str
    revision: int
    record: dict[str, Any]


class NatsBackend(Backend):
    """Claim-only on a JetStream key-value bucket; records ``claimed`` then the outcome.

    ``url`` may carry ``bucket`` (default ``anarchon``), ``ttl`` (the bucket's max age when
    this backend creates it), ``margin`` (how long before an entry's expiry its slot stops
    being claimable: covers clock skew between instances), ``timeout`` (connecting and
    each request), ``replicas`` (when creating the bucket) and ``name`` (the connection's
    name); keyword arguments override them.
    """

    capabilities = Capabilities(lease=False, store_clock=False, finish=True)
    name = "nats"

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        bucket: str | None = None,
        ttl_ms: int | None = None,
        margin_ms: int | None = None,
        timeout_ms: int | None = None,
        replicas: int | None = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._servers, self._auth, options = _parse_url(url)
        self.bucket = _validate_bucket(
            options.get("bucket", DEFAULT_BUCKET) if bucket is None else bucket
        )
        self.ttl_ms = _duration("ttl", options.get("ttl"), ttl_ms, DEFAULT_TTL_MS)
        self.margin_ms = _duration("margin", options.get("margin"), margin_ms, DEFAULT_MARGIN_MS)
        self.timeout_ms = _duration(
            "timeout", options.get("timeout"), timeout_ms, DEFAULT_TIMEOUT_MS
        )
        self.replicas = _replicas(options.get("replicas"), replicas)
        if self.ttl_ms <= self.margin_ms:
            raise ConfigurationError(
                f"NATS ttl {format_duration_ms(self.ttl_ms)} is not valid: it must exceed the "
                f"margin ({format_duration_ms(self.margin_ms)}), or no slot could be claimed"
            )
        self.connection_name = options.get("name") or "anarchon"
        self._url = url
        self._clock = clock
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._kv: KeyValue | None = None
        self._definitions: KeyValue | None = None
        self._max_age_ms: int | None = None  # of the bucket as found: None = unlimited
        self._won: OrderedDict[tuple[str, int], _Won] = OrderedDict()
        self._ambiguous: OrderedDict[str, None] = OrderedDict()
        self._pipeline: _Pipeline | None = None
        self._errors: list[BaseException] = []
        self._opening = False

    @classmethod
    def from_url(cls, url: str) -> NatsBackend:
        """``nats://[user:password@]host:4222[,host2:4222]?bucket=&ttl=&margin=&timeout=``."""
        return cls(url)

    def describe(self) -> str:
        user = ""
        if self._auth.get("user") is not None:
            user = f"{self._auth['user']}:***@"
        elif self._auth.get("token") is not None:
            user = "***@"
        hosts = ",".join(s.split("://", 1)[1] for s in self._servers)
        query = f"bucket={self.bucket}"
        if self.ttl_ms != DEFAULT_TTL_MS:
            query += f"&ttl={format_duration_ms(self.ttl_ms)}"
        if self.margin_ms != DEFAULT_MARGIN_MS:
            query += f"&margin={format_duration_ms(self.margin_ms)}"
        return f"nats://{user}{hosts}/?{query}"

    @property
    def stream(self) -> str:
        """The JetStream stream behind the bucket."""
        return f"KV_{self.bucket}"

    def run_key(self, job: str, slot: int) -> str:
        """The key of a run: ``c.{encoded job}.{slot}``."""
        return f"c.{encode_job(job)}.{slot}"

    @property
    def definitions_bucket(self) -> str:
        """The key-value bucket of the job definitions: ``{bucket}_definitions``."""
        return f"{self.bucket}{DEFINITIONS_SUFFIX}"

    @property
    def definitions_stream(self) -> str:
        """The JetStream stream behind the definitions bucket."""
        return f"KV_{self.definitions_bucket}"

    def definition_key(self, job: str) -> str:
        """The key of a job's definition: ``d.{encoded job}``."""
        return f"d.{encode_job(job)}"

    def horizon_ms(self, requested_ms: int) -> int:
        """The horizon a claim gets: never so long that its entry could expire first."""
        if self._max_age_ms is None:
            return requested_ms
        return min(requested_ms, self._max_age_ms - self.margin_ms)

    # -- life cycle --------------------------------------------------------------
    async def open(self) -> None:
        """Connect, create the bucket if missing (race-safe) and check its layout."""
        if self._nc is not None and not self._nc.is_closed:
            return
        self._errors = []
        self._opening = True
        nc = Client()
        options: dict[str, Any] = {
            "name": self.connection_name,
            "user": self._auth.get("user"),
            "password": self._auth.get("password"),
            "token": self._auth.get("token"),
            "connect_timeout": max(1, round(self.timeout_ms / 1000)),
            "allow_reconnect": True,
            "max_reconnect_attempts": 1,  # at start: try each server twice, then fail
            "reconnect_time_wait": 0,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
        }
        if _HAS_RECONNECT_HANDLER:
            options["reconnect_to_server_handler"] = _backoff
        else:  # an older nats-py: a fixed pause between reconnect attempts
            options["reconnect_time_wait"] = 1
        try:
            await nc.connect(self._servers, **options)
        except BaseException as exc:
            await _close_quietly(nc)
            if isinstance(exc, _TRANSIENT):
                raise self._connect_error(exc) from exc
            raise
        finally:
            self._opening = False
        # Connected: from now on the client reconnects for ever (with the back-off above).
        nc.options["max_reconnect_attempts"] = -1
        nc.options["reconnect_time_wait"] = options["reconnect_time_wait"] or RECONNECT_MIN_S
        try:
            js = nc.jetstream(timeout=self.timeout_ms / 1000)
            kv = await self._bucket(js)
            self._definitions = await self._definitions_bucket(js)
        except BaseException:
            await _close_quietly(nc)
            raise
        self._nc, self._js, self._kv = nc, js, kv

    async def _open_bucket(
        self, js: JetStreamContext, bucket: str, config: api.KeyValueConfig
    ) -> tuple[api.StreamInfo, KeyValue]:
        """A bucket's stream as found, created first (race-safe) if missing, and its handle."""
        where = f"NATS at {self.describe()}"
        try:
            try:
                info = await js.stream_info(f"KV_{bucket}")
            except nats.js.errors.NotFoundError:
                info = await self._create_bucket(js, config)
            return info, await js.key_value(bucket)
        except nats.js.errors.ServiceUnavailableError as exc:
            raise BackendError(
                f"{where}: JetStream is not enabled on the server (start nats-server with -js) "
                f"or has no leader for the bucket ({exc})"
            ) from exc
        except nats.js.errors.NoStreamResponseError as exc:
            raise BackendError(f"{where}: JetStream is not enabled on the server ({exc})") from exc
        except nats.js.errors.APIError as exc:
            raise BackendError(f"{where}: JetStream refused the bucket {bucket!r}: {exc}") from exc
        except _TRANSIENT as exc:
            raise BackendUnavailable(
                f"{where}: opening the bucket {bucket!r} failed: {_text(exc)}"
            ) from exc

    async def _bucket(self, js: JetStreamContext) -> KeyValue:
        where = f"NATS at {self.describe()}"
        config = api.KeyValueConfig(
            bucket=self.bucket,
            description=DESCRIPTION.format(version=SCHEMA_VERSION),
            history=1,
            ttl=self.ttl_ms / 1000,
            storage=api.StorageType.FILE,
            replicas=self.replicas,
            direct=True,
        )
        info, kv = await self._open_bucket(js, self.bucket, config)
        layout = _LAYOUT.fullmatch(info.config.description or "")
        if layout is not None and int(layout.group(1)) > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{where}: bucket {self.bucket!r} holds layout {layout.group(1)}, written by a "
                f"newer anarchon; this version knows layout {SCHEMA_VERSION}: upgrade it"
            )
        if info.config.max_msgs_per_subject not in (None, -1, 1) or info.config.sealed:
            raise BackendError(
                f"{where}: bucket {self.bucket!r} is not an anarchon claim bucket "
                f"(history {info.config.max_msgs_per_subject}, sealed {info.config.sealed}): "
                f"choose another ?bucket="
            )
        max_age = info.config.max_age
        self._max_age_ms = round(max_age * 1000) if max_age else None
        if self._max_age_ms is not None and self._max_age_ms <= self.margin_ms:
            raise ConfigurationError(
                f"{where}: bucket {self.bucket!r} keeps entries for "
                f"{format_duration_ms(self._max_age_ms)}, not longer than the margin "
                f"{format_duration_ms(self.margin_ms)}: no slot could be claimed safely"
            )
        return kv

    async def _definitions_bucket(self, js: JetStreamContext) -> KeyValue:
        """The definitions bucket: no max age (a definition and its tombstone stay until
        overwritten), one entry per key, and reads served by the stream's leader
        (``direct`` off: a follower's copy may lag behind a write already acknowledged).

        Created on the first open by a version that keeps definitions, so a store of the
        previous release gains it with no manual step.
        """
        where = f"NATS at {self.describe()}"
        bucket = self.definitions_bucket
        config = api.KeyValueConfig(
            bucket=bucket,
            description=DEFINITIONS_DESCRIPTION.format(version=SCHEMA_VERSION),
            history=1,
            storage=api.StorageType.FILE,
            replicas=self.replicas,
            direct=False,
        )
        info, kv = await self._open_bucket(js, bucket, config)
        layout = _DEFINITIONS_LAYOUT.fullmatch(info.config.description or "")
        if layout is None or info.config.max_age or info.config.sealed:
            raise BackendError(
                f"{where}: bucket {bucket!r} is not an anarchon definitions bucket "
                f"(description {info.config.description!r}, max age {info.config.max_age}, "
                f"sealed {info.config.sealed}): choose another ?bucket="
            )
        if int(layout.group(1)) > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{where}: bucket {bucket!r} holds layout {layout.group(1)}, written by a "
                f"newer anarchon; this version knows layout {SCHEMA_VERSION}: upgrade it"
            )
        return kv

    async def _create_bucket(
        self, js: JetStreamContext, config: api.KeyValueConfig
    ) -> api.StreamInfo:
        try:
            await js.create_key_value(config)
            logger.info("created NATS bucket %r (max age %s)", config.bucket, config.ttl)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _STREAM_IN_USE:
                raise
            # Another instance created it first, with other settings: use it as it is.
        return await js.stream_info(f"KV_{config.bucket}")

    async def close(self) -> None:
        nc, self._nc, self._js, self._kv, self._definitions = self._nc, None, None, None, None
        if nc is not None:
            await _close_quietly(nc)

    async def now_ms(self) -> int:
        return self._clock()

    # -- the claim ---------------------------------------------------------------
    async def claim(self, request: ClaimRequest) -> Claim:
        kv = self._open_kv()
        now = self._clock()
        judged = self._judge_locally(request, now)
        if judged is not None:
            return judged
        key = self.run_key(request.job, request.slot)
        if request.version is not None:
            held = await self._held_versions([request.job])
            if held[request.job] != request.version:
                return await self._resolve(kv, key, request, now, missing=Outcome.STALE)
        record = _claim_record(request, now)
        try:
            revision = await kv.update(key, _dump(record), last=0)
        except nats.js.errors.KeyWrongLastSequenceError:
            if self._ambiguous.pop(request.token, 0) is None:
                return await self._resolve(kv, key, request, now)
            return Claim(Outcome.TAKEN, store_now=now)
        except _TRANSIENT as exc:
            _remember(self._ambiguous, request.token, None)
            raise BackendUnavailable(
                f"NATS at {self.describe()} did not answer the claim of {key!r}: "
                f"{_text(exc)} (a retry reads back whether it was won)"
            ) from exc
        self._ambiguous.pop(request.token, None)
        _remember(self._won, (request.job, request.slot), _Won(request.token, revision, record))
        return Claim(Outcome.WON, 1, now)

    def _judge_locally(self, request: ClaimRequest, now: int) -> Claim | None:
        return judge_locally(request, now, self.horizon_ms(request.horizon_ms))

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[Claim]:
        """Claim a batch: every create sent, then the acknowledgements awaited together.

        Each claim is decided from its own answer as :meth:`claim` decides it, in order
        (one connection keeps the publishes in order, so of two claims of one run the
        first wins). Past its horizon or early, a claim is answered without being sent.
        The definitions the claims with a ``version`` name are read first, together (one
        read per job, all in flight at once). A claim naming another version is not
        sent: its run is read before the creates are sent (``TAKEN`` if it exists, else
        ``STALE``), or it is ``TAKEN`` when an earlier claim of the batch created it.
        At most :data:`MAX_IN_FLIGHT` creates are unacknowledged at a time, each given
        ``timeout`` from its send. If any claim fails, the batch raises once every
        create has ended, and each claim sent counts as unanswered: a retry with the
        same tokens answers ``won`` for those this backend won (it knows them, or
        reads the entry back) and ``taken`` for the others.
        """
        kv = self._open_kv()
        now = self._clock()
        answers = [self._judge_locally(request, now) for request in requests]
        stale: list[tuple[int, str]] = []
        versioned = [
            request.job
            for i, request in enumerate(requests)
            if answers[i] is None and request.version is not None
        ]
        if versioned:
            held = await self._held_versions(versioned)
            stale = [
                (i, self.run_key(request.job, request.slot))
                for i, request in enumerate(requests)
                if answers[i] is None
                and request.version is not None
                and held[request.job] != request.version
            ]
        not_sent = {i for i, _ in stale}
        sends = [
            (i, self.run_key(request.job, request.slot), _claim_record(request, now))
            for i, request in enumerate(requests)
            if answers[i] is None and i not in not_sent
        ]
        if stale:
            sent = {i for i, _, _ in sends}
            stale_answers = await self._stale_answers(kv, requests, stale, sent, now)
            for (i, _), stale_answer in zip(stale, stale_answers, strict=True):
                answers[i] = stale_answer
        results = (
            await self._create_many([(key, record) for _, key, record in sends]) if sends else []
        )
        unresolved: list[tuple[int, str]] = []
        failed: BaseException | None = None
        for (i, key, record), result in zip(sends, results, strict=True):
            request = requests[i]
            if isinstance(result, int):
                won = _Won(request.token, result, record)
                _remember(self._won, (request.job, request.slot), won)
                self._ambiguous.pop(request.token, None)
                answers[i] = Claim(Outcome.WON, 1, now)
            elif result is None:  # wrong last sequence: the key has an entry
                if self._ambiguous.pop(request.token, 0) is None:
                    unresolved.append((i, key))
                else:
                    answers[i] = Claim(Outcome.TAKEN, store_now=now)
            elif failed is None:
                failed = result
        if failed is None and unresolved:
            gate = asyncio.Semaphore(MAX_IN_FLIGHT)

            async def resolve(i: int, key: str) -> Claim:
                async with gate:
                    return await self._resolve(kv, key, requests[i], now)

            resolved = await asyncio.gather(
                *(resolve(i, key) for i, key in unresolved), return_exceptions=True
            )
            for (i, _), answer in zip(unresolved, resolved, strict=True):
                if isinstance(answer, BaseException):
                    failed = failed or answer
                else:
                    answers[i] = answer
        if failed is not None:
            for i, _, _ in sends:  # no answer reaches the caller: a retry resolves each
                _remember(self._ambiguous, requests[i].token, None)
            if isinstance(failed, BackendUnavailable):
                raise failed
            raise BackendUnavailable(
                f"NATS at {self.describe()} did not answer every claim of a batch of "
                f"{len(sends)}: {_text(failed)} (a retry reads back which were won)"
            ) from failed
        return [answer for answer in answers if answer is not None]

    async def _stale_answers(
        self,
        kv: KeyValue,
        requests: Sequence[ClaimRequest],
        stale: list[tuple[int, str]],
        sent: set[int],
        now: int,
    ) -> list[Claim]:
        """The answers of a batch's claims of a stale version (``stale``: index and run
        key, in batch order), decided at their place in the batch: ``TAKEN`` after an
        earlier claim of the same run that is ``sent`` (that run will exist), else read
        now, before any create of the batch is sent (``TAKEN``, or ``WON`` by this
        token, if the run exists; else ``STALE``).
        """
        earlier: set[tuple[str, int]] = set()
        after_a_send: set[int] = set()
        stale_at = {i for i, _ in stale}
        for i, request in enumerate(requests):
            run = (request.job, request.slot)
            if i in stale_at and run in earlier:
                after_a_send.add(i)
            elif i in sent:
                earlier.add(run)
        gate = asyncio.Semaphore(MAX_IN_FLIGHT)

        async def answer(i: int, key: str) -> Claim:
            if i in after_a_send:
                return Claim(Outcome.TAKEN, store_now=now)
            async with gate:
                return await self._resolve(kv, key, requests[i], now, missing=Outcome.STALE)

        return list(await asyncio.gather(*(answer(i, key) for i, key in stale)))

    async def _create_many(self, creates: list[tuple[str, dict[str, Any]]]) -> list[_Created]:
        """Create each key (expected last subject sequence 0), pipelined; one answer each.

        Every create sent has ended (answered, failed or timed out) when this returns,
        so a retry of the batch never races with a copy of itself still in flight. A
        create not sent (disconnected, or the window stayed full) fails like the others.
        """
        nc = self._nc
        assert nc is not None  # _open_kv checked it
        if self._pipeline is None or self._pipeline.nc is not nc:
            self._pipeline = _Pipeline(nc)
        pipeline, timeout = self._pipeline, self.timeout_ms / 1000
        futures: list[asyncio.Future[Msg]] = []
        unsent: BaseException | None = None
        async with pipeline.lock:  # one batch sends at a time: each in order
            for key, record in creates:
                if not nc.is_connected:
                    unsent = BackendUnavailable(f"NATS at {self.describe()} is reconnecting")
                    break
                try:
                    futures.append(
                        await pipeline.send(f"$KV.{self.bucket}.{key}", _dump(record), timeout)
                    )
                except (TimeoutError, *_TRANSIENT) as exc:
                    unsent = exc
                    break
        try:
            if futures:
                await asyncio.wait(futures)
        finally:  # cancelled: no create stays pending (each holds a slot of the window)
            for future in futures:
                future.cancel()
        results = [_created(future, timeout) for future in futures]
        results += [unsent or BackendUnavailable("not sent")] * (len(creates) - len(futures))
        return results

    async def _resolve(
        self,
        kv: KeyValue,
        key: str,
        request: ClaimRequest,
        now: int,
        *,
        missing: Outcome = Outcome.TAKEN,
    ) -> Claim:
        """A claim sent before without an answer: the entry tells whether it was ours.

        Known without a read when this backend won it with this token (a batch that
        failed after this claim was acknowledged). Also how a claim of a stale version
        is answered (``missing`` ``STALE``): a run that exists is ``TAKEN`` (or ``WON``
        by this very token, an ambiguous claim retried after the definition changed).
        """
        held = self._won.get((request.job, request.slot))
        if held is not None and held.token == request.token:
            return Claim(Outcome.WON, 1, now)
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return Claim(missing, store_now=now)
        except _TRANSIENT as exc:
            _remember(self._ambiguous, request.token, None)
            raise BackendUnavailable(f"NATS: reading back {key!r} failed: {_text(exc)}") from exc
        record = _load(entry.value)
        if record.get("token") == request.token and entry.revision is not None:
            won = _Won(request.token, entry.revision, record)
            _remember(self._won, (request.job, request.slot), won)
            return Claim(Outcome.WON, 1, now)
        return Claim(Outcome.TAKEN, store_now=now)

    # -- finish ------------------------------------------------------------------
    async def finish(
        self,
        lease: Lease,
        status: Status,
        *,
        error: str | None = None,
        meta: dict[str, Any] | None = None,
        retry_in_ms: int | None = None,
    ) -> bool:
        """Rewrite the run's entry with its outcome, only if this lease's token holds it.

        One round trip when this backend won the claim (it kept the entry's revision);
        otherwise the entry is read first. Repeating a finish returns ``True``.
        """
        kv = self._open_kv()
        key = self.run_key(lease.job, lease.slot)
        held = self._won.get((lease.job, lease.slot))
        try:
            if held is not None and held.token == lease.token:
                revision, record = held.revision, held.record
            else:
                found = await self._read(kv, key)
                if found is None or found[1].get("token") != lease.token:
                    return False
                revision, record = found
                if record.get("status") != Status.CLAIMED:
                    return bool(record.get("status") == status)  # a repeated finish
            update = {
                **record,
                "status": str(status),
                "finished_at": self._clock(),
                "error": bound_error(error),
                "meta": dict(meta or {}),
            }
            try:
                await kv.update(key, _dump(update), last=revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                found = await self._read(kv, key)  # written already (an ambiguous repeat)?
                return (
                    found is not None
                    and found[1].get("token") == lease.token
                    and found[1].get("status") == status
                )
        except _TRANSIENT as exc:
            raise BackendUnavailable(
                f"NATS at {self.describe()}: recording the outcome of {key!r} failed: {_text(exc)}"
            ) from exc
        self._won.pop((lease.job, lease.slot), None)
        return True

    async def _read(self, kv: KeyValue, key: str) -> tuple[int, dict[str, Any]] | None:
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        if entry.revision is None:
            return None
        return entry.revision, _load(entry.value)

    # -- job definitions -------------------------------------------------------------
    async def write_definition(self, job: str, body: str | None, *, expected: int | None) -> int:
        """Store or remove ``job``'s definition; its new version is the entry's revision.

        ``expected=None`` is a KV ``put``; ``0`` a ``create`` (a key holding only a
        tombstone is created again over it); ``v`` an ``update(last=v)``. A removal
        publishes a delete marker (the tombstone, with a revision of its own) guarded by
        the revision it removes. The server checks each guard in the same step as the
        write. A guarded edit (``expected`` not ``None`` or ``0``) and a removal read
        the key first, one more round trip: a tombstone's revision must not pass as the
        version of a definition, and a removal of nothing writes nothing.
        """
        self._open_kv()
        defs = self._definitions
        assert defs is not None  # _open_kv checked the connection; open() set both
        key = self.definition_key(job)
        try:
            if body is None:
                return await self._remove_definition(defs, job, key, expected)
            value = body.encode()
            if expected is None:
                return await defs.put(key, value)
            if expected == 0:
                return await self._create_definition(defs, job, key, value)
            current, _ = await self._definition_head(defs, key)
            if current != expected:
                raise _conflict(job, current, expected)
            try:
                return await defs.update(key, value, last=expected)
            except nats.js.errors.KeyWrongLastSequenceError:
                current, _ = await self._definition_head(defs, key)
                raise _conflict(job, current, expected) from None
        except _TRANSIENT as exc:
            raise BackendUnavailable(
                f"NATS at {self.describe()}: writing the definition of {job!r} failed: {_text(exc)}"
            ) from exc

    async def _create_definition(self, defs: KeyValue, job: str, key: str, value: bytes) -> int:
        """Create the key (last revision 0), or over its tombstone (last = its revision)."""
        last = 0
        while True:
            try:
                return await defs.update(key, value, last=last)
            except nats.js.errors.KeyWrongLastSequenceError:
                current, last = await self._definition_head(defs, key)
                if current:
                    raise _conflict(job, current, 0) from None
                # only a tombstone (perhaps a newer one): create over that revision

    async def _remove_definition(
        self, defs: KeyValue, job: str, key: str, expected: int | None
    ) -> int:
        """Publish a delete marker guarded by the live revision it removes; 0 if none."""
        assert self._js is not None  # set with the bucket
        while True:
            current, _ = await self._definition_head(defs, key)
            if expected is not None and current != expected:
                raise _conflict(job, current, expected)
            if current == 0:
                return 0  # nothing to remove: no second tombstone
            headers = {
                _KV_OPERATION: "DEL",
                api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: str(current),
            }
            try:
                ack = await self._js.publish(
                    f"$KV.{self.definitions_bucket}.{key}", headers=headers
                )
            except nats.js.errors.APIError as exc:
                if exc.err_code not in _WRONG_SEQUENCE:
                    raise
                if expected is not None:
                    current, _ = await self._definition_head(defs, key)
                    raise _conflict(job, current, expected) from None
                continue  # changed meanwhile; "whatever it is": read it again
            return ack.seq

    @staticmethod
    async def _definition_head(defs: KeyValue, key: str) -> tuple[int, int]:
        """``(live version or 0, last revision or 0)``: a tombstone is version 0 but keeps
        its revision (a create over it must name it)."""
        try:
            entry = await defs.get(key)
        except nats.js.errors.KeyNotFoundError as exc:
            tombstone = exc.entry
            return 0, (tombstone.revision or 0) if tombstone is not None else 0
        return entry.revision or 0, entry.revision or 0

    async def _held_versions(self, jobs: Sequence[str]) -> dict[str, int]:
        """The live version of each job's definition (0: none), read together.

        What a claim with a ``version`` is checked against before its create is sent:
        not in the same atomic step (see the module docstring).
        """
        defs = self._definitions
        assert defs is not None  # _open_kv checked it
        names = list(dict.fromkeys(jobs))
        gate = asyncio.Semaphore(MAX_IN_FLIGHT)

        async def read(job: str) -> int:
            async with gate:
                current, _ = await self._definition_head(defs, self.definition_key(job))
                return current

        try:
            versions = await asyncio.gather(*(read(job) for job in names))
        except _TRANSIENT as exc:
            raise BackendUnavailable(
                f"NATS at {self.describe()}: reading the definitions a claim names failed: "
                f"{_text(exc)}"
            ) from exc
        return dict(zip(names, versions, strict=True))

    async def read_definition(self, job: str) -> StoredDefinition | None:
        """One ``get`` of the job's key in the definitions bucket (its revision is the
        version; a delete marker is no definition)."""
        self._open_kv()
        defs = self._definitions
        assert defs is not None  # _open_kv checked it
        try:
            entry = await defs.get(self.definition_key(job))
        except nats.js.errors.KeyNotFoundError:
            return None
        except _TRANSIENT as exc:
            raise BackendUnavailable(
                f"NATS at {self.describe()}: reading definition {job!r} failed: {_text(exc)}"
            ) from exc
        if entry.value is None:
            return None
        return StoredDefinition(job, entry.revision or 0, entry.value.decode())

    async def definitions_since(self, version: int) -> list[StoredDefinition]:
        """Every definition whose entry's revision is above ``version``, by revision.

        One ordered consumer from revision ``version + 1`` reads the definitions
        bucket; the bucket keeps one entry per key, and of a key rewritten while it is
        read the last entry is kept. A delete or purge marker is a tombstone (body
        ``None``).
        """
        self._open_kv()
        prefix = f"$KV.{self.definitions_bucket}.d."
        latest: dict[str, StoredDefinition] = {}
        try:
            for msg in await self._read_stream(
                f"{prefix}>", self.definitions_stream, start=version + 1
            ):
                headers = msg.headers or {}
                removed = headers.get(_KV_OPERATION) or headers.get("Nats-Marker-Reason")
                job = decode_job(msg.subject[len(prefix) :])
                body = None if removed else msg.data.decode()
                latest[job] = StoredDefinition(job, msg.metadata.sequence.stream, body)
        except _TRANSIENT as exc:
            raise BackendUnavailable(
                f"NATS at {self.describe()}: reading the definitions failed: {_text(exc)}"
            ) from exc
        return sorted(latest.values(), key=lambda d: d.version)

    async def watch_definitions(self, changed: Callable[[], None]) -> None:
        """A core subscription to the definitions bucket's subjects: every put and delete
        of a definition is published there, and heard as it is stored."""
        self._open_kv()
        assert self._nc is not None  # _open_kv checked it

        async def heard(_: Msg) -> None:
            changed()

        try:
            subscription = await self._nc.subscribe(f"$KV.{self.definitions_bucket}.>", cb=heard)
        except _TRANSIENT as exc:
            raise BackendUnavailable(
                f"NATS at {self.describe()}: subscribing to definition changes failed: {_text(exc)}"
            ) from exc
        try:
            changed()
            await asyncio.Event().wait()  # until cancelled
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def definitions_version(self) -> int:
        """The definitions stream's last sequence: the newest revision issued (0: none)."""
        self._open_kv()
        assert self._js is not None  # set with the bucket
        try:
            info = await self._js.stream_info(self.definitions_stream)
        except _TRANSIENT as exc:
            raise BackendUnavailable(
                f"NATS at {self.describe()}: reading the definitions version failed: {_text(exc)}"
            ) from exc
        return info.state.last_seq or 0

    # -- history -----------------------------------------------------------------
    async def history(self, query: HistoryQuery) -> list[RunRecord]:
        """Every entry still in the bucket (younger than its max age) that matches."""
        self._open_kv()
        keys = "c.>" if query.job is None else f"c.{encode_job(query.job)}.>"
        records: list[RunRecord] = []
        try:
            for msg in await self._read_stream(f"$KV.{self.bucket}.{keys}", self.stream):
                headers = msg.headers or {}
                if headers.get(_KV_OPERATION) or headers.get("Nats-Marker-Reason"):
                    continue  # a deleted or purged key
                record = _run_record(_load(msg.data))
                if record is not None and query.matches(record):
                    records.append(record)
        except _TRANSIENT as exc:
            raise BackendUnavailable(
                f"NATS at {self.describe()}: reading the history failed: {_text(exc)}"
            ) from exc
        return select_records(records, query)

    async def _read_stream(self, subject: str, stream: str, *, start: int = 0) -> list[Msg]:
        """The entries under ``subject`` in ``stream``, in order: each key's latest once
        (``start`` 0), or every entry from stream sequence ``start`` on.

        An ordered consumer delivers them; the server's own count (delivered plus
        pending, read once, then lowered by each entry's own pending count) says how
        many there are. nats-py's key watcher instead compares the server's pending
        count with what its callback has processed so far, and ends early, with
        nothing, when the entries arrived in between.
        """
        assert self._nc is not None  # _open_kv checked it
        js = self._nc.jetstream(timeout=self.timeout_ms / 1000)
        timeout = self.timeout_ms / 1000
        config = None
        policy = api.DeliverPolicy.LAST_PER_SUBJECT
        if start > 0:
            policy = api.DeliverPolicy.BY_START_SEQUENCE
            config = api.ConsumerConfig(opt_start_seq=start)
        sub = await js.subscribe(
            subject,
            stream=stream,
            config=config,
            ordered_consumer=True,
            deliver_policy=policy,
            inactive_threshold=60,
        )
        entries: list[Msg] = []
        try:
            info = await sub.consumer_info()
            delivered = info.delivered.consumer_seq if info.delivered else 0
            left = (info.num_pending or 0) + delivered
            while left > 0:
                msg = await sub.next_msg(timeout=timeout)
                left = min(left - 1, msg.metadata.num_pending)
                entries.append(msg)
        finally:
            await sub.unsubscribe()
        return entries

    # -- connection ------------------------------------------------------------------
    def _open_kv(self) -> KeyValue:
        """The bucket, failing fast while disconnected: nothing is queued for later.

        nats-py would buffer a request sent while it reconnects and deliver it after the
        outage, possibly long after its claim stopped being wanted.
        """
        if self._kv is None or self._nc is None or self._nc.is_closed:
            raise BackendUnavailable(f"the NATS backend for {self.describe()} is not open")
        if not self._nc.is_connected:
            raise BackendUnavailable(f"NATS at {self.describe()} is reconnecting")
        return self._kv

    def _connect_error(self, exc: BaseException) -> BackendError:
        where = f"NATS at {self.describe()}"
        seen = [*self._errors, exc]
        if any(
            isinstance(e, nats.errors.AuthorizationError) or "Authorization Violation" in str(e)
            for e in seen
        ):
            who = self._auth.get("user") or (
                "a token" if self._auth.get("token") else "no credentials"
            )
            return BackendError(
                f"{where} refused the credentials ({who}): Authorization Violation; check the "
                f"user and password (or token) in the URL"
            )
        cause = next(
            (e for e in reversed(seen) if not isinstance(e, nats.errors.NoServersError)), exc
        )
        return BackendUnavailable(
            f"{where} cannot be reached: {redact_text(_text(cause), self._url)}"
        )

    async def _on_error(self, exc: Exception) -> None:
        if self._opening:
            self._errors.append(exc)
            return
        logger.warning(
            "NATS connection error (%s): %s", self.describe(), redact_text(_text(exc), self._url)
        )

    async def _on_disconnected(self) -> None:
        if not self._opening and self._nc is not None:
            logger.warning("disconnected from NATS at %s; reconnecting", self.describe())

    async def _on_reconnected(self) -> None:
        logger.info("reconnected to NATS at %s", self.describe())


def _backoff(servers: list[Server], info: dict[str, Any]) -> tuple[Server | None, float]:
    """Reconnect to the server tried least, after a jittered, doubling delay."""
    best = min(servers, key=lambda s: s.reconnects)
    delay = min(RECONNECT_MIN_S * 2 ** min(best.reconnects, 10), RECONNECT_MAX_S)
    return best, delay * random.uniform(0.5, 1.0)


async def _close_quietly(nc: Client) -> None:
    try:
        await nc.close()
    except _TRANSIENT as exc:  # already broken: nothing left to release
        logger.debug("closing the NATS connection failed: %s", exc)


def _remember(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _MAX_REMEMBERED:
        cache.popitem(last=False)


def _claim_record(request: ClaimRequest, now: int) -> dict[str, Any]:
    """The entry a claim creates: ``claimed`` by its token, until its outcome is written."""
    return {
        "layout": SCHEMA_VERSION,
        "job": request.job,
        "slot": request.slot,
        "origin": str(request.origin),
        "status": str(Status.CLAIMED),
        "token": request.token,
        "instance_id": request.instance_id,
        "claimed_at": now,
        "finished_at": None,
        "error": None,
        "meta": {},
        "fingerprint": request.fingerprint,
    }


#: A create's answer: the entry's revision (created), ``None`` (the key has an entry:
#: "wrong last sequence") or the error that left it unanswered.
_Created = int | None | BaseException


class _Pipeline:
    """JetStream publishes of one connection sent without waiting for each other's answer.

    Each publish carries a reply subject of its own under one inbox subscription; its
    future gets the reply, or is cancelled after its timeout. At most
    :data:`MAX_IN_FLIGHT` are unanswered. (nats-py's ``publish_async`` would do this,
    but as of 2.16 it leaves the future of an error reply pending, and a refused
    create is every losing claim.)
    """

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.lock = asyncio.Lock()
        self._window = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._inbox = nc.new_inbox()
        self._pending: dict[str, asyncio.Future[Msg]] = {}
        self._subscribed = False
        self._sent = 0

    async def send(self, subject: str, payload: bytes, timeout: float) -> asyncio.Future[Msg]:
        """Publish a create (expected last subject sequence 0); the future of its reply."""
        if not self._subscribed:
            await self.nc.subscribe(f"{self._inbox}.*", cb=self._on_reply)
            self._subscribed = True
        async with asyncio.timeout(timeout):
            await self._window.acquire()
        loop = asyncio.get_running_loop()
        self._sent += 1
        token = str(self._sent)
        future: asyncio.Future[Msg] = loop.create_future()
        self._pending[token] = future
        timer = loop.call_later(timeout, future.cancel)

        def ended(_: asyncio.Future[Msg]) -> None:
            timer.cancel()
            self._pending.pop(token, None)
            self._window.release()

        future.add_done_callback(ended)
        try:
            await self.nc.publish(
                subject,
                payload,
                reply=f"{self._inbox}.{token}",
                headers={api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"},
            )
        except BaseException:
            future.cancel()
            raise
        return future

    async def _on_reply(self, msg: Msg) -> None:
        future = self._pending.pop(msg.subject[len(self._inbox) + 1 :], None)
        if future is not None and not future.done():
            future.set_result(msg)


def _created(future: asyncio.Future[Msg], timeout: float) -> _Created:
    """What the reply to a create says (see :data:`_Created`)."""
    if future.cancelled():
        return TimeoutError(f"no acknowledgement within {timeout:g} s")
    msg = future.result()
    if msg.headers and msg.headers.get(api.Header.STATUS) == "503":
        return nats.js.errors.NoStreamResponseError()
    try:
        answer = json.loads(msg.data)
        error = answer.get("error")
        if error is None:
            return int(answer["seq"])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return nats.js.errors.APIError(description=f"unreadable acknowledgement: {exc}")
    if error.get("err_code") in _WRONG_SEQUENCE:
        return None
    return nats.js.errors.APIError(
        code=error.get("code"), description=error.get("description"), err_code=error.get("err_code")
    )


def _conflict(job: str, current: int, expected: int) -> ConflictError:
    return ConflictError(
        f"definition {job!r} is at version {current}, not {expected}", current=current
    )


def _dump(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


def _load(value: bytes | None) -> dict[str, Any]:
    try:
        data = json.loads(value or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _run_record(data: dict[str, Any]) -> RunRecord | None:
    try:
        return RunRecord(
            job=str(data["job"]),
            slot=int(data["slot"]),
            attempt=1,
            origin=Origin(data.get("origin", Origin.SCHEDULE)),
            status=Status(data["status"]),
            instance_id=data.get("instance_id"),
            claimed_at=data.get("claimed_at"),
            started_at=data.get("claimed_at"),
            finished_at=data.get("finished_at"),
            error=data.get("error"),
            meta=dict(data.get("meta") or {}),
        )
    except (KeyError, TypeError, ValueError):
        return None  # not an anarchon record: skipped


def _parse_url(url: str) -> tuple[list[str], dict[str, str | None], dict[str, str]]:
    """Servers, credentials and options of a ``nats://`` URL, each option checked."""

    def invalid(why: str = "") -> ConfigurationError:
        return ConfigurationError(
            f"NATS URL {brief_url(url)} is not valid{f' ({why})' if why else ''}: use {_URL_FORM}"
        )

    if not isinstance(url, str):
        raise invalid()
    problem = userinfo_problem(url)
    if problem is not None:
        raise invalid(problem)
    try:
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise invalid() from None
    if parts.scheme != "nats" or parts.fragment or parts.path not in ("", "/"):
        raise invalid()
    userinfo, _, hosts = parts.netloc.rpartition("@")
    auth: dict[str, str | None] = {}
    if userinfo:
        user, colon, password = userinfo.partition(":")
        if colon:
            auth = {"user": unquote(user), "password": unquote(password)}
        else:
            auth = {"token": unquote(user)}
    servers = []
    for host in hosts.split(","):
        try:
            one = urlsplit(f"nats://{host}")
            port = one.port
        except ValueError:
            raise invalid(f"port of {brief(host)} is not a number from 1 to 65535") from None
        if not host or not one.hostname:
            raise invalid("a host is missing")
        servers.append(f"nats://{host if port else f'{host}:4222'}")
    options: dict[str, str] = {}
    for key, value in pairs:
        if key not in _OPTIONS:
            raise ConfigurationError(
                f"NATS URL {brief_url(url)} has an unknown option {brief(key)}; accepted: "
                + ", ".join(_OPTIONS)
            )
        if key in options:
            raise ConfigurationError(f"NATS URL {brief_url(url)} repeats option {brief(key)}")
        if key == "name" and not (0 < len(value) <= MAX_NAME and value.isprintable()):
            raise ConfigurationError(
                f"NATS URL option name={brief(value)} is not valid: give 1-{MAX_NAME} printable "
                f"characters"
            )
        options[key] = value
    return servers, auth, options


def _validate_bucket(bucket: object) -> str:
    if not isinstance(bucket, str) or not _BUCKET.fullmatch(bucket):
        raise ConfigurationError(
            f"NATS bucket {brief(bucket)} is not valid: use 1-64 characters from A-Z a-z 0-9 _ -"
        )
    return bucket


def _duration(key: str, text: str | None, value: int | None, default: int) -> int:
    low, high = _BOUNDS[key]
    return duration_option("NATS", key, text, value, default, low=low, high=high)


def _replicas(text: str | None, value: int | None) -> int:
    if value is None:
        value = 1 if text is None else int(text) if re.fullmatch(r"[0-9]{1,2}", text) else 0
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 5:
        raise ConfigurationError(
            f"NATS replicas {brief(text if value == 0 else value)} is not valid: give 1 to 5 "
            f"(JetStream stream replicas)"
        )
    return value


def _text(exc: BaseException) -> str:
    """A driver's message for ours: any URL or ``password=`` it quotes redacted."""
    text = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {redact_text(text)}"
