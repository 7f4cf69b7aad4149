"""Run the scheduler inside each gunicorn worker: ``from anarchon_django.gunicorn import
post_worker_init, worker_exit`` in ``gunicorn.conf.py``.

``post_worker_init`` starts the project's scheduler in a background thread of the
worker (never in the master, so ``--preload`` is safe: the scheduler mints a fresh
instance id in each worker); ``worker_exit`` stops it with hand-over. Each worker is
one instance. Trade-offs: ``docs/django.md``, "Inside each gunicorn worker".
"""

from __future__ import annotations

from typing import Any

from anarchon_core import BackgroundScheduler

__all__ = ["post_worker_init", "worker_exit"]

_background: BackgroundScheduler | None = None


def post_worker_init(worker: Any) -> None:
    """gunicorn hook: start the project's scheduler in this worker."""
    global _background
    import django
    from django.apps import apps

    if not apps.ready:  # the application is normally loaded (and Django set up) by now
        django.setup()
    from ._scheduler import get_scheduler

    if _background is not None and _background.running:
        return
    _background = BackgroundScheduler(get_scheduler())
    _background.start()


def worker_exit(server: Any, worker: Any) -> None:
    """gunicorn hook: stop this worker's scheduler with hand-over (bounded by GRACE_MS)."""
    global _background
    background, _background = _background, None
    if background is not None:
        background.stop()
