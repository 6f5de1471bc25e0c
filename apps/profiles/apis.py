"""Profiles over HTTP: publish a recipe, read back its exact canonical bytes and digest.

Canonical form (synth_common.canonical): the recipe as JSON encoded in UTF-8, object keys
sorted by code point, no insignificant whitespace (separators "," and ":"), non-ASCII
characters written as themselves (not \\u-escaped), no NaN or Infinity. Before encoding,
numbers with an integral value are written as integers (1800.0 -> 1800), since many
JSON clients cannot tell them apart. The digest is the lower-case hex sha256 of exactly
those bytes, so key order and whitespace of what was posted do not matter.

    POST /api/profiles/{name}/versions         body: the recipe object itself (not wrapped)
        201 new version / 200 identical content already published
        {"id", "name", "version", "digest", "canonical", "created_at"}
        `canonical` is the canonical bytes decoded as UTF-8, so
        sha256(body["canonical"].encode("utf-8")).hexdigest() == body["digest"].
        Headers: Location, ETag "<hex>", X-Synth-Digest: sha256:<hex>.
    GET  /api/profiles/{name}/versions/{version}
        the exact canonical bytes as the body (application/json), digest in the
        X-Synth-Digest and ETag headers; If-None-Match gives 304.
    GET  /api/profiles/{name}/versions/{version}/meta
        the same JSON object as the POST answers, digest in the body. (A path rather than
        ?format=meta, because DRF reserves ?format= for choosing a renderer.)
    GET  /api/profiles                         profiles, paged
    GET  /api/profiles/{name}                  the profile and its versions (newest first), paged
    GET  /api/profiles/{name}/versions         its versions, paged
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.models import Organization
from apps.accounts.principal import Principal
from apps.core.errors import ValidationFailed
from apps.core.pagination import IdCursorPagination
from apps.core.parsers import JSONParser
from apps.core.queries import PageQuery, query_read
from apps.core.serializers import ERRORS, paged
from apps.profiles.models import ProfileVersion
from apps.profiles.selectors import (
    profile_get,
    profile_list,
    profile_version_get,
    profile_version_list,
    profile_version_verify,
)
from apps.profiles.services import profile_publish

# Shown in the OpenAPI description of the endpoints that hand out canonical bytes.
CANONICAL_FORM = (
    "Canonical form: UTF-8 JSON, object keys sorted by code point, separators ',' and ':' with no other "
    "whitespace, non-ASCII characters unescaped, integral numbers written as integers, no NaN/Infinity. "
    "digest = lower-case hex sha256 of exactly those bytes."
)
DIGEST_HEADER = "X-Synth-Digest"
# A version never changes, so a client may cache it for good; private because reads are per-organization.
IMMUTABLE_CACHE = "private, max-age=31536000, immutable"


class VersionCursorPagination(IdCursorPagination):
    # Version numbers are the order authors think in, and unique within a profile.
    ordering = "-version"


def _org(request: Request) -> Organization:
    principal = request.auth
    # IsMember (the default permission) only admits members, who always have an org.
    assert isinstance(principal, Principal) and principal.org is not None
    return principal.org


def _digest_headers(response: HttpResponse, profile_version: ProfileVersion) -> None:
    response["ETag"] = f'"{profile_version.digest}"'
    response[DIGEST_HEADER] = f"sha256:{profile_version.digest}"


class VersionMetaSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField(source="profile.name")
    version = serializers.IntegerField()
    digest = serializers.CharField()
    canonical = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    def get_canonical(self, obj: ProfileVersion) -> str:
        return profile_version_verify(profile_version=obj).decode("utf-8")


@extend_schema_serializer(component_name="Recipe")
class RecipeSerializer(serializers.Serializer):
    """Documents a recipe's top level; synth_launcher.recipe.RECIPE_SCHEMA checks all of it
    (unknown keys are refused)."""

    engine = serializers.JSONField(help_text='{"name": "claude-code" | "command" | ..., "version"?}')
    limits = serializers.JSONField(help_text="timeout_sec, setup_timeout_sec, ...")
    model = serializers.JSONField(
        required=False, help_text='exactly one of {"route": "<model route>"} or {"checkpoint": "ckpt_..."}'
    )
    command = serializers.ListField(
        child=serializers.CharField(), required=False, help_text='argv of the agent process; engine "command" only'
    )
    files = serializers.ListField(
        child=serializers.JSONField(), required=False, help_text="written into the workdir before setup"
    )
    setup = serializers.ListField(child=serializers.JSONField(), required=False, help_text="shell commands, in order")
    workdir = serializers.CharField(required=False)
    args = serializers.ListField(child=serializers.JSONField(), required=False)
    env = serializers.DictField(required=False)
    instruction = serializers.JSONField(required=False)
    outputs = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="required output paths, collected as artifacts"
    )


class ProfileListApi(APIView):
    class OutputSerializer(serializers.Serializer):
        id = serializers.CharField()
        name = serializers.CharField()
        latest_version = serializers.IntegerField(allow_null=True)
        versions_count = serializers.IntegerField()
        created_at = serializers.DateTimeField()

    @extend_schema(
        operation_id="api_profiles_list", responses={200: paged(OutputSerializer, name="Profiles"), **ERRORS}
    )
    def get(self, request: Request) -> Response:
        query_read(request=request, serializer=PageQuery)
        paginator = IdCursorPagination()
        page = paginator.paginate_queryset(profile_list(org=_org(request)), request, view=self)
        return paginator.get_paginated_response(self.OutputSerializer(page, many=True).data)


class VersionListSerializer(serializers.Serializer):
    id = serializers.CharField()
    version = serializers.IntegerField()
    digest = serializers.CharField()
    created_by = serializers.CharField(source="created_by.get_username", default=None)
    created_at = serializers.DateTimeField()


def _versions_page(request: Request, view: APIView, name: str) -> tuple[Any, Response]:
    query_read(request=request, serializer=PageQuery)
    profile = profile_get(org=_org(request), name=name)
    paginator = VersionCursorPagination()
    queryset = profile_version_list(profile=profile).select_related("created_by")
    page = paginator.paginate_queryset(queryset, request, view=view)
    return profile, paginator.get_paginated_response(VersionListSerializer(page, many=True).data)


@extend_schema_serializer(component_name="ProfileWithVersions")
class ProfileDetailSerializer(ProfileListApi.OutputSerializer):
    next = serializers.URLField(allow_null=True, help_text="the next page of versions, or null")
    previous = serializers.URLField(allow_null=True)
    results = VersionListSerializer(many=True, help_text="versions, newest first")


class ProfileDetailApi(APIView):
    """The profile with its versions, newest first, paged like every list."""

    @extend_schema(responses={200: ProfileDetailSerializer, **ERRORS})
    def get(self, request: Request, name: str) -> Response:
        profile, response = _versions_page(request, self, name)
        response.data = {
            "id": profile.id,
            "name": profile.name,
            "latest_version": profile.latest_version,
            "versions_count": profile.versions_count,
            "created_at": serializers.DateTimeField().to_representation(profile.created_at),
            **response.data,
        }
        return response


class ProfileVersionListApi(APIView):
    # JSON only: a recipe is a JSON object, and a form upload would arrive as a QueryDict.
    parser_classes = [JSONParser]

    @extend_schema(
        operation_id="api_profiles_versions_list",
        responses={200: paged(VersionListSerializer, name="ProfileVersions"), **ERRORS},
    )
    def get(self, request: Request, name: str) -> Response:
        return _versions_page(request, self, name)[1]

    @extend_schema(
        request=RecipeSerializer,
        responses={201: VersionMetaSerializer, 200: VersionMetaSerializer, **ERRORS},
        description="Publish a recipe (the body is the recipe object). 201 new version, 200 identical content. "
        + CANONICAL_FORM,
    )
    def post(self, request: Request, name: str) -> Response:
        body = request.data
        if isinstance(body, dict) and list(body) == ["recipe"]:
            raise ValidationFailed('post the recipe itself as the body, not wrapped in {"recipe": ...}', field="recipe")
        version, created = profile_publish(org=_org(request), name=name, recipe=body, created_by=request.user)
        response = Response(
            VersionMetaSerializer(version).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )
        _digest_headers(response, version)
        response["Location"] = reverse("profile-version", kwargs={"name": name, "version": version.version})
        return response


class ProfileVersionDetailApi(APIView):
    """The exact canonical bytes of one version: sha256(body) == the digest header."""

    @extend_schema(
        responses={(200, "application/json"): OpenApiResponse(RecipeSerializer), 304: None, **ERRORS},
        description="The exact canonical bytes; digest in X-Synth-Digest (sha256:<hex>) and ETag. " + CANONICAL_FORM,
    )
    def get(self, request: Request, name: str, version: int) -> HttpResponse:
        found = profile_version_get(org=_org(request), name=name, version=version)
        data = profile_version_verify(profile_version=found)
        etag = f'"{found.digest}"'
        if etag in [tag.strip() for tag in request.headers.get("If-None-Match", "").split(",")]:
            response = HttpResponse(status=status.HTTP_304_NOT_MODIFIED)
        else:
            response = HttpResponse(data, content_type="application/json")
        _digest_headers(response, found)
        response["Cache-Control"] = IMMUTABLE_CACHE
        return response


class ProfileVersionMetaApi(APIView):
    """The version as JSON: {id, name, version, digest, canonical, created_at}, as POST answers."""

    @extend_schema(responses={200: VersionMetaSerializer, **ERRORS})
    def get(self, request: Request, name: str, version: int) -> Response:
        found = profile_version_get(org=_org(request), name=name, version=version)
        response = Response(VersionMetaSerializer(found).data)
        _digest_headers(response, found)
        return response
