"""/v1: the Anthropic Messages surface of the model proxy (mounted at /v1/)."""

from django.urls import path, re_path

from apps.proxy import views

urlpatterns = [
    path("messages", views.messages_view, name="v1-messages"),
    path("messages/count_tokens", views.count_tokens_view, name="v1-count-tokens"),
    path("models", views.models_view, name="v1-models"),
    path("models/<path:model_id>", views.model_detail_view, name="v1-model-detail"),
    re_path(r"^(?P<path>.*)$", views.not_found_view, name="v1-not-found"),
]
