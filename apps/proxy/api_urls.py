"""/api routes of the proxy (mounted at /api/)."""

from django.urls import path

from apps.proxy import apis

urlpatterns = [
    path("models", apis.ModelListApi.as_view(), name="models"),
    path("model-credentials", apis.InteractiveCredentialCreateApi.as_view(), name="model-credentials"),
    path("interactions", apis.InteractionListApi.as_view(), name="interactions"),
    path("interactions/<str:interaction_id>", apis.InteractionDetailApi.as_view(), name="interaction-detail"),
]
