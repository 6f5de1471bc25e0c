from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.db import database_answers


class HealthApi(APIView):
    """Liveness and database reachability, for load balancers; no authentication."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses={200: dict}, exclude=True)
    def get(self, request: Request) -> Response:
        database_answers()
        return Response({"ok": True})
