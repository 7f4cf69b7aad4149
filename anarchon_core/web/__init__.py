"""The HTTP layer: the JSON API of ``docs/api.md``, the dashboard, and the checks every
HTTP surface applies.

- :mod:`~anarchon_core.web.api`: the cluster's state as JSON, pure functions of a store.
- :mod:`~anarchon_core.web.endpoints`: that API and the dashboard's files behind one
  route table, with no web framework; every host dispatches to it.
- :mod:`~anarchon_core.web.http_guard`: what every surface checks before it acts (JSON
  bodies, origin, host, token) and the answers it sends.
- :func:`create_app`: the standalone dashboard, a Starlette app over a store URL, and
  :func:`api_response` / :func:`starlette_response` for any Starlette or FastAPI host.

Only the last three need the ``[web]`` extra (Starlette). They are imported on first
use, so the Django admin and the command line use the rest of this package without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._starlette import api_response, create_app, starlette_response

__all__ = ["api_response", "create_app", "starlette_response"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import _starlette

        return getattr(_starlette, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
