"""Celery beat through anarchon: ``celery -A proj beat -S anarchon``.

Every beat process (or ``worker -B --scheduler anarchon``) may run at once; each entry of
``beat_schedule`` becomes an anarchon job and each due task is sent exactly once.
See ``docs/celery.md``.
"""

from __future__ import annotations

from ._mapping import cron_expression, job_name
from .scheduler import Scheduler, task_id_for

__all__ = ["Scheduler", "cron_expression", "job_name", "task_id_for"]
