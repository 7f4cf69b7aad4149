"""Celery beat through anarchon, ``celery -A proj beat -S anarchon``: every beat may run,
each due task is sent exactly once (``docs/celery.md``)."""

from .scheduler import Scheduler, cron_expression, job_name, task_id_for

__all__ = ["Scheduler", "cron_expression", "job_name", "task_id_for"]
