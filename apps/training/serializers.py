"""The bodies of the learning API (updates, checkpoints, lineage), as serializers the
OpenAPI schema is generated from; they describe what apps.training.apis renders.

One numbering: a step is the index of an optimizer step, from 0. The groups sampled at
step N, the update of step N and the checkpoint that update saved all carry step N; the
checkpoint's weights hold N + 1 updates, and the groups of step N + 1 sample from it."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from apps.training.models import UpdateStatus


@extend_schema_serializer(component_name="ModelBinding")
class CheckpointModelSerializer(serializers.Serializer):
    checkpoint = serializers.CharField()


@extend_schema_serializer(component_name="Checkpoint")
class CheckpointSerializer(serializers.Serializer):
    id = serializers.CharField()
    run = serializers.CharField()
    step = serializers.IntegerField(
        help_text="the step whose update saved it, from 0 (its weights hold step + 1 updates)"
    )
    backend = serializers.CharField()
    route = serializers.CharField()
    base_model = serializers.CharField()
    lora_rank = serializers.IntegerField()
    snapshot = serializers.CharField()
    digest = serializers.CharField(allow_null=True, help_text="sha256:<hex> of the packed adapter")
    size = serializers.IntegerField(allow_null=True)
    has_state = serializers.BooleanField(help_text="the optimizer state was saved too (training can resume)")
    exact_continuation = serializers.BooleanField(
        help_text="the dataset cursor was saved too: a train run can continue it exactly (plan.continuation)"
    )
    milestone = serializers.BooleanField()
    parent = serializers.CharField(allow_null=True)  # type: ignore[assignment]  # a declared field: DRF's metaclass takes it off the class
    model = CheckpointModelSerializer(help_text="what to put in a recipe to use these weights")
    created_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="LearningUpdate")
class LearningUpdateSerializer(serializers.Serializer):
    id = serializers.CharField()
    run = serializers.CharField()
    step = serializers.IntegerField(help_text="from 0; the checkpoint it saved carries the same step")
    status = serializers.ChoiceField(choices=UpdateStatus.choices)
    sampler = serializers.JSONField(help_text="the model binding the step's groups sampled from")
    groups = serializers.JSONField()
    datums = serializers.IntegerField()
    sampled_tokens = serializers.IntegerField()
    metrics = serializers.JSONField(help_text="reward_mean, loss, grad_norm, kl, ... of the step")
    checkpoint = serializers.CharField(allow_null=True)
    error = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


@extend_schema_serializer(component_name="CheckpointRef")
class CheckpointRefSerializer(serializers.Serializer):
    id = serializers.CharField()
    run = serializers.CharField()
    step = serializers.IntegerField()


@extend_schema_serializer(component_name="CheckpointProducer")
class ProducerSerializer(serializers.Serializer):
    run = serializers.CharField()
    step = serializers.IntegerField()
    update = serializers.CharField(allow_null=True)  # type: ignore[assignment]  # a declared field: DRF's metaclass takes it off the class


@extend_schema_serializer(component_name="CheckpointLineage")
class LineageSerializer(serializers.Serializer):
    produced_by = ProducerSerializer()
    ancestors = CheckpointRefSerializer(many=True, help_text="parent first")
    selected_by_runs = serializers.ListField(child=serializers.CharField())
    sampled_groups = CheckpointRefSerializer(many=True, help_text="groups sampled against it (id, run, step)")


@extend_schema_serializer(component_name="CheckpointDetail")
class CheckpointDetailSerializer(CheckpointSerializer):
    lineage = LineageSerializer()
