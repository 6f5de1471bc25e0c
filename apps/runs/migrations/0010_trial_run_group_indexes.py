"""Trial.run and Trial.group keep no index of their own: (run, status) and the (group,
attempt) unique constraint lead with them. Only the indexes are dropped (each, and on
PostgreSQL its varchar_pattern_ops twin); the foreign keys are left as they are, since
re-creating them would re-check every trial under a lock.

On PostgreSQL the LIKE twins of the id, task_version_id and source_id indexes go too: no
query matches an id by prefix, and a trial's status changes (not HOT: status is indexed)
wrote every index. Django's state has no word for these twins; altering one of these
fields later drops them with IF EXISTS."""

import django.db.models.deletion
from django.db import migrations, models

INDEXES = {"runs_trial_run_id_a99b1b75": "run_id", "runs_trial_group_id_8ffa6d2a": "group_id"}
LIKE_TWINS = {
    "runs_trial_id_4c982521_like": "id",
    "runs_trial_task_version_id_3632d87f_like": "task_version_id",
    "runs_trial_source_id_6939b1d5_like": "source_id",
}


def drop_indexes(apps, schema_editor):
    postgresql = schema_editor.connection.vendor == "postgresql"
    for name in INDEXES:
        for index in [name, f"{name}_like"] if postgresql else [name]:
            schema_editor.execute(f'DROP INDEX IF EXISTS "{index}"')
    for index in LIKE_TWINS if postgresql else []:
        schema_editor.execute(f'DROP INDEX IF EXISTS "{index}"')


def create_indexes(apps, schema_editor):
    postgresql = schema_editor.connection.vendor == "postgresql"
    for name, column in INDEXES.items():
        schema_editor.execute(f'CREATE INDEX IF NOT EXISTS "{name}" ON "runs_trial" ("{column}")')
        if postgresql:
            schema_editor.execute(
                f'CREATE INDEX IF NOT EXISTS "{name}_like" ON "runs_trial" ("{column}" varchar_pattern_ops)'
            )
    for index, column in LIKE_TWINS.items() if postgresql else []:
        schema_editor.execute(f'CREATE INDEX IF NOT EXISTS "{index}" ON "runs_trial" ("{column}" varchar_pattern_ops)')


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0009_runevent_run_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="trial",
                    name="group",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="trials",
                        to="runs.samplinggroup",
                    ),
                ),
                migrations.AlterField(
                    model_name="trial",
                    name="run",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="trials",
                        to="runs.run",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(drop_indexes, create_indexes)],
        ),
    ]
