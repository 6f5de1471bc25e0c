"""The bodies of the proxy's control API (/api: models, interactions, model credentials),
as serializers the OpenAPI schema is generated from; they describe what apps.proxy.apis
renders."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers


@extend_schema_serializer(component_name="ModelRoute")
class ModelRouteSerializer(serializers.Serializer):
    name = serializers.CharField()
    family = serializers.CharField(help_text="the adapter family, e.g. qwen3")
    context_window = serializers.IntegerField()
    max_output = serializers.IntegerField()
    trainable = serializers.BooleanField()
    inference_enabled = serializers.BooleanField()
    aliases = serializers.ListField(child=serializers.CharField())


@extend_schema_serializer(component_name="ModelRoutes")
class ModelRouteListSerializer(serializers.Serializer):
    results = ModelRouteSerializer(many=True)


@extend_schema_serializer(component_name="InteractionDelivery")
class DeliverySerializer(serializers.Serializer):
    state = serializers.CharField()
    error = serializers.CharField(allow_null=True)
    delivered_at = serializers.DateTimeField(allow_null=True)


@extend_schema_serializer(component_name="InteractionIntegrity")
class IntegritySerializer(serializers.Serializer):
    state = serializers.CharField(help_text="staged, published, verified, ...")
    sha256 = serializers.CharField(allow_null=True, help_text="of the published token payload")
    size = serializers.IntegerField(allow_null=True)
    published_at = serializers.DateTimeField(allow_null=True)
    verified_at = serializers.DateTimeField(allow_null=True)


@extend_schema_serializer(component_name="InteractionEligibility")
class EligibilitySerializer(serializers.Serializer):
    state = serializers.CharField(help_text="whether training may use the call")
    reason = serializers.CharField(allow_null=True)


@extend_schema_serializer(component_name="Interaction")
class InteractionSerializer(serializers.Serializer):
    id = serializers.CharField()
    run = serializers.CharField(allow_null=True)
    trial = serializers.CharField(allow_null=True)
    principal = serializers.CharField(help_text="who called: a trial's credential, an interactive session, ...")
    correlation_id = serializers.CharField(allow_null=True)
    session_id = serializers.CharField(allow_null=True)
    agent_id = serializers.CharField(allow_null=True)
    parent_agent_id = serializers.CharField(allow_null=True)
    route = serializers.CharField()
    model_requested = serializers.CharField()
    snapshot = serializers.CharField()
    protocol = serializers.CharField(help_text="the wire protocol of the call: messages, chat or responses")
    stream = serializers.BooleanField()
    stop_reason = serializers.CharField(allow_null=True)
    parse_errors = serializers.ListField(child=serializers.JSONField())
    prompt_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    fitted = serializers.BooleanField(help_text="content was omitted to fit the context window")
    timings = serializers.JSONField()
    delivery = DeliverySerializer()
    integrity = IntegritySerializer()
    eligibility = EligibilitySerializer()
    created_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="InteractionPayloadGrant")
class PayloadGrantSerializer(serializers.Serializer):
    url = serializers.CharField()
    method = serializers.CharField()
    expires_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="InteractionPayload")
class PayloadSerializer(serializers.Serializer):
    inline = serializers.JSONField(allow_null=True, help_text="the staged payload, before it is published")
    download = PayloadGrantSerializer(allow_null=True, help_text="a read grant once published")


@extend_schema_serializer(component_name="InteractionDetail")
class InteractionDetailSerializer(InteractionSerializer):
    payload = PayloadSerializer()


@extend_schema_serializer(component_name="InteractiveCredential")
class InteractiveCredentialSerializer(serializers.Serializer):
    credential = serializers.CharField(help_text="shown once; the x-api-key for /v1")
    route = serializers.CharField()
    checkpoint = serializers.CharField(allow_null=True)
    family = serializers.CharField()
    base_url = serializers.CharField()
    session = serializers.CharField()
    expires_at = serializers.DateTimeField()
