# The core's keys compare byte for byte: PostgreSQL's core layout declares its key text
# columns COLLATE "C" (the history index and its cursor order, and no locale rules on
# job names). Django's TextField has no per-database collation, so it is set here, on
# PostgreSQL only; SQLite's default collation (BINARY) already compares bytes.

from typing import Any

from django.db import migrations

#: The key text columns of each table, as the core's layout declares them.
KEY_COLUMNS = {
    "anarchon_runs": ("job",),
    "anarchon_attempts": ("job",),
    "anarchon_jobs": ("job",),
    "anarchon_instances": ("instance_id",),
}


def exact(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    for table, columns in KEY_COLUMNS.items():
        for column in columns:
            schema_editor.execute(
                f'ALTER TABLE {quote(table)} ALTER COLUMN {quote(column)} TYPE text COLLATE "C"'
            )


def default(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    for table, columns in KEY_COLUMNS.items():
        for column in columns:
            schema_editor.execute(
                f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(column)} TYPE text "
                f'COLLATE "default"'
            )


class Migration(migrations.Migration):
    dependencies = [("anarchon_django", "0002_dashboard_permissions")]

    operations = [migrations.RunPython(exact, default)]
