"""Job definitions kept in the store (anarchon_core/backend.py), on every registered store.

The tests are the public suite's, :mod:`anarchon_core.conformance.definitions`; a store
that keeps no definitions is skipped after its refusal is checked.
"""

from __future__ import annotations

from anarchon_core.conformance.definitions import *  # noqa: F403
