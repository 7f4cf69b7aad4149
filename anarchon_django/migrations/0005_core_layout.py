# One schema, for databases the former migrations made: their tables (Django's
# CreateModel) become the core's layout of the database, which new installs get from
# 0001_squashed_0005_core_layout, and the models map them (managed = False).
#
# The tables already have the layout's columns and keys (tests/django/test_schema_source
# compared them); CoreLayout(upgrade=True) replaces the indexes the core lays out
# otherwise (anarchon_runs_open; on SQLite, no anarchon_runs_pending), sets
# PostgreSQL's fill factors, drops the requested_by column that the SQLite statements
# (run on SQLite and MySQL/MariaDB) never write, then runs the core's layout, which adds
# the indexes the tables lack. No table is recreated and no row rewritten. The state
# then forgets what the layout now owns (its indexes, which differ per database; the
# core's keys stay, constraints of every layout): it is the squashed migration's.

from django.db import migrations, models

from anarchon_django._schema import CoreLayout

_HISTORY_OPTIONS = {
    "managed": False,
    "ordering": ["-slot", "-job", "-attempt"],
    "permissions": [
        ("pause_job", "Can pause and resume jobs (dashboard)"),
        ("trigger_job", "Can trigger a manual run of a job (dashboard)"),
        ("cancel_run", "Can cancel a running run (dashboard)"),
    ],
    "verbose_name": "history record",
}


class Migration(migrations.Migration):
    dependencies = [("anarchon_django", "0004_job_definitions")]

    operations = [
        CoreLayout(upgrade=True),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterModelOptions(name="historyrecord", options=_HISTORY_OPTIONS),
                migrations.AlterModelOptions(name="instance", options={"managed": False}),
                migrations.AlterModelOptions(name="job", options={"managed": False}),
                migrations.AlterModelOptions(
                    name="run", options={"managed": False, "verbose_name": "run"}
                ),
                migrations.AlterModelOptions(
                    name="storemeta", options={"managed": False, "verbose_name": "store fact"}
                ),
                migrations.RemoveConstraint(model_name="run", name="anarchon_runs_pending"),
                migrations.RemoveIndex(model_name="run", name="anarchon_runs_open"),
                migrations.RemoveIndex(
                    model_name="historyrecord", name="anarchon_attempts_history"
                ),
                migrations.RemoveField(model_name="run", name="requested_by"),
                migrations.AlterField(
                    model_name="job",
                    name="definition",
                    field=models.TextField(
                        blank=True,
                        help_text="the stored job definition (JSON); none if removed",
                        null=True,
                    ),
                ),
            ]
        ),
    ]
