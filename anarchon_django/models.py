"""The store of the Django ORM backend: the core SQL backends' tables, as Django models.

The tables carry the core's names and columns, so :mod:`anarchon_django.backend` runs
the core backends' own statements on them and a core store pointed at the same
database sees the same store. For the admin, every table has a surrogate ``id`` key and
the core's keys are unique constraints. Times are epoch-millisecond integers of the
database's clock, never ``DateTimeField``: leases are compared inside SQL, and a number
compares the same on every database. The models are for reading; the backend alone
writes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Q, Value

from anarchon_core.records import Origin, RunRecord, Status

__all__ = ["DefinitionField", "HistoryRecord", "Instance", "Job", "KeyField", "Run", "StoreMeta"]

_STATUSES = [(status.value, status.value) for status in Status]
_ORIGINS = [(origin.value, origin.value) for origin in Origin]

if TYPE_CHECKING:
    _TextField = models.TextField[Any, Any]
else:  # Django's fields are generic in django-stubs only
    _TextField = models.TextField


class KeyField(_TextField):
    """A key text column (a job, a token, an instance id): ``TextField`` on SQLite and
    PostgreSQL; on MySQL/MariaDB a ``VARCHAR(255)`` (InnoDB indexes no whole ``TEXT``)
    in a binary NO PAD collation, so keys compare byte for byte as in the core's stores
    (``docs/django.md``, "The store on MariaDB/MySQL").
    """

    #: Characters of the ``VARCHAR`` on MySQL/MariaDB.
    #: Names and instance ids have at most 200 characters; 255 utf8mb4 characters are
    #: 1,020 bytes, so the widest key, ``(state, job)``, stays within InnoDB's 3,072.
    MYSQL_LENGTH = 255

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        if connection.vendor == "mysql":
            return f"varchar({self.MYSQL_LENGTH})"
        return super().db_type(connection)

    def db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        params: dict[str, Any] = dict(super().db_parameters(connection))
        if connection.vendor == "mysql":
            params["collation"] = exact_collation(connection)
        return params


class DefinitionField(_TextField):
    """A stored job definition's JSON text: ``TextField`` everywhere (``longtext`` on
    MySQL/MariaDB), there in utf8mb4 (the binary collation of :class:`KeyField`) whatever
    the database's default character set, so that any text a definition holds is kept
    as written. It is never compared or indexed.
    """

    def db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        params: dict[str, Any] = dict(super().db_parameters(connection))
        if connection.vendor == "mysql":
            params["collation"] = exact_collation(connection)
        return params


def exact_collation(connection: Any) -> str:
    """The binary NO PAD utf8mb4 collation of the MySQL/MariaDB server of ``connection``."""
    return "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"


class _Table(models.Model):
    """A surrogate ``id`` key (for the admin); ``shown`` formats ``str()`` of a row."""

    id: models.BigAutoField[int, int] = models.BigAutoField(primary_key=True)
    shown = "{id}"

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return self.shown.format(**{f.attname: getattr(self, f.attname) for f in self._meta.fields})


class Run(_Table):
    """The run of ``(job, slot)``: the row every instance contends for.

    ``state`` is ``pending`` (a manual request), ``running``, ``waiting`` (a failed
    attempt whose retry is due later) or the terminal status the run ended with.
    """

    job: models.TextField[str, str] = KeyField()
    slot: models.BigIntegerField[int, int] = models.BigIntegerField(
        help_text="the scheduled time, epoch ms"
    )
    origin: models.TextField[str, str] = models.TextField(choices=_ORIGINS)
    state: models.TextField[str, str] = KeyField()
    attempt: models.IntegerField[int, int] = models.IntegerField()
    token: models.TextField[str | None, str | None] = KeyField(null=True, blank=True)
    lease_expires: models.BigIntegerField[int, int] = models.BigIntegerField(
        default=0, db_default=0
    )
    retry_at: models.BigIntegerField[int, int] = models.BigIntegerField(default=0, db_default=0)
    fingerprint: models.TextField[str, str] = models.TextField(
        default="", db_default="", blank=True
    )
    requested_by: models.TextField[str | None, str | None] = models.TextField(null=True, blank=True)
    shown = "{job}@{slot}"

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


class HistoryRecord(_Table):
    """One attempt of a run (attempt 0: a slot that ran nothing, e.g. ``skipped``)."""

    job: models.TextField[str, str] = KeyField()
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
    shown = "{job}@{slot}#{attempt} {status}"

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

    def to_record(self) -> RunRecord:
        """This row as the core's record (durations, JSON: as every surface shows it)."""
        return RunRecord(
            *(self.job, self.slot, self.attempt, Origin(self.origin), Status(self.status)),
            *(self.instance_id, self.claimed_at, self.started_at, self.finished_at),
            error=self.error,
            meta=self.meta,
        )


class Job(_Table):
    """A job's state shared by every instance: whether it is paused, and its definition
    if it is kept in the store.

    ``version`` is the store's counter of definition changes (``anarchon_meta``'s
    ``definitions_version``) at this definition's last change; ``definition`` its JSON
    text. A removed definition keeps its version with no text, so that every replica
    learns of the removal; a job never defined in the store has neither.
    """

    job: models.TextField[str, str] = KeyField()
    paused: models.BooleanField[bool, bool] = models.BooleanField(default=False, db_default=False)
    version: models.BigIntegerField[int | None, int | None] = models.BigIntegerField(
        null=True, blank=True, help_text="the store's definitions counter at its last change"
    )
    definition: models.TextField[str | None, str | None] = DefinitionField(
        null=True, blank=True, help_text="the stored job definition (JSON); none if removed"
    )
    shown = "{job}"

    class Meta:
        db_table = "anarchon_jobs"
        constraints = [models.UniqueConstraint(fields=["job"], name="anarchon_jobs_key")]


class Instance(_Table):
    """The instance registry: ``info`` is an ``InstanceInfo`` as JSON; expired rows are dead."""

    instance_id: models.TextField[str, str] = KeyField()
    info = models.JSONField()
    last_seen: models.BigIntegerField[int, int] = models.BigIntegerField(
        help_text="epoch ms, the store's clock"
    )
    expires_at: models.BigIntegerField[int, int] = models.BigIntegerField(
        help_text="epoch ms, the store's clock"
    )
    shown = "{instance_id}"

    class Meta:
        db_table = "anarchon_instances"
        constraints = [
            models.UniqueConstraint(fields=["instance_id"], name="anarchon_instances_key")
        ]


class StoreMeta(_Table):
    """Facts about the store itself: its ``schema_version`` (a newer one is refused)."""

    key: models.TextField[str, str] = KeyField()
    value: models.TextField[str, str] = models.TextField()
    shown = "{key}={value}"

    class Meta:
        db_table = "anarchon_meta"
        verbose_name = "store fact"
        constraints = [models.UniqueConstraint(fields=["key"], name="anarchon_meta_key")]
