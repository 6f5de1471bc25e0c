"""RunEvent.run keeps no index of its own: the (run, seq) unique constraint's index serves
every lookup by run. Only the two indexes are dropped (run_id, and on PostgreSQL its
varchar_pattern_ops twin for LIKE); the foreign key itself is left as it is, since
re-creating it would re-check every event of the largest table under a lock."""

from django.db import migrations, models
import django.db.models.deletion

INDEX = "runs_runevent_run_id_8bd13aa7"


def drop_indexes(apps, schema_editor):
    names = [INDEX, f"{INDEX}_like"] if schema_editor.connection.vendor == "postgresql" else [INDEX]
    for name in names:
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')


def create_indexes(apps, schema_editor):
    schema_editor.execute(f'CREATE INDEX IF NOT EXISTS "{INDEX}" ON "runs_runevent" ("run_id")')
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f'CREATE INDEX IF NOT EXISTS "{INDEX}_like" ON "runs_runevent" ("run_id" varchar_pattern_ops)'
        )


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0008_group_actor"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="runevent",
                    name="run",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="events",
                        to="runs.run",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(drop_indexes, create_indexes)],
        ),
    ]
