"""Control API of the proxy (under /api/, scoped by organization): routes and interactions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.fields import IntegerField
from apps.core.pagination import IdCursorPagination
from apps.core.queries import QuerySerializer, query_read
from apps.core.serializers import ERRORS, paged
from apps.proxy import capture, selectors
from apps.proxy import serializers as bodies
from apps.proxy.credentials import interactive_credential_issue
from apps.proxy.models import Integrity, Interaction, ModelRoute


def route_dict(route: ModelRoute) -> dict[str, Any]:
    return {
        "name": route.name,
        "family": route.family,
        "context_window": route.context_window,
        "max_output": route.max_output,
        "trainable": route.trainable,
        "inference_enabled": route.inference_enabled,
        "aliases": list(route.aliases or []),
    }


def interaction_dict(interaction: Interaction) -> dict[str, Any]:
    return {
        "id": interaction.id,
        "run": interaction.run_id or None,
        "trial": interaction.trial_id or None,
        "principal": interaction.principal_kind,
        "correlation_id": interaction.correlation_id or None,
        "session_id": interaction.session_id or None,
        "agent_id": interaction.agent_id or None,
        "parent_agent_id": interaction.parent_agent_id or None,
        "route": interaction.route.name,
        "model_requested": interaction.model_requested,
        "snapshot": interaction.snapshot,
        "protocol": interaction.protocol,
        "stream": interaction.stream,
        "stop_reason": interaction.stop_reason or None,
        "parse_errors": interaction.parse_errors,
        "prompt_tokens": interaction.prompt_tokens,
        "output_tokens": interaction.output_tokens,
        "fitted": interaction.fitted,
        "timings": interaction.timings,
        "delivery": {
            "state": interaction.delivery,
            "error": interaction.delivery_error or None,
            "delivered_at": interaction.delivered_at,
        },
        "integrity": {
            "state": interaction.integrity,
            "sha256": interaction.payload_sha256 or None,
            "size": interaction.payload_size,
            "published_at": interaction.published_at,
            "verified_at": interaction.verified_at,
        },
        "eligibility": {"state": interaction.eligibility, "reason": interaction.eligibility_reason or None},
        "created_at": interaction.created_at,
    }


class ModelListApi(APIView):
    @extend_schema(
        responses={200: bodies.ModelRouteListSerializer, **ERRORS},
        description="Model routes: family, context window, max output, trainable.",
    )
    def get(self, request: Request) -> Response:
        return Response({"results": [route_dict(r) for r in selectors.route_list()]})


class InteractionListApi(APIView):
    class FilterSerializer(QuerySerializer):
        run = serializers.CharField(required=False)
        trial = serializers.CharField(required=False)

    @extend_schema(
        operation_id="api_interactions_list",
        parameters=[FilterSerializer],
        responses={200: paged(bodies.InteractionSerializer, name="Interactions"), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        filters = query_read(request=request, serializer=self.FilterSerializer)
        qs = selectors.interaction_list(
            org=request.auth.org,
            run_id=filters.get("run"),
            trial_id=filters.get("trial"),
        )
        paginator = IdCursorPagination()
        page = paginator.paginate_queryset(qs, request, view=self)
        return paginator.get_paginated_response([interaction_dict(i) for i in page])


class InteractionDetailApi(APIView):
    @extend_schema(
        responses={200: bodies.InteractionDetailSerializer, **ERRORS},
        description="One captured call. Once published, `payload.download` is a read grant for the token "
        "payload (canonical JSON, sha256 in `integrity`); before, `payload.inline` holds the staged payload.",
    )
    def get(self, request: Request, interaction_id: str) -> Response:
        from apps.objects.services import object_read_grant

        interaction = selectors.interaction_get(org=request.auth.org, interaction_id=interaction_id)
        data = interaction_dict(interaction)
        if interaction.integrity == Integrity.STAGED:
            inline = capture.staged_payload(interaction=interaction) if interaction.payload is not None else None
            data["payload"] = {"inline": inline, "download": None}
        else:
            grant = object_read_grant(org=request.auth.org, sha256=interaction.payload_sha256)
            data["payload"] = {
                "inline": None,
                "download": {
                    "url": grant.request.url,
                    "method": grant.request.method,
                    "expires_at": grant.request.expires_at,
                },
            }
        return Response(data)


class InteractiveCredentialCreateApi(APIView):
    """A model credential for an operator's interactive session (`synth claude`): scoped to
    one route of the caller's organization and short-lived, so the harness never holds the
    operator's API token. Viewers may not open model sessions."""

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "InteractiveCredentialInput"

        model = serializers.CharField(max_length=300)
        ttl_sec = IntegerField(required=False, min_value=60, max_value=7 * 24 * 3600, default=12 * 3600)

    @extend_schema(request=InputSerializer, responses={201: bodies.InteractiveCredentialSerializer, **ERRORS})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        issued = interactive_credential_issue(
            org=request.auth.org,
            user=request.user,
            model=data.validated_data["model"],
            ttl=timedelta(seconds=data.validated_data["ttl_sec"]),
        )
        return Response(issued, status=status.HTTP_201_CREATED)
