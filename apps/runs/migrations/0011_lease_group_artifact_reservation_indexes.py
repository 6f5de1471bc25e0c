"""Lease.run, SamplingGroup.run, Artifact.trial and Reservation.node keep no index of their
own: a constraint or an index leads with each ((run, unit, fence), (run, step, position),
(trial, name), (node, status)). Only the indexes are dropped (each, and on PostgreSQL its
varchar_pattern_ops twin); the foreign keys are left as they are, since re-creating them
would re-check every row under a lock.

On PostgreSQL the LIKE twins of the other id indexes of these tables go too: no query
matches an id by prefix, and every trial inserts a lease, a reservation and its artifacts
and moves the lease and the reservation through their statuses (indexed, so not HOT: each
move wrote every index). Django's state has no word for these twins; altering one of these
fields later drops them with IF EXISTS."""

import django.db.models.deletion
from django.db import migrations, models

# index -> (table, column)
INDEXES = {
    "runs_lease_run_id_fdf9015a": ("runs_lease", "run_id"),
    "runs_samplinggroup_run_id_41aa4207": ("runs_samplinggroup", "run_id"),
    "runs_artifact_trial_id_5aafc198": ("runs_artifact", "trial_id"),
    "runs_reservation_node_id_c98acf2c": ("runs_reservation", "node_id"),
}
LIKE_TWINS = {
    "runs_lease_id_537d4169_like": ("runs_lease", "id"),
    "runs_lease_worker_id_957dcf48_like": ("runs_lease", "worker_id"),
    "runs_samplinggroup_id_2e5e6ca3_like": ("runs_samplinggroup", "id"),
    "runs_samplinggroup_actor_id_6bbbb5eb_like": ("runs_samplinggroup", "actor_id"),
    "runs_samplinggroup_task_version_id_6e75226e_like": ("runs_samplinggroup", "task_version_id"),
    "runs_artifact_id_2e42cb77_like": ("runs_artifact", "id"),
    "runs_artifact_object_id_4b938bed_like": ("runs_artifact", "object_id"),
    "runs_artifact_run_id_dfc12ac1_like": ("runs_artifact", "run_id"),
    "runs_reservation_lease_id_e961f2c1_like": ("runs_reservation", "lease_id"),
    "runs_reservation_trial_id_9d9353d1_like": ("runs_reservation", "trial_id"),
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
    for name, (table, column) in INDEXES.items():
        schema_editor.execute(f'CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" ("{column}")')
        if postgresql:
            schema_editor.execute(
                f'CREATE INDEX IF NOT EXISTS "{name}_like" ON "{table}" ("{column}" varchar_pattern_ops)'
            )
    for index, (table, column) in LIKE_TWINS.items() if postgresql else []:
        schema_editor.execute(f'CREATE INDEX IF NOT EXISTS "{index}" ON "{table}" ("{column}" varchar_pattern_ops)')


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0010_trial_run_group_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="artifact",
                    name="trial",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="artifacts",
                        to="runs.trial",
                    ),
                ),
                migrations.AlterField(
                    model_name="lease",
                    name="run",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="leases",
                        to="runs.run",
                    ),
                ),
                migrations.AlterField(
                    model_name="reservation",
                    name="node",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="reservations",
                        to="runs.workernode",
                    ),
                ),
                migrations.AlterField(
                    model_name="samplinggroup",
                    name="run",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="groups",
                        to="runs.run",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(drop_indexes, create_indexes)],
        ),
    ]
