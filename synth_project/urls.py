from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from apps.core.apis import HealthApi

urlpatterns = [
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
    path("v1/", include("apps.proxy.urls")),
]
