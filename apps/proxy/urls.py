"""/v1: the model proxy's API (mounted at /v1/): Anthropic Messages, and OpenAI's protocols
(apps.proxy.openai) on the same call."""

from django.urls import path, re_path

from apps.proxy import views
from apps.proxy.openai import views as openai_views

urlpatterns = [
    path("messages", views.messages_view, name="v1-messages"),
    path("messages/count_tokens", views.count_tokens_view, name="v1-count-tokens"),
    path("responses", openai_views.responses_view, name="v1-responses"),
    path("models", views.models_view, name="v1-models"),
    path("models/<path:model_id>", views.model_detail_view, name="v1-model-detail"),
    path("chat/completions", openai_views.chat_completions_view, name="v1-chat-completions"),
    # Unknown paths of OpenAI's API families: OpenAI's 404 shape.
    re_path(openai_views.API_FAMILIES_PATTERN, openai_views.not_found_view, name="v1-openai-not-found"),
    re_path(r"^(?P<path>.*)$", views.not_found_view, name="v1-not-found"),
]
