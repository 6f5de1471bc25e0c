from django.urls import path

from apps.runs import apis

urlpatterns = [
    path("runs", apis.RunListCreateApi.as_view(), name="runs"),
    path("runs/<str:run_id>", apis.RunDetailApi.as_view(), name="run-detail"),
    path("runs/<str:run_id>/cancel", apis.RunCancelApi.as_view(), name="run-cancel"),
    path("runs/<str:run_id>/regrade", apis.RunRegradeApi.as_view(), name="run-regrade"),
    path("runs/<str:run_id>/events", apis.RunEventsApi.as_view(), name="run-events"),
    path("runs/<str:run_id>/groups", apis.RunGroupsApi.as_view(), name="run-groups"),
    path("runs/<str:run_id>/trials", apis.RunTrialsApi.as_view(), name="run-trials"),
    path("runs/<str:run_id>/artifacts", apis.RunArtifactsApi.as_view(), name="run-artifacts"),
    path("runs/<str:run_id>/agreement", apis.RunAgreementApi.as_view(), name="run-agreement"),
    path("trials/<str:trial_id>", apis.TrialDetailApi.as_view(), name="trial-detail"),
    path("worker/claims", apis.WorkerClaimApi.as_view(), name="worker-claim"),
    path(
        "worker/leases/<str:lease_id>/heartbeat",
        apis.WorkerHeartbeatApi.as_view(),
        name="worker-heartbeat",
    ),
    path(
        "worker/leases/<str:lease_id>/events",
        apis.WorkerReportApi.as_view(),
        name="worker-report",
    ),
    path(
        "worker/leases/<str:lease_id>/complete",
        apis.WorkerCompleteApi.as_view(),
        name="worker-complete",
    ),
    path(
        "worker/leases/<str:lease_id>/release",
        apis.WorkerReleaseApi.as_view(),
        name="worker-release",
    ),
]
