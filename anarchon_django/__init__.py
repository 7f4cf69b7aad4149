"""anarchon for Django: ``INSTALLED_APPS += ["anarchon_django"]``, jobs in ``jobs.py``.

::

    from anarchon_django import scheduler

    @scheduler.every("orders.sync", "10m", jitter_ms=2000)
    def sync_orders(ctx): ...

``scheduler`` is the project-wide :class:`~anarchon_core.Scheduler` configured from
``settings.ANARCHON``; it is created on first access and opens no connection until
``manage.py anarchon run`` (or the ASGI/gunicorn integration) starts it.
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
