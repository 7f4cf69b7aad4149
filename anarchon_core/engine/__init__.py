"""The running state of a started scheduler, in rooms of its own.

- :mod:`.planner`: pure functions and small data of when this instance acts on a slot
  (roles, stagger, jitter, the clock-step skip); unit-tested without a store or a loop.
- :mod:`.candidates`: the ranking of a run's instances from a registry view.
- :mod:`.registry`: this instance's registry entry and its view of the others.
- :mod:`.claims`: claims sent in batches, and what their answers start.
- :mod:`.runner`: the attempts this instance runs: handler call, finish, hand-over.
- :mod:`.leases`: heartbeats and self-fencing of the held attempts.
- :mod:`.core`: :class:`Engine`, the life cycle that ties them together.

Nothing here is public API: :class:`~anarchon_core.Scheduler` is.
"""

from __future__ import annotations

from .core import Engine
from .support import EngineConfig

__all__ = ["Engine", "EngineConfig"]
