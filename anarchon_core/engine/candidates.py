"""Which instances claim a run: k candidates by rendezvous hashing, one watcher.

With every instance claiming every slot, the store does N claims for one run. Instead
each instance ranks, for each run, the live instances of the registry that hold the
job with the same definition (its store name and fingerprint) by a hash of (job, slot,
instance id): the same ranking on every instance that sees the same registry. The top
``k`` are the run's *candidates*, the next one its *watcher*; the others do not claim.
They claim in rank order (see :mod:`.planner`): the first candidate at the slot, each
next one only if those before it died since the registry was last read. A store's
claim stays the only arbiter, so instances that see different registries only make
more claims, never a second winner.

Where the view cannot say who holds the job, the instance claims (:attr:`Role.UNRANKED`,
after a jitter): without a view (no registry, a read too long ago, ``k`` unset), when
live instances disagree about the job's definition (a rolling deploy), or when this
instance's own entry is not in the view yet. Instances that do not hold a job (other
services on the store, replicas of an older deploy) never rank for it, so they can
never leave a run without a claimer.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from typing import NamedTuple

from ..errors import ConfigurationError

__all__ = [
    "DEFAULT_CANDIDATES",
    "MAX_CANDIDATES",
    "Candidates",
    "Role",
    "Turn",
    "check_candidates",
]

#: Candidates per run unless configured: a second one covers a candidate that died
#: since the registry was last read, the watcher a third.
DEFAULT_CANDIDATES = 2
#: The most candidates per run that can be configured.
MAX_CANDIDATES = 1000

_MASK = (1 << 64) - 1


class Role(enum.Enum):
    """What an instance does for one run."""

    CANDIDATE = "candidate"
    """Claims at the slot plus a stagger by rank."""
    WATCHER = "watcher"
    """Claims once the candidates' window has passed."""
    NONE = "none"
    """Does not claim (backups still take over expired leases)."""
    UNRANKED = "unranked"
    """No ranking can be trusted: claims after a jitter."""


class Turn(NamedTuple):
    """This instance's role for one run and its rank (0 = first) in the run's ranking."""

    role: Role
    rank: int = 0


#: The turn of an instance that claims without a ranking.
UNRANKED = Turn(Role.UNRANKED)


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
    """A number in [0, 1) fixed by ``(seed, slot)``, the same in every process."""
    return _mix(seed ^ _mix(slot & _MASK)) / 2.0**64


class Candidates:
    """One instance's view of the registry and the turns it gives this instance.

    The view maps each live instance to the jobs its registry entry lists, each with
    its definition fingerprint.
    """

    def __init__(self, k: int | None, me: str, *, stale_after_ms: int) -> None:
        self.k = k
        self.me = me
        self.stale_after_ms = stale_after_ms
        self._hashes: dict[str, int] = {}  # instance id -> its hash
        self._holders: dict[str, dict[str, str]] = {}  # job -> instance id -> fingerprint
        self._ranked: dict[tuple[str, str], tuple[tuple[str, int], ...] | None] = {}
        self._read_at: int | None = None
        self._names: dict[str, int] = {}  # job store name -> its hash
        self._me = stable_hash(me)
        #: The targets the live instances of the view hold (for stored definitions).
        self.targets_held: frozenset[str] = frozenset()

    @property
    def instances(self) -> frozenset[str]:
        """The instance ids of the current view (empty without one)."""
        return frozenset(self._hashes)

    def update(self, entries: Mapping[str, Mapping[str, str]], now_ms: int) -> set[str]:
        """Take a fresh registry read: each live instance id with the fingerprint of each
        job its entry lists. Returns the instances that left the view."""
        ids = set(entries)
        departed = set(self._hashes) - ids if self.has_view(now_ms) else set()
        self._hashes = {i: self._hashes.get(i) or stable_hash(i) for i in ids}
        holders: dict[str, dict[str, str]] = {}
        for instance, jobs in entries.items():
            for job, fingerprint in jobs.items():
                holders.setdefault(job, {})[instance] = fingerprint
        self._holders = holders
        self._ranked = {}
        self._read_at = now_ms
        return departed

    def has_view(self, now_ms: int) -> bool:
        """A registry read recent enough to rank by (else every instance claims)."""
        return (
            self.k is not None
            and self._read_at is not None
            and now_ms - self._read_at <= self.stale_after_ms
        )

    def turn(self, job: str, fingerprint: str, slot: int, now_ms: int) -> Turn:
        """This instance's turn for the run of ``(job, slot)`` of the definition
        ``fingerprint``."""
        if not self.has_view(now_ms):
            return UNRANKED
        assert self.k is not None
        ranked = self._ranking_set(job, fingerprint)
        if ranked is None:
            return UNRANKED
        key = self._run_key(job, slot)
        mine = _mix(key ^ self._me)
        above = 0
        for other, hashed in ranked:
            if other != self.me and (_mix(key ^ hashed), other) > (mine, self.me):
                above += 1
                if above > self.k:
                    return Turn(Role.NONE, above)
        return Turn(Role.CANDIDATE if above < self.k else Role.WATCHER, above)

    def ranking(self, job: str, fingerprint: str, slot: int) -> list[str]:
        """The instances ranked for the run of ``(job, slot)``, best first (empty where
        the view cannot rank it)."""
        ranked = self._ranking_set(job, fingerprint)
        if ranked is None:
            return []
        key = self._run_key(job, slot)
        return [i for _, i in sorted(((_mix(key ^ h), i) for i, h in ranked), reverse=True)]

    def _ranking_set(self, job: str, fingerprint: str) -> tuple[tuple[str, int], ...] | None:
        """The instances that hold ``job`` with ``fingerprint``, with their hashes;
        ``None`` when the view cannot say: an instance holds another definition of it,
        or this instance's own entry does not list it (not read back yet)."""
        if (job, fingerprint) in self._ranked:
            return self._ranked[(job, fingerprint)]
        holders = self._holders.get(job, {})
        result: tuple[tuple[str, int], ...] | None
        if holders.get(self.me) != fingerprint or any(f != fingerprint for f in holders.values()):
            result = None
        else:
            result = tuple((i, self._hashes[i]) for i in holders)
        self._ranked[(job, fingerprint)] = result
        return result

    def _run_key(self, job: str, slot: int) -> int:
        name = self._names.get(job)
        if name is None:
            name = self._names[job] = stable_hash(job)
        return name ^ _mix(slot & _MASK)
