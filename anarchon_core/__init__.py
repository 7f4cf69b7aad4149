"""anarchon: a leaderless distributed job scheduler.

Every replica runs the same :class:`Scheduler` with the same named jobs; each
computes the same slots, and a shared store decides atomically which replica runs
each one.
"""

from __future__ import annotations

from .backend import Backend, Capabilities, InstanceInfo
from .backends import MemoryBackend, backend_from_url
from .background import BackgroundScheduler
from .context import RunContext
from .errors import (
    AnarchonError,
    BackendError,
    BackendUnavailable,
    CapabilityError,
    ConfigurationError,
    RunCancelled,
    SchedulerStateError,
    SchemaVersionError,
)
from .job import Job
from .operations import NoLiveInstanceError
from .records import Origin, RunRecord, Status
from .scheduler import Scheduler
from .schedules import Cron, Every, Schedule

__version__ = "0.1.0"

__all__ = [
    "AnarchonError",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "BackgroundScheduler",
    "Capabilities",
    "CapabilityError",
    "ConfigurationError",
    "Cron",
    "Every",
    "InstanceInfo",
    "Job",
    "MemoryBackend",
    "NoLiveInstanceError",
    "Origin",
    "RunCancelled",
    "RunContext",
    "RunRecord",
    "Schedule",
    "Scheduler",
    "SchedulerStateError",
    "SchemaVersionError",
    "Status",
    "__version__",
    "backend_from_url",
]
