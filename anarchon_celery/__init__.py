"""Celery beat through anarchon, ``celery -A proj beat -S anarchon``: every beat may run,
each due task is sent exactly once (``docs/celery.md``)."""

from .scheduler import (
    TARGET_OPTION_KEYS,
    Scheduler,
    cron_expression,
    job_name,
    send_options,
    task_id_for,
)

__all__ = [
    "TARGET_OPTION_KEYS",
    "Scheduler",
    "cron_expression",
    "job_name",
    "send_options",
    "task_id_for",
]
