"""Object store endpoints: upload grants, commits, metadata with read grants.

Two endpoints take no bearer token (the filesystem store's "presigned" URLs): the signed
``sig`` query parameter is their whole authority, as a presigned S3 URL would be.
"""

from __future__ import annotations

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.fields import IntegerField
from apps.objects.selectors import object_get, upload_grant_get
from apps.objects.services import (
    DEFAULT_CONTENT_TYPE,
    object_commit,
    object_content_open,
    object_read_grant,
    object_upload_grant,
    object_upload_receive,
)

_SIG = OpenApiParameter("sig", OpenApiTypes.STR, OpenApiParameter.QUERY, required=True, description="signed grant")


class ObjectSerializer(serializers.Serializer):
    class Meta:
        ref_name = "StoredObject"

    id = serializers.CharField()
    sha256 = serializers.CharField()
    size = serializers.IntegerField()
    key = serializers.CharField()
    content_type = serializers.CharField()
    committed_at = serializers.DateTimeField()


class ObjectUploadGrantApi(APIView):
    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ObjectUploadGrantInput"

        sha256 = serializers.RegexField(r"^[0-9a-fA-F]{64}$")
        size = IntegerField(min_value=0)
        content_type = serializers.CharField(max_length=100, default=DEFAULT_CONTENT_TYPE)

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ObjectUploadGrant"

        grant_id = serializers.CharField(source="grant.id")
        sha256 = serializers.CharField(source="grant.sha256")
        size = serializers.IntegerField(source="grant.size")
        url = serializers.CharField(source="request.url")
        method = serializers.CharField(source="request.method")
        headers = serializers.DictField(source="request.headers", child=serializers.CharField())
        expires_at = serializers.DateTimeField(source="request.expires_at")

    @extend_schema(request=InputSerializer, responses={201: OutputSerializer})
    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        issued = object_upload_grant(org=request.auth.org, **serializer.validated_data)
        return Response(self.OutputSerializer(issued).data, status=status.HTTP_201_CREATED)


class ObjectUploadReceiveApi(APIView):
    """PUT target of filesystem upload grants; streams the body, never buffers it whole."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ObjectUploadReceived"

        status = serializers.ChoiceField(choices=["created", "present"])

    @extend_schema(
        parameters=[_SIG],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={201: OutputSerializer, 200: OutputSerializer},
        auth=[],
    )
    def put(self, request: Request, grant_id: str) -> Response:
        raw_length = request.META.get("CONTENT_LENGTH")
        content_length = int(raw_length) if raw_length and raw_length.isdigit() else None
        # request.stream is None for an empty body (DRF); an empty object is still valid.
        body = request.stream
        result = object_upload_receive(
            grant_id=grant_id,
            token=request.query_params.get("sig"),
            body=body if body is not None else _Empty(),
            content_length=content_length,
        )
        code = status.HTTP_201_CREATED if result == "created" else status.HTTP_200_OK
        return Response(self.OutputSerializer({"status": result}).data, status=code)


class _Empty:
    def read(self, size: int = -1) -> bytes:
        return b""


class ObjectCommitApi(APIView):
    @extend_schema(request=None, responses={201: ObjectSerializer, 200: ObjectSerializer})
    def post(self, request: Request, grant_id: str) -> Response:
        grant = upload_grant_get(org=request.auth.org, grant_id=grant_id)
        retried = grant.committed_at is not None
        obj = object_commit(org=request.auth.org, grant=grant)
        return Response(ObjectSerializer(obj).data, status=status.HTTP_200_OK if retried else status.HTTP_201_CREATED)


class ObjectDetailApi(APIView):
    class OutputSerializer(ObjectSerializer):
        class Meta:
            ref_name = "StoredObjectWithReadGrant"

        class ReadSerializer(serializers.Serializer):
            class Meta:
                ref_name = "ObjectReadGrant"

            url = serializers.CharField()
            method = serializers.CharField()
            expires_at = serializers.DateTimeField()

        read = ReadSerializer()

    @extend_schema(responses=OutputSerializer)
    def get(self, request: Request, sha256: str) -> Response:
        obj = object_get(org=request.auth.org, sha256=sha256.lower())
        grant = object_read_grant(org=request.auth.org, sha256=obj.sha256)
        read = self.OutputSerializer.ReadSerializer(grant.request).data
        return Response({**ObjectSerializer(obj).data, "read": read})


class ObjectContentApi(APIView):
    """GET target of filesystem read grants."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(
        parameters=[_SIG],
        responses={(200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY)},
        auth=[],
    )
    def get(self, request: Request, sha256: str) -> FileResponse:
        obj, stream = object_content_open(sha256=sha256, token=request.query_params.get("sig"))
        response = FileResponse(stream, content_type=obj.content_type)
        response["Content-Length"] = str(obj.size)
        # Content-addressed: the digest is a perfect validator and the bytes never change.
        response["ETag"] = f'"{obj.sha256}"'
        response["Cache-Control"] = "private, max-age=31536000, immutable"
        return response
