"""Run the scheduler inside each gunicorn worker: two server hooks.

::

    # gunicorn.conf.py
    from anarchon_django.gunicorn import post_worker_init, worker_exit

``post_worker_init`` starts the project's scheduler in a background thread of the
worker (after the WSGI application, and so Django and every ``jobs.py``, is loaded);
``worker_exit`` stops it with hand-over: runs still in flight after ``GRACE_MS`` are
released so that another instance takes them over at once. Each worker is one
instance. Never started in the master, so ``--preload`` is safe: the scheduler it
built there (importing every ``jobs.py``) mints a fresh default instance id when it
starts in each worker (``Scheduler.start()`` does so after a fork; an ``INSTANCE_ID``
set in the settings is kept: leave it unset with more than one worker).

Trade-offs (see ``docs/django.md``): use the ``sync`` or ``gthread`` workers (gevent
and eventlet patch threads and the event loop the scheduler uses); a worker recycled
by ``--max-requests`` is an instance stopping and starting (hand-over each time); a
worker killed for ``--timeout`` is a crash (its runs are taken over after the lease);
nothing runs the system checks or the migration check first.
"""

from __future__ import annotations

import logging
from typing import Any

from anarchon_core import BackgroundScheduler

__all__ = ["post_worker_init", "worker_exit"]

logger = logging.getLogger("anarchon")

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
