"""The test project's ASGI application with the scheduler in each worker (``test_servers``).

``uvicorn django_project.asgi:application --workers 2``: every worker is one instance,
started and stopped by the lifespan scope (:func:`anarchon_django.asgi.with_scheduler`).
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

from anarchon_django.asgi import with_scheduler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_project.settings")

application = with_scheduler(get_asgi_application())
