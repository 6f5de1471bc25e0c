"""Control API for learning: a train run's updates and checkpoints, and one checkpoint
with its lineage (thin: a selector, a page, a render)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.principal import Principal
from apps.core.pagination import IdCursorPagination
from apps.core.queries import QuerySerializer, query_read
from apps.core.serializers import ERRORS, paged
from apps.runs.apis import RunCollectionApi
from apps.runs.models import Run
from apps.training import selectors
from apps.training import serializers as bodies
from apps.training.models import Checkpoint, LearningUpdate


def checkpoint_dict(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "id": checkpoint.id,
        "run": checkpoint.run_id,
        "step": selectors.checkpoint_step(checkpoint=checkpoint),
        "backend": checkpoint.backend,
        "route": checkpoint.route,
        "base_model": checkpoint.base_model,
        "lora_rank": checkpoint.lora_rank,
        "snapshot": checkpoint.snapshot,
        "digest": f"sha256:{checkpoint.sha256}" if checkpoint.sha256 else None,
        "size": checkpoint.size,
        "has_state": bool(checkpoint.state_path),
        "exact_continuation": bool(checkpoint.state_path and checkpoint.resume),
        "milestone": checkpoint.milestone,
        "parent": checkpoint.parent_id,
        # What to put in a recipe to use these weights.
        "model": {"checkpoint": checkpoint.id},
        "created_at": checkpoint.created_at,
    }


def update_dict(update: LearningUpdate) -> dict[str, Any]:
    return {
        "id": update.id,
        "run": update.run_id,
        "step": update.step,
        "status": update.status,
        "sampler": update.sampler,
        "groups": update.groups,
        "datums": update.datums,
        "sampled_tokens": update.sampled_tokens,
        "metrics": update.metrics,
        "checkpoint": update.checkpoint_id,
        "error": update.error or None,
        "created_at": update.created_at,
        "finished_at": update.finished_at,
    }


@extend_schema_view(
    get=extend_schema(
        responses={200: paged(bodies.LearningUpdateSerializer, name="LearningUpdates"), **ERRORS},
        description="Learning updates of a train run, by step (from 0).",
    )
)
class RunUpdatesApi(RunCollectionApi):
    """Learning updates of a train run, by step."""

    def rows(self, *, run: Run, filters: dict[str, Any]) -> Any:
        return selectors.run_updates(run=run)

    def render(self, rows: list[Any], request: Request) -> list[dict[str, Any]]:
        return [update_dict(u) for u in rows]


@extend_schema_view(
    get=extend_schema(
        responses={200: paged(bodies.CheckpointSerializer, name="Checkpoints"), **ERRORS},
        description="Checkpoints a train run saved, by the step (from 0) whose update saved them.",
    )
)
class RunCheckpointsApi(RunCollectionApi):
    """Checkpoints a train run saved, by step."""

    def rows(self, *, run: Run, filters: dict[str, Any]) -> Any:
        return selectors.run_checkpoints(run=run)

    def render(self, rows: list[Any], request: Request) -> list[dict[str, Any]]:
        return [checkpoint_dict(c) for c in rows]


class CheckpointListApi(APIView):
    class FilterSerializer(QuerySerializer):
        run = serializers.CharField(required=False)

    @extend_schema(
        parameters=[FilterSerializer],
        responses={200: paged(bodies.CheckpointSerializer, name="OrgCheckpoints"), **ERRORS},
        description="The organization's checkpoints (optionally one run's), by the step (from 0) whose update saved them.",
    )
    def get(self, request: Request) -> Response:
        filters = query_read(request=request, serializer=self.FilterSerializer)
        principal = request.auth
        # IsMember (the default permission) only admits members, who always have an org.
        assert isinstance(principal, Principal) and principal.org is not None
        qs = selectors.checkpoint_list(org=principal.org, run_id=filters.get("run"))
        paginator = IdCursorPagination()
        page = paginator.paginate_queryset(qs, request, view=self) or []
        return paginator.get_paginated_response([checkpoint_dict(c) for c in page])


class CheckpointDetailApi(APIView):
    @extend_schema(
        responses={200: bodies.CheckpointDetailSerializer, **ERRORS},
        description="A checkpoint with its lineage: producing run and update, ancestors, runs that selected "
        "it, and the sampling groups sampled against it.",
    )
    def get(self, request: Request, checkpoint_id: str) -> Response:
        checkpoint = selectors.checkpoint_get(org=request.auth.org, checkpoint_id=checkpoint_id)
        return Response({**checkpoint_dict(checkpoint), "lineage": selectors.checkpoint_lineage(checkpoint=checkpoint)})
