"""The backend contract (anarchon_core/backend.py), proved identically on every backend.

The tests are the public suite's, :mod:`anarchon_core.conformance.contract` (what a
third-party store runs too), collected here against every registered store: the
``backend`` fixture of ``conftest.py`` is parametrised over ``registry.BACKENDS``.
"""

from __future__ import annotations

from anarchon_core.conformance.contract import *  # noqa: F403
