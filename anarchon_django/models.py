"""The store of the Django ORM backend: the core SQL backends' tables, as Django models.

The tables carry the core's names and columns (``anarchon_runs``, ``anarchon_attempts``
…), so :mod:`anarchon_django.backend` runs the core backends' own statements on them
and a core ``sqlite:///…`` or ``postgresql://…`` backend pointed at the same database
sees the same store. Two differences, both for the admin: every table has a surrogate
``id`` primary key (the admin cannot show composite keys) and the core's keys are
unique constraints, which is all its ``ON CONFLICT`` clauses need.

Times are epoch-millisecond integers of the database's clock, never ``DateTimeField``:
leases are compared inside SQL, and a number compares the same on every database.
The models are for reading (the admin, reports); the backend alone writes them.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q, Value

from anarchon_core.records import Origin, Status

__all__ = ["HistoryRecord", "Instance", "Job", "Run", "StoreMeta"]

_STATUSES = [(status.value, status.value) for status in Status]
_ORIGINS = [(origin.value, origin.value) for origin in Origin]


class Run(models.Model):
    """The run of ``(job, slot)``: the row every instance contends for.

    ``state`` is ``pending`` (a manual request), ``running``, ``waiting`` (a failed
    attempt whose retry is due later) or the terminal status the run ended with.
    """

    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    job: models.TextField[str, str] = models.TextField()
    slot: models.BigIntegerField[int, int] = models.BigIntegerField(
        help_text="the scheduled time, epoch ms"
    )
    origin: models.TextField[str, str] = models.TextField(choices=_ORIGINS)
    state: models.TextField[str, str] = models.TextField()
    attempt: models.IntegerField[int, int] = models.IntegerField()
    token: models.TextField[str | None, str | None] = models.TextField(null=True, blank=True)
    lease_expires: models.BigIntegerField[int, int] = models.BigIntegerField(
        default=0, db_default=0
    )
    retry_at: models.BigIntegerField[int, int] = models.BigIntegerField(default=0, db_default=0)
    fingerprint: models.TextField[str, str] = models.TextField(
        default="", db_default="", blank=True
    )
    requested_by: models.TextField[str | None, str | None] = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "anarchon_runs"
        verbose_name = "run"
        constraints = [
            # The claim: two claims of one run are decided by this key.
            models.UniqueConstraint(fields=["job", "slot"], name="anarchon_runs_key"),
            # At most one pending manual request per job (PostgreSQL's trigger relies on it).
            models.UniqueConstraint(
                fields=["job"], condition=Q(state="pending"), name="anarchon_runs_pending"
            ),
        ]
        indexes = [
            # The live-run check, the sweep of due runs and the pending request of a job.
            # Not lease_expires: heartbeats then change no indexed column (HOT updates).
            models.Index(fields=["state", "job"], name="anarchon_runs_open"),
        ]

    def __str__(self) -> str:
        return f"{self.job}@{self.slot}"


class HistoryRecord(models.Model):
    """One attempt of a run (attempt 0: a slot that ran nothing, e.g. ``skipped``)."""

    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    job: models.TextField[str, str] = models.TextField()
    slot: models.BigIntegerField[int, int] = models.BigIntegerField(
        help_text="the scheduled time, epoch ms"
    )
    attempt: models.IntegerField[int, int] = models.IntegerField()
    origin: models.TextField[str, str] = models.TextField(choices=_ORIGINS)
    status: models.TextField[str, str] = models.TextField(choices=_STATUSES)
    instance_id: models.TextField[str | None, str | None] = models.TextField(null=True, blank=True)
    claimed_at: models.BigIntegerField[int | None, int | None] = models.BigIntegerField(
        null=True, blank=True, help_text="epoch ms"
    )
    started_at: models.BigIntegerField[int | None, int | None] = models.BigIntegerField(
        null=True, blank=True, help_text="epoch ms"
    )
    finished_at: models.BigIntegerField[int | None, int | None] = models.BigIntegerField(
        null=True, blank=True, help_text="epoch ms"
    )
    error: models.TextField[str | None, str | None] = models.TextField(null=True, blank=True)
    meta = models.JSONField(default=dict, db_default=Value("{}"), blank=True)

    class Meta:
        db_table = "anarchon_attempts"
        verbose_name = "history record"
        ordering = ["-slot", "-job", "-attempt"]
        # The admin dashboard's actions (anarchon_django.admin); the history itself is
        # read-only there, whatever the default add/change/delete permissions say.
        permissions = [
            ("pause_job", "Can pause and resume jobs (dashboard)"),
            ("trigger_job", "Can trigger a manual run of a job (dashboard)"),
            ("cancel_run", "Can cancel a running run (dashboard)"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "slot", "attempt"], name="anarchon_attempts_key"
            ),
        ]
        indexes = [
            # History's order: a page is one index range from its cursor, with no sort.
            models.Index(fields=["-slot", "-job", "-attempt"], name="anarchon_attempts_history"),
        ]

    def __str__(self) -> str:
        return f"{self.job}@{self.slot}#{self.attempt} {self.status}"


class Job(models.Model):
    """A job's flags shared by every instance: whether it is paused."""

    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    job: models.TextField[str, str] = models.TextField()
    paused: models.BooleanField[bool, bool] = models.BooleanField(default=False, db_default=False)

    class Meta:
        db_table = "anarchon_jobs"
        constraints = [models.UniqueConstraint(fields=["job"], name="anarchon_jobs_key")]

    def __str__(self) -> str:
        return self.job


class Instance(models.Model):
    """The instance registry: ``info`` is an ``InstanceInfo`` as JSON; expired rows are dead."""

    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    instance_id: models.TextField[str, str] = models.TextField()
    info = models.JSONField()
    last_seen: models.BigIntegerField[int, int] = models.BigIntegerField(
        help_text="epoch ms, the store's clock"
    )
    expires_at: models.BigIntegerField[int, int] = models.BigIntegerField(
        help_text="epoch ms, the store's clock"
    )

    class Meta:
        db_table = "anarchon_instances"
        constraints = [
            models.UniqueConstraint(fields=["instance_id"], name="anarchon_instances_key")
        ]

    def __str__(self) -> str:
        return self.instance_id


class StoreMeta(models.Model):
    """Facts about the store itself: its ``schema_version`` (a newer one is refused)."""

    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    key: models.TextField[str, str] = models.TextField()
    value: models.TextField[str, str] = models.TextField()

    class Meta:
        db_table = "anarchon_meta"
        verbose_name = "store fact"
        constraints = [models.UniqueConstraint(fields=["key"], name="anarchon_meta_key")]

    def __str__(self) -> str:
        return f"{self.key}={self.value}"
