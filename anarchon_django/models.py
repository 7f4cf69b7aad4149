"""The store of the Django ORM backend: the core SQL backends' tables, as Django models.

One schema: the tables are the core's own layout on each database (the SQLite store's,
the PostgreSQL store's, and the core's MySQL layout, which runs SQLite's statements),
with a surrogate ``id`` primary key for the admin, the core's keys being unique
constraints. This app's migrations run the core's statements that make them
(:func:`anarchon_core.backends.supply.layout`), and these models map them,
``managed = False``: Django never creates or alters them, and a change of the layout
is a change of the core's statements, run by a migration of this app. So
:mod:`anarchon_django.backend` runs the core backends' own statements on them, and a
core store pointed at the same database sees the same store.

The models map the columns every database's layout has (PostgreSQL's ``requested_by``,
who asked for a manual run, is not one: the SQLite statements keep that in
``fingerprint``). Times are epoch-millisecond integers of the database's clock, never
``DateTimeField``: leases are compared inside SQL, and a number compares the same on
every database. The models are for reading; the backend alone writes them.

:class:`KeyField`, :class:`DefinitionField` and :func:`exact_collation` are the fields
with which this app's former migrations (``0001_initial`` to ``0004``, kept for the
databases they made) created the key and definition columns on MySQL/MariaDB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Value

from anarchon_core.backends import mysql_layout
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
    (``docs/django.md``, "The store on MariaDB/MySQL"). Used by the former migrations
    only: the models map the core's layout, whose MySQL key columns are the same.
    """

    #: Characters of the ``VARCHAR`` on MySQL/MariaDB.
    #: Names and instance ids have at most 200 characters; 255 utf8mb4 characters are
    #: 1,020 bytes, so the widest key, ``(state, job)``, stays within InnoDB's 3,072.
    MYSQL_LENGTH = mysql_layout.KEY_LENGTH

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
    as written. It is never compared or indexed. Used by the former migrations only.
    """

    def db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        params: dict[str, Any] = dict(super().db_parameters(connection))
        if connection.vendor == "mysql":
            params["collation"] = exact_collation(connection)
        return params


def exact_collation(connection: Any) -> str:
    """The binary NO PAD utf8mb4 collation of the MySQL/MariaDB server of ``connection``."""
    return mysql_layout.exact_collation(mariadb=connection.mysql_is_mariadb)


class _Table(models.Model):
    """A surrogate ``id`` key (for the admin); ``shown`` formats ``str()`` of a row.

    Every model is ``managed = False``: its table is the core's (see the module). Its
    ``constraints`` are the core's key, the unique constraint ``<table>_key`` of every
    database's layout (Django reads them, e.g. the admin's changelist order needs no
    tiebreaker); the layout's indexes are not declared, they differ per database.
    """

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
    shown = "{job}@{slot}"

    class Meta:
        db_table = "anarchon_runs"
        verbose_name = "run"
        managed = False
        # The core's key, a unique constraint of every database's layout (the admin's
        # changelist orders by it, with no tiebreaker).
        constraints = [models.UniqueConstraint(fields=["job", "slot"], name="anarchon_runs_key")]


class HistoryRecord(_Table):
    """One attempt of a run (attempt 0: a slot that ran nothing, e.g. ``skipped``)."""

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
        managed = False
        constraints = [
            models.UniqueConstraint(
                fields=["job", "slot", "attempt"], name="anarchon_attempts_key"
            ),
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

    job: models.TextField[str, str] = models.TextField()
    paused: models.BooleanField[bool, bool] = models.BooleanField(default=False, db_default=False)
    version: models.BigIntegerField[int | None, int | None] = models.BigIntegerField(
        null=True, blank=True, help_text="the store's definitions counter at its last change"
    )
    definition: models.TextField[str | None, str | None] = models.TextField(
        null=True, blank=True, help_text="the stored job definition (JSON); none if removed"
    )
    shown = "{job}"

    class Meta:
        db_table = "anarchon_jobs"
        managed = False
        constraints = [models.UniqueConstraint(fields=["job"], name="anarchon_jobs_key")]


class Instance(_Table):
    """The instance registry: ``info`` is an ``InstanceInfo`` as JSON; expired rows are dead."""

    instance_id: models.TextField[str, str] = models.TextField()
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
        managed = False
        constraints = [
            models.UniqueConstraint(fields=["instance_id"], name="anarchon_instances_key")
        ]


class StoreMeta(_Table):
    """Facts about the store itself: its ``schema_version`` (a newer one is refused)."""

    key: models.TextField[str, str] = models.TextField()
    value: models.TextField[str, str] = models.TextField()
    shown = "{key}={value}"

    class Meta:
        db_table = "anarchon_meta"
        verbose_name = "store fact"
        managed = False
        constraints = [models.UniqueConstraint(fields=["key"], name="anarchon_meta_key")]
