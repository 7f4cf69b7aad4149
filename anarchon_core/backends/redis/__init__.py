"""The Redis backend (redis-py asyncio): works with Redis ≥ 6.2 and Valkey.

``RedisBackend(url, strategy=..., prefix=...)`` or ``redis://host:6379/0?strategy=lease``
builds one of four strategies (docs/backends/redis.md); ``RedisBackend(...)`` returns the subclass
that implements the chosen one, so ``isinstance(b, RedisBackend)`` holds for all:

``lease`` (:class:`RedisLeaseBackend`, the default)
    A lease backend: every decision is one Lua script; a lease is a key with a
    server-side TTL; the run record lives apart from it, so a TTL never deletes it.
``script`` (:class:`RedisScriptBackend`)
    Claim-only: one Lua script records the claim (and the finish) atomically.
``stream-id`` (:class:`RedisStreamIdBackend`)
    Claim-only: ``XADD`` with the slot as the explicit entry id; the store refuses a
    second add of the same or an older id.
``idmp`` (:class:`RedisIdmpBackend`)
    Claim-only: ``XADD … IDMP`` idempotent production (Redis ≥ 8.6).

The shared machinery is in :mod:`._base`, the URL in :mod:`._url`, the
scripts in :mod:`._lua`, the strategies in :mod:`._runs` and
:mod:`._streams`. The key layout, the
guarantees and the failure behaviour are in ``docs/backends/redis.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ._base import RedisBackend
from ._runs import RedisLeaseBackend, RedisScriptBackend
from ._streams import RedisIdmpBackend, RedisStreamIdBackend
from ._url import DEFAULT_PREFIX, DEFAULT_URL, STRATEGIES

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_URL",
    "STRATEGIES",
    "STRATEGY_CLASSES",
    "RedisBackend",
    "RedisIdmpBackend",
    "RedisLeaseBackend",
    "RedisScriptBackend",
    "RedisStreamIdBackend",
]

#: The class that implements each ``?strategy=`` (all four are imported above).
STRATEGY_CLASSES: Mapping[str, type[RedisBackend]] = MappingProxyType(RedisBackend.by_strategy)
