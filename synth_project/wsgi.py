"""The gateway's WSGI application (gunicorn synth_project.wsgi): every request is routed with
synth_project.gateway_urls, which holds no model API (see there)."""

import os
from typing import Any

import django
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpResponseBase

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")
# Read by the settings: what only the gateway's process does (settings.SYNTH_GATEWAY_PROCESS).
os.environ.setdefault("SYNTH_GATEWAY_PROCESS", "true")
django.setup(set_prefix=False)

GATEWAY_URLCONF = "synth_project.gateway_urls"


class GatewayHandler(WSGIHandler):
    """Django's WSGI handler, resolving every request with the gateway's URLconf."""

    def get_response(self, request: Any) -> HttpResponseBase:  # Any: Django reads a urlconf it does not declare
        request.urlconf = GATEWAY_URLCONF
        return super().get_response(request)


application = GatewayHandler()
