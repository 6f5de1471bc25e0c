"""The gateway's WSGI application (gunicorn synth_project.wsgi): every request is routed with
synth_project.gateway_urls, which holds no model API (see there)."""

import os

import django
from django.core.handlers.wsgi import WSGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")
django.setup(set_prefix=False)

GATEWAY_URLCONF = "synth_project.gateway_urls"


class GatewayHandler(WSGIHandler):
    """Django's WSGI handler, resolving every request with the gateway's URLconf."""

    def get_response(self, request):  # type: ignore[no-untyped-def]
        request.urlconf = GATEWAY_URLCONF
        return super().get_response(request)


application = GatewayHandler()
