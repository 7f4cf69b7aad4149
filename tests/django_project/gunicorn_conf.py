"""gunicorn settings of ``test_servers``: the scheduler in each worker, as documented.

``gunicorn -c python:django_project.gunicorn_conf django_project.wsgi:application``
"""

from __future__ import annotations

from anarchon_django.gunicorn import post_worker_init, worker_exit

__all__ = ["post_worker_init", "worker_exit"]
