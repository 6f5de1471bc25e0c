from django.urls import path

from apps.training import apis

urlpatterns = [
    path("runs/<str:run_id>/updates", apis.RunUpdatesApi.as_view(), name="run-updates"),
    path("runs/<str:run_id>/checkpoints", apis.RunCheckpointsApi.as_view(), name="run-checkpoints"),
    path("checkpoints", apis.CheckpointListApi.as_view(), name="checkpoints"),
    path("checkpoints/<str:checkpoint_id>", apis.CheckpointDetailApi.as_view(), name="checkpoint-detail"),
]
