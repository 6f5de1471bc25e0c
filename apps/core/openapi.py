"""How the OpenAPI schema is generated: operations are tagged by the app that serves them."""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema


class AppAutoSchema(AutoSchema):
    """Tags each operation with its app's name (apps.runs.apis -> "runs"), so the docs group
    runs, training, profiles, ... rather than putting every path under "api"."""

    def get_tags(self) -> list[str]:
        module = type(self.view).__module__.split(".")
        if len(module) > 1 and module[0] == "apps":
            return [module[1]]
        return super().get_tags()
