# Job definitions kept in the store: anarchon_jobs gets the columns the core stores'
# layouts add (version bigint, definition text), both nullable, so adding them rewrites
# no row and an older anarchon sharing the tables keeps working. On MySQL/MariaDB the
# definition is longtext in utf8mb4 (DefinitionField), whatever the table's default.
# The counter of definition changes is a row of anarchon_meta, written by the store.

from django.db import migrations, models

import anarchon_django.models


class Migration(migrations.Migration):
    dependencies = [("anarchon_django", "0003_exact_key_collation")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="version",
            field=models.BigIntegerField(
                blank=True,
                help_text="the store's definitions counter at its last change",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="definition",
            field=anarchon_django.models.DefinitionField(
                blank=True,
                help_text="the stored job definition (JSON); none if removed",
                null=True,
            ),
        ),
    ]
