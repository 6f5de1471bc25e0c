"""OpenAPI description of bearer authentication (imported by AccountsConfig.ready)."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "apps.accounts.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):  # type: ignore[no-untyped-def]
        return {"type": "http", "scheme": "bearer", "description": "An API token: `Authorization: Bearer syn_...`"}
