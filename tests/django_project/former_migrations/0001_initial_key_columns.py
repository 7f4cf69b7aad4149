# The initial layout again, replacing 0001_initial (Django's squashing mechanism): the key
# text columns (job names, the run's state and token, instance ids, the meta key) are
# anarchon_django.models.KeyField. On SQLite and PostgreSQL that field is Django's
# TextField to the byte, so the tables are exactly 0001's, and a database that applied
# 0001 counts this one as applied too (nothing runs). On MySQL/MariaDB it is a
# binary-collated VARCHAR(255): 0001 cannot run there (InnoDB indexes no TEXT column
# without a prefix length: "Specified key was too long" on MariaDB, error 1170 on MySQL),
# and its default collations would make jobs "Report" and "report" one run.
#
# 0001 stays for the databases that applied it; 0002 and 0003 follow either one.

from django.db import migrations, models

import anarchon_django.models


class Migration(migrations.Migration):
    initial = True

    replaces = [("anarchon_django", "0001_initial")]

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="HistoryRecord",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job", anarchon_django.models.KeyField()),
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
                "ordering": ["-slot", "-job", "-attempt"],
                "indexes": [
                    models.Index(
                        fields=["-slot", "-job", "-attempt"], name="anarchon_attempts_history"
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("job", "slot", "attempt"), name="anarchon_attempts_key"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="Instance",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("instance_id", anarchon_django.models.KeyField()),
                ("info", models.JSONField()),
                ("last_seen", models.BigIntegerField(help_text="epoch ms, the store's clock")),
                ("expires_at", models.BigIntegerField(help_text="epoch ms, the store's clock")),
            ],
            options={
                "db_table": "anarchon_instances",
                "constraints": [
                    models.UniqueConstraint(fields=("instance_id",), name="anarchon_instances_key")
                ],
            },
        ),
        migrations.CreateModel(
            name="Job",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job", anarchon_django.models.KeyField()),
                ("paused", models.BooleanField(db_default=False, default=False)),
            ],
            options={
                "db_table": "anarchon_jobs",
                "constraints": [models.UniqueConstraint(fields=("job",), name="anarchon_jobs_key")],
            },
        ),
        migrations.CreateModel(
            name="Run",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job", anarchon_django.models.KeyField()),
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
                ("state", anarchon_django.models.KeyField()),
                ("attempt", models.IntegerField()),
                ("token", anarchon_django.models.KeyField(blank=True, null=True)),
                ("lease_expires", models.BigIntegerField(db_default=0, default=0)),
                ("retry_at", models.BigIntegerField(db_default=0, default=0)),
                ("fingerprint", models.TextField(blank=True, db_default="", default="")),
                ("requested_by", models.TextField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "run",
                "db_table": "anarchon_runs",
                "indexes": [models.Index(fields=["state", "job"], name="anarchon_runs_open")],
                "constraints": [
                    models.UniqueConstraint(fields=("job", "slot"), name="anarchon_runs_key"),
                ],
            },
        ),
        # Added apart from CreateModel: on MySQL, which has no partial indexes, Django 5.2's
        # create_model() queues the SQL of an unsupported constraint (None) and runs it
        # ("syntax error near 'None'"); AddConstraint skips it. Elsewhere the same index.
        migrations.AddConstraint(
            model_name="run",
            constraint=models.UniqueConstraint(
                condition=models.Q(("state", "pending")),
                fields=("job",),
                name="anarchon_runs_pending",
            ),
        ),
        migrations.CreateModel(
            name="StoreMeta",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", anarchon_django.models.KeyField()),
                ("value", models.TextField()),
            ],
            options={
                "verbose_name": "store fact",
                "db_table": "anarchon_meta",
                "constraints": [models.UniqueConstraint(fields=("key",), name="anarchon_meta_key")],
            },
        ),
    ]
