"""anarchon for Django: ``INSTALLED_APPS += ["anarchon_django"]``, jobs in ``jobs.py``.

::

    from anarchon_django import scheduler

    @scheduler.every("orders.sync", "10m", jitter_ms=2000)
    def sync_orders(ctx): ...

``scheduler``, the project's :class:`~anarchon_core.Scheduler` (``settings.ANARCHON``),
is created on first access and connects only once started (``manage.py anarchon run``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._scheduler import DjangoScheduler

    scheduler: DjangoScheduler

__all__ = ["scheduler"]


def __getattr__(name: str) -> Any:
    if name == "scheduler":
        from ._scheduler import get_scheduler

        return get_scheduler()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
