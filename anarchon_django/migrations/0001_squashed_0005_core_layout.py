# One schema, for new installs: the store's tables are the core's layout of the
# database (anarchon_core.backends.supply.layout: the SQLite store's, the PostgreSQL
# store's or the core's MySQL/MariaDB layout, each with a surrogate id key for the
# admin), made by running the core's statements (CoreLayout, a RunSQL); the models map
# them (managed = False: their CreateModel changes no table).
#
# It replaces 0001_initial to 0005 (Django's squashing): a new database applies this
# one migration; a database that applied the former chain counts it as applied once it
# has applied 0005, which brings the tables the former migrations made to the same
# layout (with no manual step: `manage.py migrate`). The former 0001_initial_key_columns
# (it replaced 0001_initial on MySQL) is gone: every database that applied it recorded
# 0001_initial too. The replaced files stay until every database has applied them; a
# later release deletes them and this `replaces`.

from django.db import migrations, models

from anarchon_django._schema import CoreLayout


class Migration(migrations.Migration):
    initial = True

    replaces = [
        ("anarchon_django", "0001_initial"),
        ("anarchon_django", "0002_dashboard_permissions"),
        ("anarchon_django", "0003_exact_key_collation"),
        ("anarchon_django", "0004_job_definitions"),
        ("anarchon_django", "0005_core_layout"),
    ]

    dependencies = []

    operations = [
        CoreLayout(),
        migrations.CreateModel(
            name="HistoryRecord",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job", models.TextField()),
                ("slot", models.BigIntegerField(help_text="the scheduled time, epoch ms")),
                ("attempt", models.IntegerField()),
                (
                    "origin",
                    models.TextField(
                        choices=[
                            ("schedule", "schedule"),
                            ("catch_up", "catch_up"),
                            ("manual", "manual"),
                        ]
                    ),
                ),
                (
                    "status",
                    models.TextField(
                        choices=[
                            ("claimed", "claimed"),
                            ("running", "running"),
                            ("success", "success"),
                            ("failed", "failed"),
                            ("interrupted", "interrupted"),
                            ("skipped", "skipped"),
                            ("paused", "paused"),
                            ("cancelled", "cancelled"),
                        ]
                    ),
                ),
                ("instance_id", models.TextField(blank=True, null=True)),
                ("claimed_at", models.BigIntegerField(blank=True, help_text="epoch ms", null=True)),
                ("started_at", models.BigIntegerField(blank=True, help_text="epoch ms", null=True)),
                (
                    "finished_at",
                    models.BigIntegerField(blank=True, help_text="epoch ms", null=True),
                ),
                ("error", models.TextField(blank=True, null=True)),
                ("meta", models.JSONField(blank=True, db_default=models.Value("{}"), default=dict)),
            ],
            options={
                "verbose_name": "history record",
                "db_table": "anarchon_attempts",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("job", "slot", "attempt"), name="anarchon_attempts_key"
                    )
                ],
                "ordering": ["-slot", "-job", "-attempt"],
                "permissions": [
                    ("pause_job", "Can pause and resume jobs (dashboard)"),
                    ("trigger_job", "Can trigger a manual run of a job (dashboard)"),
                    ("cancel_run", "Can cancel a running run (dashboard)"),
                ],
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Instance",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("instance_id", models.TextField()),
                ("info", models.JSONField()),
                ("last_seen", models.BigIntegerField(help_text="epoch ms, the store's clock")),
                ("expires_at", models.BigIntegerField(help_text="epoch ms, the store's clock")),
            ],
            options={
                "db_table": "anarchon_instances",
                "constraints": [
                    models.UniqueConstraint(fields=("instance_id",), name="anarchon_instances_key")
                ],
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Job",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job", models.TextField()),
                ("paused", models.BooleanField(db_default=False, default=False)),
                (
                    "version",
                    models.BigIntegerField(
                        blank=True,
                        help_text="the store's definitions counter at its last change",
                        null=True,
                    ),
                ),
                (
                    "definition",
                    models.TextField(
                        blank=True,
                        help_text="the stored job definition (JSON); none if removed",
                        null=True,
                    ),
                ),
            ],
            options={
                "db_table": "anarchon_jobs",
                "constraints": [models.UniqueConstraint(fields=("job",), name="anarchon_jobs_key")],
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Run",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job", models.TextField()),
                ("slot", models.BigIntegerField(help_text="the scheduled time, epoch ms")),
                (
                    "origin",
                    models.TextField(
                        choices=[
                            ("schedule", "schedule"),
                            ("catch_up", "catch_up"),
                            ("manual", "manual"),
                        ]
                    ),
                ),
                ("state", models.TextField()),
                ("attempt", models.IntegerField()),
                ("token", models.TextField(blank=True, null=True)),
                ("lease_expires", models.BigIntegerField(db_default=0, default=0)),
                ("retry_at", models.BigIntegerField(db_default=0, default=0)),
                ("fingerprint", models.TextField(blank=True, db_default="", default="")),
            ],
            options={
                "verbose_name": "run",
                "db_table": "anarchon_runs",
                "constraints": [
                    models.UniqueConstraint(fields=("job", "slot"), name="anarchon_runs_key")
                ],
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="StoreMeta",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", models.TextField()),
                ("value", models.TextField()),
            ],
            options={
                "verbose_name": "store fact",
                "db_table": "anarchon_meta",
                "constraints": [models.UniqueConstraint(fields=("key",), name="anarchon_meta_key")],
                "managed": False,
            },
        ),
    ]
