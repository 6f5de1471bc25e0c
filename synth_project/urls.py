"""URLconfs of the HTTP processes.

``gateway_urlpatterns`` is what the gateway serves (synth_project.wsgi routes with
synth_project.gateway_urls: these, and a pointer to the proxy under /v1). ``urlpatterns``
adds the model API for the whole application (synth_project.asgi, the test client); the
proxy process routes with synth_project.proxy_urls.
"""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from apps.core.apis import HealthApi

# JSON in the shape of the surface (/v1 or /api), never Django's HTML pages (DEBUG off).
handler400 = "synth_project.errors.bad_request"
handler403 = "synth_project.errors.permission_denied"
handler404 = "synth_project.errors.page_not_found"
handler500 = "synth_project.errors.server_error"

gateway_urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", HealthApi.as_view(), name="healthz"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
    path("api/", include("apps.accounts.urls")),
    path("api/", include("apps.objects.urls")),
    path("api/", include("apps.datasets.urls")),
    path("api/", include("apps.profiles.urls")),
    path("api/", include("apps.runs.urls")),
    path("api/", include("apps.proxy.api_urls")),
    path("api/", include("apps.training.urls")),
]

urlpatterns = [*gateway_urlpatterns, path("v1/", include("apps.proxy.urls"))]
