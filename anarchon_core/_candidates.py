"""Which instances claim a run: k candidates by rendezvous hashing, one watcher.

With every instance claiming every slot, the store does N claims for one run. Instead
each instance ranks the live instances of the registry for a run by a hash of (job,
slot, instance id), the same ranking on every instance that sees the same registry:
the top ``k`` are the run's *candidates* and claim at the slot (plus jitter); the next
one is its *watcher* and claims after the jitter window, a claim that normally loses
and that catches a run whose candidates died since the registry was last read; the
others do not claim. A store's claim stays the only arbiter, so instances that see
different registries only make more claims, never a second winner.

Without a view (no registry, a registry read too long ago, ``k`` unset) an instance is
a candidate for every run: the behaviour of a cluster where every instance claims.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable

from .errors import ConfigurationError

__all__ = ["DEFAULT_CANDIDATES", "MAX_CANDIDATES", "Candidates", "Role", "check_candidates"]

#: Candidates per run unless configured: a second one covers a candidate that died
#: since the registry was last read, the watcher a third.
DEFAULT_CANDIDATES = 2
#: The most candidates per run that can be configured.
MAX_CANDIDATES = 1000

_MASK = (1 << 64) - 1


class Role(enum.Enum):
    """What an instance does for one run."""

    CANDIDATE = "candidate"
    """Claims at the slot plus its jitter."""
    WATCHER = "watcher"
    """Claims once the candidates' jitter window has passed."""
    NONE = "none"
    """Does not claim (backups still take over expired leases)."""


def check_candidates(value: object, what: str = "candidates") -> int | None:
    """``value`` as a candidate count, or a clear error naming the accepted form."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CANDIDATES:
        text = repr(value)
        if len(text) > 80:
            text = text[:79] + "…"
        raise ConfigurationError(
            f"{what}={text} is not valid: give an int from 1 to {MAX_CANDIDATES} "
            "(instances that claim each run) or None (every instance claims)"
        )
    return value


def _mix(value: int) -> int:
    """splitmix64's finaliser: a 64-bit value whose bits all depend on every input bit."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def stable_hash(text: str) -> int:
    """A 64-bit hash of ``text`` that every process computes alike (``hash()`` does not)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def unit_interval(seed: int, slot: int) -> float:
    """A number in [0, 1) fixed by ``(seed, slot)``: an instance's jitter fraction for
    the jobs due at one slot, so their claims leave together."""
    return _mix(seed ^ _mix(slot & _MASK)) / 2.0**64


class Candidates:
    """One instance's view of the registry and the roles it gives this instance."""

    def __init__(self, k: int | None, me: str, *, stale_after_ms: int) -> None:
        self.k = k
        self.me = me
        self.stale_after_ms = stale_after_ms
        self._view: dict[str, int] = {}  # instance id -> its hash
        self._read_at: int | None = None
        self._names: dict[str, int] = {}  # job store name -> its hash
        self._me = stable_hash(me)

    @property
    def instances(self) -> frozenset[str]:
        """The instance ids of the current view (empty without one)."""
        return frozenset(self._view)

    def update(self, instance_ids: Iterable[str], now_ms: int) -> set[str]:
        """Take a fresh registry read; returns the instances that left the view."""
        ids = set(instance_ids) | {self.me}
        departed = set(self._view) - ids if self.has_view(now_ms) else set()
        self._view = {i: self._view[i] if i in self._view else stable_hash(i) for i in ids}
        self._read_at = now_ms
        return departed

    def has_view(self, now_ms: int) -> bool:
        """A registry read recent enough to rank by (else every instance claims)."""
        return (
            self.k is not None
            and self._read_at is not None
            and now_ms - self._read_at <= self.stale_after_ms
        )

    def role(self, job: str, slot: int, now_ms: int) -> Role:
        """This instance's role for the run of ``(job, slot)``."""
        if not self.has_view(now_ms):
            return Role.CANDIDATE
        assert self.k is not None
        if len(self._view) <= self.k:
            return Role.CANDIDATE
        key = self._run_key(job, slot)
        mine = _mix(key ^ self._me)
        above = 0
        for other, hashed in self._view.items():
            if other != self.me and (_mix(key ^ hashed), other) > (mine, self.me):
                above += 1
                if above > self.k:
                    return Role.NONE
        return Role.CANDIDATE if above < self.k else Role.WATCHER

    def ranking(self, job: str, slot: int) -> list[str]:
        """Every instance of the view, best first, for the run of ``(job, slot)``."""
        key = self._run_key(job, slot)
        return sorted(self._view, key=lambda i: (_mix(key ^ self._view[i]), i), reverse=True)

    def _run_key(self, job: str, slot: int) -> int:
        name = self._names.get(job)
        if name is None:
            name = self._names[job] = stable_hash(job)
        return name ^ _mix(slot & _MASK)
