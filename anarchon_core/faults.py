"""A store wrapper that injects faults: slow, lost and failed replies, and cut links.

:class:`FaultyBackend` wraps any backend and, per kind of call, can

- *delay* a reply: the store applies the call, the caller hears of it later;
- *lose* a reply: the store applies the call, the caller waits ``reply_timeout_ms`` and
  gets :class:`~anarchon_core.errors.BackendUnavailable` (an ambiguous outcome, the
  case that a retry with the same token must resolve);
- *fail* a call before it is sent: nothing is applied, the caller gets the error at once;
- *cut* the whole link for a span: every call made meanwhile waits ``reply_timeout_ms``
  and fails unapplied, and a reply that would arrive during the cut is lost.

Faults are drawn from a seeded generator (so a failing run replays), or queued one at
a time with :meth:`FaultyBackend.once` for a scripted scenario. Every sleep is on the
event loop's clock, so under a virtual-time loop a fault costs no wall time.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar, get_args

from .backend import (
    Backend,
)
from .backends.delegating import DelegatingBackend
from .errors import BackendUnavailable, ConfigurationError

__all__ = ["CallKind", "Faults", "FaultyBackend"]

T = TypeVar("T")

#: The kinds of store call that faults are set for.
CallKind = Literal[
    "claim", "heartbeat", "finish", "takeover", "sweep", "registry", "release", "other"
]
CALL_KINDS: tuple[str, ...] = get_args(CallKind)


@dataclass(frozen=True, slots=True)
class Faults:
    """How often each fault hits one kind of call (probabilities in [0, 1])."""

    delay: float = 0.0
    """The reply comes late, by a uniform time in ``[0, max_delay_ms]``."""
    max_delay_ms: int = 0
    lose: float = 0.0
    """The store applies the call and the reply is lost."""
    fail: float = 0.0
    """The call fails before it is sent: nothing is applied."""

    def __post_init__(self) -> None:
        for name in ("delay", "lose", "fail"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigurationError(f"Faults.{name} = {value!r} is not valid: give 0 to 1")
        if not 0 <= self.max_delay_ms <= 3_600_000:
            raise ConfigurationError(
                f"Faults.max_delay_ms = {self.max_delay_ms!r} is not valid: give 0 to 3600000"
            )


@dataclass(frozen=True, slots=True)
class _Plan:
    """What happens to one call."""

    delay_ms: float = 0.0
    lose: bool = False
    fail: bool = False


class FaultyBackend(DelegatingBackend):
    """``inner`` behind a faulty link; see the module docstring.

    ``faults`` applies to every kind of call, or maps kinds (:data:`CallKind`) to their
    own; kinds left out of a mapping get none. ``open()`` and ``close()`` pass through.
    :attr:`injected` counts what was done, as ``"claim:lost"``, ``"heartbeat:cut"``, ….
    """

    def __init__(
        self,
        inner: Backend,
        faults: Faults | Mapping[str, Faults] | None = None,
        *,
        seed: int | None = None,
        reply_timeout_ms: int = 1000,
    ) -> None:
        self._faults = _by_kind(faults)
        if not 1 <= reply_timeout_ms <= 3_600_000:
            raise ConfigurationError(
                f"reply_timeout_ms = {reply_timeout_ms!r} is not valid: give 1 to 3600000"
            )
        self._inner = inner
        self.capabilities = inner.capabilities
        self.name = inner.name
        self.reply_timeout_s = reply_timeout_ms / 1000
        self.injected: Counter[str] = Counter()
        self._random = random.Random(seed)
        self._scripted: dict[str, deque[_Plan]] = {}
        self._cut_until = -1.0

    # -- steering ------------------------------------------------------------------
    def set_faults(self, faults: Faults | Mapping[str, Faults] | None) -> None:
        """Change the faults drawn from now on (``None``: none; queued ones stay)."""
        self._faults = _by_kind(faults)

    def once(
        self, kind: CallKind, *, delay_ms: float = 0, lose: bool = False, fail: bool = False
    ) -> None:
        """Queue the fault of the next call of ``kind`` (before any drawn one)."""
        if kind not in CALL_KINDS:
            raise ConfigurationError(
                f"fault kind {kind!r} is not valid: choose from {', '.join(CALL_KINDS)}"
            )
        self._scripted.setdefault(kind, deque()).append(_Plan(delay_ms, lose, fail))

    def cut(self, ms: float | None = None) -> None:
        """Cut the link for ``ms`` milliseconds of loop time (``None``: until :meth:`mend`)."""
        now = asyncio.get_running_loop().time()
        self._cut_until = float("inf") if ms is None else max(self._cut_until, now + ms / 1000)

    def mend(self) -> None:
        """End a cut now."""
        self._cut_until = -1.0

    @property
    def is_cut(self) -> bool:
        return asyncio.get_running_loop().time() < self._cut_until

    # -- the faulty call -----------------------------------------------------------
    def _plan(self, kind: str) -> _Plan:
        queued = self._scripted.get(kind)
        if queued:
            return queued.popleft()
        faults = self._faults.get(kind)
        if faults is None:
            return _Plan()
        draw = self._random.random
        return _Plan(
            delay_ms=draw() * faults.max_delay_ms if draw() < faults.delay else 0.0,
            lose=draw() < faults.lose,
            fail=draw() < faults.fail,
        )

    async def _call(self, kind: str, call: Callable[[], Awaitable[T]]) -> T:
        plan = self._plan(kind)
        if self.is_cut:
            self.injected[f"{kind}:cut"] += 1
            await asyncio.sleep(self.reply_timeout_s)
            raise BackendUnavailable(f"{self.name}: no reply (the link is cut)")
        if plan.fail:
            self.injected[f"{kind}:failed"] += 1
            raise BackendUnavailable(f"{self.name}: the call failed before it was sent")
        result = await call()
        if plan.lose:
            self.injected[f"{kind}:lost"] += 1
            await asyncio.sleep(self.reply_timeout_s)
            raise BackendUnavailable(f"{self.name}: the reply was lost (the call was applied)")
        if plan.delay_ms > 0:
            self.injected[f"{kind}:delayed"] += 1
            await asyncio.sleep(plan.delay_ms / 1000)
        if self.is_cut:  # the reply arrives while the link is down
            self.injected[f"{kind}:cut"] += 1
            await asyncio.sleep(self.reply_timeout_s)
            raise BackendUnavailable(f"{self.name}: the reply was lost (the link is cut)")
        return result

    # -- the contract, forwarded through the link ------------------------------------
    @property
    def inner(self) -> Backend:
        return self._inner

    async def _through(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        return await self._call(_KINDS.get(operation, "other"), call)

    async def open(self) -> None:
        await self._inner.open()

    async def close(self) -> None:
        await self._inner.close()

    def describe(self) -> str:
        return self._inner.describe()


#: The fault kind of each contract call (a batch is one request: one kind); the rest
#: are "other".
_KINDS = {
    "claim": "claim",
    "claim_many": "claim",
    "heartbeat": "heartbeat",
    "finish": "finish",
    "finish_many": "finish",
    "release": "release",
    "due_runs": "sweep",
    "take_over": "takeover",
    "register": "registry",
    "unregister": "registry",
    "instances": "registry",
}


def _by_kind(faults: Faults | Mapping[str, Faults] | None) -> dict[str, Faults]:
    if not isinstance(faults, Mapping):
        return dict.fromkeys(CALL_KINDS, faults or Faults())
    unknown = sorted(set(faults) - set(CALL_KINDS))
    if unknown:
        raise ConfigurationError(
            f"fault kinds {unknown} are not valid: choose from {', '.join(CALL_KINDS)}"
        )
    return dict(faults)
