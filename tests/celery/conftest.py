"""Helpers of the Celery adapter suite: a Celery app that never touches a broker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

import anarchon_celery


@pytest.fixture
def make_app() -> Callable[..., Celery]:
    def make(beat_schedule: dict[str, Any] | None = None, **conf: Any) -> Celery:
        app = Celery("proj", set_as_current=False)
        settings: dict[str, Any] = {
            "broker_url": "memory://",
            "anarchon_backend": "memory://",
            "beat_schedule": beat_schedule or {},
            "result_expires": None,  # no celery.backend_cleanup default entry
        }
        settings.update(conf)
        app.conf.update(settings)
        return app

    return make


@pytest.fixture
def make_scheduler(
    make_app: Callable[..., Celery],
) -> Callable[..., anarchon_celery.Scheduler]:
    def make(beat_schedule: dict[str, Any] | None = None, **conf: Any) -> anarchon_celery.Scheduler:
        return anarchon_celery.Scheduler(app=make_app(beat_schedule, **conf))

    return make
