"""Job definitions kept in the store (anarchon_core/backend.py), on every registered store.

The tests are the public suite's, :mod:`anarchon_core.conformance.definitions`; a store
that keeps no definitions is skipped after its refusal is checked. The claim-only stores
join too (``CLAIM_ONLY_STORES``): NATS keeps definitions.
"""

from __future__ import annotations

from anarchon_core.conformance.definitions import *  # noqa: F403

CLAIM_ONLY_STORES = True
