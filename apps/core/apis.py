from __future__ import annotations

from django.db import connection
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class HealthApi(APIView):
    """Liveness and database reachability, for load balancers; no authentication."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses={200: dict}, exclude=True)
    def get(self, request: Request) -> Response:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return Response({"ok": True})
