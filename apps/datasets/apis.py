"""Thin REST views over datasets and task versions; logic lives in services/selectors."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from apps.accounts.models import Organization
from apps.accounts.principal import Principal
from apps.core.errors import NotFound
from apps.core.inputs import query_int
from apps.core.pagination import IdCursorPagination
from apps.core.queries import PageQuery, query_read
from apps.core.serializers import ERRORS, paged
from apps.datasets import selectors, services
from apps.datasets.models import DatasetVersion, TaskVersion

TASKS_PAGE_SIZE = 50
TASKS_MAX_PAGE_SIZE = 500
LOCAL_UNSUPPORTED_LISTED = 100


def _org(request: Request) -> Organization:
    # IsMember (the default permission) admits only organization members, never workers.
    principal: Principal = request.auth
    assert principal.org is not None
    return principal.org


def _int_param(request: Request, name: str, default: int, *, minimum: int, maximum: int | None = None) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    value = query_int(raw, name=name, minimum=minimum)
    return min(value, maximum) if maximum is not None else value


_PAGE_PARAMETERS = [
    OpenApiParameter("cursor", OpenApiTypes.INT, description="position of the first task on the page"),
    OpenApiParameter("limit", OpenApiTypes.INT, description=f"tasks per page (max {TASKS_MAX_PAGE_SIZE})"),
]


@extend_schema_serializer(component_name="DatasetVersionSummary")
class DatasetVersionSummarySerializer(serializers.Serializer):
    id = serializers.CharField()
    reference = serializers.CharField()
    name = serializers.CharField(source="dataset.name")
    version = serializers.CharField()
    digest = serializers.CharField()
    task_count = serializers.IntegerField()
    created_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="DatasetVersionTask")
class DatasetVersionTaskSerializer(serializers.Serializer):
    position = serializers.IntegerField()
    task_version_id = serializers.CharField()
    name = serializers.CharField()
    digest = serializers.CharField()


@extend_schema_serializer(component_name="LocalSandboxUnsupportedTask")
class LocalUnsupportedTaskSerializer(DatasetVersionTaskSerializer):
    problems = serializers.ListField(child=serializers.CharField(), help_text="why, naming the instruction")


@extend_schema_serializer(component_name="LocalSandboxVerdict")
class LocalSandboxSerializer(serializers.Serializer):
    unsupported_count = serializers.IntegerField()
    unsupported = LocalUnsupportedTaskSerializer(
        many=True, help_text=f"the first {LOCAL_UNSUPPORTED_LISTED} tasks the local sandbox cannot run"
    )


@extend_schema_serializer(component_name="DatasetVersion")
class DatasetVersionDetailSerializer(DatasetVersionSummarySerializer):
    """Documents dataset_version_body (built by hand: it carries a page of tasks)."""

    tasks = DatasetVersionTaskSerializer(many=True)
    next = serializers.URLField(allow_null=True, help_text="the next page of tasks, or null")
    local_sandbox = LocalSandboxSerializer(
        help_text="tasks the local sandbox cannot run (runs there are refused; other environments may run them)"
    )


def local_sandbox_body(dataset_version: DatasetVersion) -> dict[str, Any]:
    entries = selectors.dataset_version_local_unsupported(
        dataset_version=dataset_version, limit=LOCAL_UNSUPPORTED_LISTED + 1
    )
    count = len(entries)
    if count > LOCAL_UNSUPPORTED_LISTED:
        count = selectors.dataset_version_local_unsupported_count(dataset_version=dataset_version)
    return {
        "unsupported_count": count,
        "unsupported": [
            {
                "position": entry.position,
                "task_version_id": entry.task_version_id,
                "name": entry.task_version.name,
                "digest": entry.task_version.digest,
                "problems": entry.task_version.local_problems,
            }
            for entry in entries[:LOCAL_UNSUPPORTED_LISTED]
        ],
    }


def dataset_version_body(request: Request, dataset_version: DatasetVersion) -> dict[str, Any]:
    """The version with one page of its ordered tasks; `?cursor=` is the next position."""
    start = _int_param(request, "cursor", 0, minimum=0)
    limit = _int_param(request, "limit", TASKS_PAGE_SIZE, minimum=1, maximum=TASKS_MAX_PAGE_SIZE)
    # One extra row tells whether there is a next page without a COUNT.
    entries = selectors.dataset_version_entries(dataset_version=dataset_version, start=start, limit=limit + 1)
    page, more = entries[:limit], len(entries) > limit
    next_url = None
    if more:
        next_url = replace_query_param(request.build_absolute_uri(), "cursor", page[-1].position + 1)
    body = dict(DatasetVersionSummarySerializer(dataset_version).data)
    body["tasks"] = [
        {
            "position": entry.position,
            "task_version_id": entry.task_version_id,
            "name": entry.task_version.name,
            "digest": entry.task_version.digest,
        }
        for entry in page
    ]
    body["next"] = next_url
    body["local_sandbox"] = local_sandbox_body(dataset_version)
    return body


class DatasetListCreateApi(APIView):
    """GET: this organization's dataset versions, newest first. POST: import an archive."""

    @extend_schema_serializer(component_name="DatasetImportInput")
    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=100)
        version = serializers.CharField(max_length=64)
        archive = serializers.FileField(help_text="tar or tar.gz of a folder of Harbor task folders")
        registry = serializers.FileField(
            required=False, help_text="optional Harbor registry.json; task paths relative to the archive"
        )

    OutputSerializer = DatasetVersionSummarySerializer

    @extend_schema(responses={200: paged(OutputSerializer, name="DatasetVersions"), **ERRORS})
    def get(self, request: Request) -> Response:
        query_read(request=request, serializer=PageQuery)
        paginator = IdCursorPagination()
        page = paginator.paginate_queryset(selectors.dataset_version_list(org=_org(request)), request, view=self)
        return paginator.get_paginated_response(self.OutputSerializer(page, many=True).data)

    @extend_schema(
        request={"multipart/form-data": InputSerializer},
        responses={201: DatasetVersionDetailSerializer, 200: DatasetVersionDetailSerializer, **ERRORS},
        parameters=_PAGE_PARAMETERS,
    )
    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        registry = data.get("registry")
        dataset_version, created = services.dataset_import_archive(
            org=_org(request),
            name=data["name"],
            version=data["version"],
            archive=data["archive"],
            archive_size=data["archive"].size,
            registry=registry.read(services.MAX_REGISTRY_BYTES + 1) if registry is not None else None,
        )
        return Response(
            dataset_version_body(request, dataset_version),
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class DatasetVersionDetailApi(APIView):
    """One dataset version (org/name@version) with its ordered task versions, paged."""

    @extend_schema(responses={200: DatasetVersionDetailSerializer, **ERRORS}, parameters=_PAGE_PARAMETERS)
    def get(self, request: Request, org: str, name: str, version: str) -> Response:
        query_read(request=request, serializer=PageQuery)  # the tasks' page
        dataset_version = services.dataset_version_resolve(org=_org(request), reference=f"{org}/{name}@{version}")
        return Response(dataset_version_body(request, dataset_version))


class TaskVersionDetailApi(APIView):
    """One immutable task version: parsed config, resources, timeouts, archive reference."""

    @extend_schema_serializer(component_name="TaskVersion")
    class OutputSerializer(serializers.Serializer):
        id = serializers.CharField()
        name = serializers.CharField()
        digest = serializers.CharField()
        created_at = serializers.DateTimeField()
        config = serializers.JSONField()
        instruction = serializers.CharField()
        has_solution = serializers.BooleanField()
        resources = serializers.SerializerMethodField()
        timeouts = serializers.SerializerMethodField()
        environment = serializers.SerializerMethodField()
        local_sandbox = serializers.JSONField(
            source="local_support",
            allow_null=True,
            help_text="{supported, problems, warnings} of the local sandbox, as judged at import (null: not judged)",
        )
        archive = serializers.SerializerMethodField()

        def get_resources(self, tv: TaskVersion) -> dict[str, Any]:
            env = tv.config.get("environment") or {}
            return {
                "cpus": tv.cpus,
                "memory_mb": tv.memory_mb,
                "storage_mb": tv.storage_mb,
                "gpus": env.get("gpus"),
            }

        def get_timeouts(self, tv: TaskVersion) -> dict[str, Any]:
            env = tv.config.get("environment") or {}
            return {
                "agent_sec": tv.agent_timeout_sec,
                "verifier_sec": tv.verifier_timeout_sec,
                "build_sec": env.get("build_timeout_sec"),
            }

        def get_environment(self, tv: TaskVersion) -> dict[str, Any]:
            env = tv.config.get("environment") or {}
            return {
                "docker_image": tv.docker_image or None,
                "has_dockerfile": tv.has_dockerfile,
                "workdir": env.get("workdir"),
                "network_mode": env.get("network_mode"),
                "os": env.get("os"),
            }

        def get_archive(self, tv: TaskVersion) -> dict[str, Any]:
            return {
                "id": tv.archive.id,
                "sha256": tv.archive.sha256,
                "size": tv.archive.size,
                "content_type": tv.archive.content_type,
            }

    @extend_schema(responses={200: OutputSerializer, **ERRORS})
    def get(self, request: Request, task_version_id: str) -> Response:
        task_version = selectors.task_version_get(org=_org(request), task_version_id=task_version_id)
        if task_version is None:
            raise NotFound(f"task version {task_version_id} not found")
        return Response(self.OutputSerializer(task_version).data)
