"""Control API for runs (thin: validate, call one service or selector, render)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from django.db import close_old_connections
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import renderers, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.permissions import IsWorker
from apps.accounts.principal import Principal
from apps.core.fields import ChoiceListField, IntegerField
from apps.core.inputs import query_int
from apps.core.pagination import IdCursorPagination, OldestFirstPagination
from apps.core.queries import QuerySerializer, query_read
from apps.core.serializers import ERRORS, ErrorSerializer, paged
from apps.runs import agreement, leases, selectors, services
from apps.runs import serializers as bodies
from apps.runs.models import (
    TERMINAL_STATUSES,
    GroupStatus,
    Lease,
    Run,
    RunEvent,
    RunKind,
    RunStatus,
    TrialStatus,
)


def _profile_ref(version: Any) -> dict[str, Any] | None:
    if version is None:
        return None
    return {
        "profile": version.profile.name,
        "version": version.version,
        "digest": version.digest,
    }


class RunOutputSerializer(serializers.Serializer):
    def to_representation(self, run: Run) -> dict[str, Any]:
        spec = getattr(run, "spec", None)
        return {
            "id": run.id,
            "kind": run.kind,
            "status": run.status,
            "dataset": spec.dataset_ref if spec else None,
            "dataset_digest": spec.dataset_digest if spec else None,
            "actor": _profile_ref(spec.actor_version) if spec else None,
            "actors": [{k: a[k] for k in ("profile", "version", "digest")} for a in spec.actors] if spec else [],
            "judge": _profile_ref(spec.judge_version) if spec else None,
            "model": spec.model_binding if spec else None,
            "judge_model": spec.judge_binding if spec else None,
            "plan": spec.plan if spec else None,
            "summary": run.summary,
            "error": run.error or None,
            "last_event_seq": run.last_event_seq,
            "created_at": run.created_at,
            "started_at": run.started_at,
            "finished_at": run.finished_at,
            "cancel_requested_at": run.cancel_requested_at,
        }


def event_dict(event: RunEvent) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "type": event.type,
        "data": event.data,
        "created_at": event.created_at.isoformat(),
    }


class RunListCreateApi(APIView):
    class FilterSerializer(QuerySerializer):
        status = ChoiceListField(choices=RunStatus.choices, required=False)
        kind = ChoiceListField(choices=RunKind.choices, required=False)

    @extend_schema(
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
        request=bodies.RunSubmitInputSerializer,
        responses={201: bodies.RunSerializer, 200: bodies.RunSerializer, 409: ErrorSerializer, **ERRORS},
        description="Submit a run. Same Idempotency-Key and body: 200 with the same run; another body: 409.",
    )
    def post(self, request: Request) -> Response:
        key = request.headers.get("Idempotency-Key") or f"auto-{uuid.uuid4()}"
        run, created = services.run_submit(
            org=request.auth.org,
            user=request.user,
            idempotency_key=key,
            body=request.data,
        )
        if not created:  # a new run comes back complete from run_submit
            run = selectors.run_get(org=request.auth.org, run_id=run.id)
        return Response(
            RunOutputSerializer(run).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(
        operation_id="api_runs_list",
        parameters=[FilterSerializer],
        responses={200: paged(bodies.RunSerializer, name="Runs"), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        filters = query_read(request=request, serializer=self.FilterSerializer)
        qs = selectors.run_list(org=request.auth.org, **filters)
        paginator = IdCursorPagination()
        page = paginator.paginate_queryset(qs, request, view=self)
        return paginator.get_paginated_response([RunOutputSerializer(r).data for r in page])


class RunDetailApi(APIView):
    @extend_schema(responses={200: bodies.RunSerializer, **ERRORS})
    def get(self, request: Request, run_id: str) -> Response:
        return Response(RunOutputSerializer(selectors.run_get(org=request.auth.org, run_id=run_id)).data)


class RunRegradeApi(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
        request=bodies.RunRegradeInputSerializer,
        responses={201: bodies.RunSerializer, 200: bodies.RunSerializer, 409: ErrorSerializer, **ERRORS},
        description='Re-assess a finished run\'s retained outputs with a judge: {"judge": {"profile", "version"}, '
        '"plan": {...}}. Creates a run of kind regrade (one trial per retained attempt). Same Idempotency-Key '
        "and body: 200 with the same run.",
    )
    def post(self, request: Request, run_id: str) -> Response:
        key = request.headers.get("Idempotency-Key") or f"auto-{uuid.uuid4()}"
        run, created = services.run_regrade(
            org=request.auth.org, user=request.user, run_id=run_id, idempotency_key=key, body=request.data
        )
        run = selectors.run_get(org=request.auth.org, run_id=run.id)
        return Response(
            RunOutputSerializer(run).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )


class RunCancelApi(APIView):
    @extend_schema(request=bodies.RunCancelInputSerializer, responses={200: bodies.RunSerializer, **ERRORS})
    def post(self, request: Request, run_id: str) -> Response:
        body = bodies.RunCancelInputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.run_cancel(org=request.auth.org, run_id=run_id, **body.validated_data)
        return Response(RunOutputSerializer(selectors.run_get(org=request.auth.org, run_id=run_id)).data)


class RunAgreementApi(APIView):
    @extend_schema(
        parameters=[bodies.AgreementQuerySerializer],
        responses={200: bodies.AgreementSerializer, **ERRORS},
        description="How far this run's assessments (A) agree with another's (B, `with`) on the same retained "
        "outputs: two regrades of one run, or a regrade and its source (the original verifier). Pass/fail at "
        "`threshold`; agreement rate, Cohen's kappa, confusion matrix and the attempts they disagree on.",
    )
    def get(self, request: Request, run_id: str) -> Response:
        query = query_read(request=request, serializer=bodies.AgreementQuerySerializer)
        principal = request.auth
        # IsMember (the default permission) admits only members, who always have an org.
        assert isinstance(principal, Principal) and principal.org is not None
        return Response(
            agreement.run_agreement(
                org=principal.org,
                run_id=run_id,
                other_id=query["with"],
                threshold=query.get("threshold"),
            )
        )


class EventStreamRenderer(renderers.BaseRenderer):
    """Lets `Accept: text/event-stream` (EventSource, SSE clients) negotiate; the stream
    itself is written by the view, and JSON pages are still JSON."""

    media_type = "text/event-stream"
    format = "sse"
    charset = None

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return json.dumps(data, default=str).encode()


class RunEventsApi(APIView):
    """Ordered events after a cursor. `follow=1` streams them as server-sent events (each
    with `id: <seq>`; reconnect with `Last-Event-ID` or `after` to resume with no gap and
    no duplicate) and ends after the run's last event; `wait=S` long-polls instead."""

    renderer_classes = [renderers.JSONRenderer, EventStreamRenderer]
    POLL_SECONDS = 0.25
    KEEPALIVE_SECONDS = 10.0

    class Query(QuerySerializer):
        paged = False  # pages by `after`, not by cursor
        after = IntegerField(required=False, min_value=0, default=0)
        limit = IntegerField(required=False, min_value=1, max_value=1000, default=200)
        follow = serializers.BooleanField(required=False, default=False)
        wait = serializers.FloatField(required=False, min_value=0, max_value=60, default=0)
        timeout = serializers.FloatField(required=False, min_value=1, max_value=3600, default=600)

    @extend_schema(
        parameters=[Query],
        responses={
            (200, "application/json"): bodies.RunEventsPageSerializer,
            (200, "text/event-stream"): OpenApiResponse(
                OpenApiTypes.STR,
                description="follow=1: `id: <seq>`, `event: <type>`, `data: <RunEvent JSON>` per event, "
                'then `event: end` with {"status", "after"}',
            ),
            **ERRORS,
        },
    )
    def get(self, request: Request, run_id: str) -> Response | StreamingHttpResponse:
        params = query_read(request=request, serializer=self.Query)
        after = params["after"]
        last_event_id = request.headers.get("Last-Event-ID")
        if last_event_id:
            after = max(after, query_int(last_event_id, name="Last-Event-ID", minimum=0))
        run = selectors.run_get(org=request.auth.org, run_id=run_id)
        if params["follow"]:
            response = StreamingHttpResponse(
                self._stream(
                    run_id=run.id,
                    org=request.auth.org,
                    after=after,
                    timeout=params["timeout"],
                ),
                content_type="text/event-stream",
            )
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"  # proxies must not buffer the stream
            return response
        events = selectors.run_events_after(run=run, after=after, limit=params["limit"])
        deadline = time.monotonic() + params["wait"]
        while not events and params["wait"] and time.monotonic() < deadline:
            run.refresh_from_db(fields=["status", "last_event_seq"])
            if run.status in TERMINAL_STATUSES and run.last_event_seq <= after:
                break
            time.sleep(self.POLL_SECONDS)
            events = selectors.run_events_after(run=run, after=after, limit=params["limit"])
        run.refresh_from_db(fields=["status", "last_event_seq"])
        last = events[-1].seq if events else after
        return Response(
            {
                "results": [event_dict(e) for e in events],
                "after": last,
                "has_more": run.last_event_seq > last,
                "run_status": run.status,
                "ended": run.status in TERMINAL_STATUSES and run.last_event_seq <= last,
            }
        )

    def _stream(self, *, run_id: str, org: Any, after: int, timeout: float) -> Iterator[bytes]:
        deadline = time.monotonic() + timeout
        last_sent = time.monotonic()
        yield b"retry: 1000\n\n"
        try:
            while True:
                run = Run.objects.filter(pk=run_id, org=org).only("status", "last_event_seq").get()
                events = list(RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:500])
                for event in events:
                    payload = json.dumps(event_dict(event), separators=(",", ":"))
                    yield f"id: {event.seq}\nevent: {event.type}\ndata: {payload}\n\n".encode()
                    after = event.seq
                    last_sent = time.monotonic()
                if events:
                    continue
                if run.status in TERMINAL_STATUSES and run.last_event_seq <= after:
                    yield f"event: end\ndata: {json.dumps({'status': run.status, 'after': after})}\n\n".encode()
                    return
                if time.monotonic() >= deadline:
                    return  # the client reconnects from its cursor
                if time.monotonic() - last_sent >= self.KEEPALIVE_SECONDS:
                    yield b": keepalive\n\n"
                    last_sent = time.monotonic()
                time.sleep(self.POLL_SECONDS)
        finally:
            close_old_connections()


# --------------------------------------------------------------------------- worker API


def lease_dict(lease: Lease) -> dict[str, Any]:
    return {
        "id": lease.id,
        "run": lease.run_id,
        "unit": lease.unit,
        "fence": lease.fence,
        "status": lease.status,
        "expires_at": lease.expires_at,
    }


class WorkerClaimApi(APIView):
    permission_classes = [IsWorker]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "WorkerClaimInput"  # one OpenAPI component per endpoint

        unit = serializers.CharField(required=False, default="run", max_length=100)

    @extend_schema(request=InputSerializer, responses={200: bodies.WorkerClaimSerializer, 204: None, **ERRORS})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        lease = leases.lease_claim(worker=request.auth.worker, unit=data.validated_data["unit"])
        if lease is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        run = Run.objects.select_related("spec", "spec__actor_version__profile", "spec__judge_version__profile").get(
            pk=lease.run_id
        )
        return Response({"lease": lease_dict(lease), "run": RunOutputSerializer(run).data})


class _LeaseApi(APIView):
    permission_classes = [IsWorker]


class WorkerHeartbeatApi(_LeaseApi):
    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "WorkerHeartbeatInput"  # one OpenAPI component per endpoint

        fence = IntegerField(min_value=1)

    @extend_schema(request=InputSerializer, responses={200: bodies.WorkerHeartbeatSerializer, **ERRORS})
    def post(self, request: Request, lease_id: str) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        result = leases.lease_heartbeat(worker=request.auth.worker, lease_id=lease_id, **data.validated_data)
        return Response(
            {
                "expires_at": result.expires_at,
                "cancel_requested": result.cancel_requested,
            }
        )


class WorkerReportApi(_LeaseApi):
    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "WorkerReportInput"  # one OpenAPI component per endpoint

        fence = IntegerField(min_value=1)
        local_seq = IntegerField(min_value=0)
        events = serializers.ListField(child=serializers.DictField(), max_length=1000)

    @extend_schema(request=InputSerializer, responses={200: bodies.WorkerReportSerializer, **ERRORS})
    def post(self, request: Request, lease_id: str) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        applied = leases.lease_report(worker=request.auth.worker, lease_id=lease_id, **data.validated_data)
        return Response({"applied": applied})


class WorkerCompleteApi(_LeaseApi):
    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "WorkerCompleteInput"  # one OpenAPI component per endpoint

        fence = IntegerField(min_value=1)
        outcome = serializers.ChoiceField(choices=["succeeded", "failed", "cancelled"])
        summary = serializers.DictField(required=False, default=dict)
        error = serializers.CharField(required=False, default="", allow_blank=True, max_length=10_000)

    @extend_schema(request=InputSerializer, responses={200: bodies.LeaseOutcomeSerializer, **ERRORS})
    def post(self, request: Request, lease_id: str) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        run = leases.lease_complete(worker=request.auth.worker, lease_id=lease_id, **data.validated_data)
        return Response({"run": run.id, "status": run.status})


class WorkerReleaseApi(_LeaseApi):
    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "WorkerReleaseInput"  # one OpenAPI component per endpoint

        fence = IntegerField(min_value=1)
        reason = serializers.CharField(required=False, default="", allow_blank=True, max_length=1000)

    @extend_schema(request=InputSerializer, responses={200: bodies.LeaseOutcomeSerializer, **ERRORS})
    def post(self, request: Request, lease_id: str) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        run = leases.lease_release(worker=request.auth.worker, lease_id=lease_id, **data.validated_data)
        return Response({"run": run.id, "status": run.status})


# --------------------------------------------------------------------------- groups, trials, artifacts


def group_dict(group: Any) -> dict[str, Any]:
    return {
        "id": group.id,
        "step": group.step,
        "position": group.position,
        "task": group.task_version.name,
        "task_version_id": group.task_version_id,
        "attempts": group.attempts,
        "sampler": group.sampler,
        "actor": _profile_ref(group.actor),
        "status": group.status,
        "summary": group.summary,
        "created_at": group.created_at,
        "settled_at": group.settled_at,
    }


def trial_dict(trial: Any) -> dict[str, Any]:
    return {
        "id": trial.id,
        "group": trial.group_id,
        "task": trial.task_version.name,
        "task_version_id": trial.task_version_id,
        "attempt": trial.attempt,
        "source": trial.source_id,  # a regrade's: the attempt re-assessed
        "status": trial.status,
        "reward": trial.reward,
        "rewards": trial.rewards,
        "error": {"type": trial.error_type, "message": trial.error_message} if trial.error_type else None,
        "timings": trial.timings,
        "need": trial.need,
        "tries": trial.tries,
        "worker_node": trial.worker_node or None,
        "created_at": trial.created_at,
        "started_at": trial.started_at,
        "finished_at": trial.finished_at,
    }


class RunCollectionApi(APIView):
    """A paged list of one run's records, oldest first, with optional filters."""

    class FilterSerializer(QuerySerializer):
        pass

    def rows(self, *, run: Run, filters: dict[str, Any]) -> Any:
        raise NotImplementedError

    def render(self, rows: list[Any], request: Request) -> list[dict[str, Any]]:
        raise NotImplementedError

    def get(self, request: Request, run_id: str) -> Response:
        filters = query_read(request=request, serializer=self.FilterSerializer)
        run = selectors.run_get(org=request.auth.org, run_id=run_id)
        paginator = OldestFirstPagination()
        page = paginator.paginate_queryset(self.rows(run=run, filters=filters), request, view=self)
        return paginator.get_paginated_response(self.render(list(page), request))


class RunGroupsApi(RunCollectionApi):
    class FilterSerializer(QuerySerializer):
        step = IntegerField(required=False, min_value=0, help_text="the training step whose batch made the group")
        status = ChoiceListField(choices=GroupStatus.choices, required=False)

    def rows(self, *, run: Run, filters: dict[str, Any]) -> Any:
        return selectors.group_list(run=run, **filters)

    @extend_schema(
        parameters=[FilterSerializer],
        responses={200: paged(bodies.GroupSerializer, name="SamplingGroups"), **ERRORS},
    )
    def get(self, request: Request, run_id: str) -> Response:
        return super().get(request, run_id)

    def render(self, rows: list[Any], request: Request) -> list[dict[str, Any]]:
        return [group_dict(g) for g in rows]


class RunTrialsApi(RunCollectionApi):
    class FilterSerializer(QuerySerializer):
        status = ChoiceListField(choices=TrialStatus.choices, required=False)

    def rows(self, *, run: Run, filters: dict[str, Any]) -> Any:
        return selectors.trial_list(run=run, **filters)

    def render(self, rows: list[Any], request: Request) -> list[dict[str, Any]]:
        return [trial_dict(t) for t in rows]

    @extend_schema(
        parameters=[FilterSerializer], responses={200: paged(bodies.TrialSerializer, name="Trials"), **ERRORS}
    )
    def get(self, request: Request, run_id: str) -> Response:
        return super().get(request, run_id)


class TrialDetailApi(APIView):
    @extend_schema(
        responses={200: bodies.TrialDetailSerializer, **ERRORS},
        description="One trial (as in a run's trial list) with its run id.",
    )
    def get(self, request: Request, trial_id: str) -> Response:
        principal = request.auth
        # IsMember (the default permission) only admits members, who always have an org.
        assert isinstance(principal, Principal) and principal.org is not None
        trial = selectors.trial_get(org=principal.org, trial_id=trial_id)
        return Response({**trial_dict(trial), "run": trial.run_id})


class RunArtifactsApi(RunCollectionApi):
    """Artifacts with their digest, size and a time-limited download grant."""

    class FilterSerializer(QuerySerializer):
        trial = serializers.CharField(required=False)

    def rows(self, *, run: Run, filters: dict[str, Any]) -> Any:
        return selectors.artifact_list(run=run, trial_id=filters.get("trial"))

    @extend_schema(
        parameters=[FilterSerializer], responses={200: paged(bodies.ArtifactSerializer, name="Artifacts"), **ERRORS}
    )
    def get(self, request: Request, run_id: str) -> Response:
        return super().get(request, run_id)

    def render(self, rows: list[Any], request: Request) -> list[dict[str, Any]]:
        from apps.objects.services import object_read_grant

        items = []
        for artifact in rows:
            grant = object_read_grant(org=request.auth.org, sha256=artifact.sha256)
            items.append(
                {
                    "id": artifact.id,
                    "trial": artifact.trial_id,
                    "name": artifact.name,
                    # Unique within the run: what a download writes to (DIR/<path>).
                    "path": f"{artifact.trial_id}/{artifact.name}" if artifact.trial_id else artifact.name,
                    "kind": artifact.kind,
                    "digest": f"sha256:{artifact.sha256}",
                    "size": artifact.size,
                    "created_at": artifact.created_at,
                    "download": {
                        "url": grant.request.url,
                        "method": grant.request.method,
                        "expires_at": grant.request.expires_at,
                    },
                }
            )
        return items
