"""The bodies of the runs API, as serializers the OpenAPI schema is generated from.

The output serializers describe the dicts apps.runs.apis renders (run_dict, trial_dict, ...);
tests/test_schema.py checks real answers against them, so the two cannot drift apart."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from apps.core.fields import IntegerField
from apps.core.queries import QuerySerializer
from apps.core.serializers import ClosedSerializer
from apps.runs.models import GroupStatus, RunKind, RunStatus, TrialStatus

# --------------------------------------------------------------------------- inputs


@extend_schema_serializer(component_name="ProfileRefInput")
class ProfileRefInputSerializer(serializers.Serializer):
    profile = serializers.CharField(help_text="profile name")
    version = IntegerField(required=False, min_value=1, help_text="default: the latest version")
    digest = serializers.CharField(required=False, help_text="sha256:<hex>; refused (409) if the version differs")


@extend_schema_serializer(component_name="RunSubmitInput")
class RunSubmitInputSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=RunKind.choices)
    dataset = serializers.CharField(help_text="ORG/NAME@VERSION")
    actor = ProfileRefInputSerializer(required=False, help_text="the run's actor; required unless actors is given")
    actors = ProfileRefInputSerializer(
        many=True,
        required=False,
        help_text="train and evaluate runs: 2-8 actors on the same model, instead of actor; the groups are "
        "shared among them round-robin by position",
    )
    judge = ProfileRefInputSerializer(required=False, allow_null=True)
    plan = serializers.JSONField(
        required=False, help_text="the kind's plan (apps.runs.plans.PLAN_SCHEMAS); unknown keys are refused"
    )


@extend_schema_serializer(component_name="RunRegradeInput")
class RunRegradeInputSerializer(serializers.Serializer):
    judge = ProfileRefInputSerializer()
    plan = serializers.JSONField(required=False, help_text="the regrade plan; source_run is the run regraded")


@extend_schema_serializer(component_name="RunCancelInput")
class RunCancelInputSerializer(ClosedSerializer):
    """An optional body: why, recorded in the cancel's event. Any other field is refused
    rather than dropped, so nothing sent with a cancel is silently lost."""

    reason = serializers.CharField(
        required=False,
        max_length=500,
        help_text='recorded in the run\'s cancel event (default "cancelled by operator")',
    )


# --------------------------------------------------------------------------- outputs


@extend_schema_serializer(component_name="ProfileRef")
class ProfileRefSerializer(serializers.Serializer):
    profile = serializers.CharField()
    version = serializers.IntegerField()
    digest = serializers.CharField(help_text="lower-case hex sha256 of the canonical recipe")


@extend_schema_serializer(component_name="RunSummary")
class RunSummarySerializer(serializers.Serializer):
    """Written when the run ends. Every top-level figure counts the whole run (for a train
    run: every step's trials); `training` holds the figures by step."""

    trials = serializers.IntegerField(help_text="trials of the run, all steps")
    tasks = serializers.IntegerField(help_text="distinct tasks the run attempted")
    groups = serializers.IntegerField(help_text="sampling groups (for a train run: tasks sampled x steps)")
    statuses = serializers.DictField(child=serializers.IntegerField(), help_text="trials by status")
    errors = serializers.DictField(child=serializers.IntegerField(), help_text="trials by error type")  # type: ignore[assignment]  # a declared field: DRF's metaclass takes it off the class
    assessed = serializers.IntegerField(required=False, help_text="trials whose outcome weighs in the figures")
    verifier_errors = serializers.IntegerField(required=False)
    mean_reward = serializers.FloatField(
        required=False, allow_null=True, help_text="mean over tasks of each task's mean over all its trials"
    )
    pass_at_k = serializers.DictField(child=serializers.FloatField(), required=False, help_text="mean over tasks, by k")
    per_task = serializers.DictField(
        child=serializers.JSONField(), required=False, help_text="by task name: that task's trials, all steps"
    )
    training = serializers.JSONField(
        required=False, help_text="train runs: steps, applied, skipped, reward_by_step, checkpoints"
    )
    per_actor = serializers.ListField(
        child=serializers.JSONField(),
        required=False,
        help_text="runs of several actors, in their order: profile, version, engine, groups, trials, assessed, "
        "mean_reward (over its assessed attempts), passed, errors",
    )


@extend_schema_serializer(component_name="Run")
class RunSerializer(serializers.Serializer):
    id = serializers.CharField()
    kind = serializers.ChoiceField(choices=RunKind.choices)
    status = serializers.ChoiceField(choices=RunStatus.choices)
    dataset = serializers.CharField(allow_null=True, help_text="ORG/NAME@VERSION")
    dataset_digest = serializers.CharField(allow_null=True)
    actor = ProfileRefSerializer(allow_null=True, help_text="the actor (a run of several: the first)")
    actors = ProfileRefSerializer(many=True, help_text="a run of several actors: all of them, in order; else []")
    judge = ProfileRefSerializer(allow_null=True)
    model = serializers.JSONField(allow_null=True, help_text="the actor's model binding: route, checkpoint, snapshot")
    judge_model = serializers.JSONField(allow_null=True)
    plan = serializers.JSONField(allow_null=True, help_text="the plan as pinned, defaults filled in")
    summary = RunSummarySerializer(allow_null=True)
    error = serializers.CharField(allow_null=True)
    last_event_seq = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    cancel_requested_at = serializers.DateTimeField(allow_null=True)


@extend_schema_serializer(component_name="RunEvent")
class RunEventSerializer(serializers.Serializer):
    seq = serializers.IntegerField(help_text="1, 2, ... within the run, no gaps")
    type = serializers.CharField(help_text="e.g. run.created, trial.finished, training.update")
    data = serializers.JSONField()  # type: ignore[assignment]  # a declared field: DRF's metaclass takes it off the class
    created_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="RunEventsPage")
class RunEventsPageSerializer(serializers.Serializer):
    results = RunEventSerializer(many=True)
    after = serializers.IntegerField(help_text="the cursor to ask from next")
    has_more = serializers.BooleanField()
    run_status = serializers.ChoiceField(choices=RunStatus.choices)
    ended = serializers.BooleanField(help_text="the run has ended and every event was returned")


@extend_schema_serializer(component_name="SamplingGroup")
class GroupSerializer(serializers.Serializer):
    id = serializers.CharField()
    step = serializers.IntegerField(help_text="the training step that sampled it, from 0 (0 for other runs)")
    position = serializers.IntegerField()
    task = serializers.CharField()
    task_version_id = serializers.CharField()
    attempts = serializers.IntegerField()
    sampler = serializers.JSONField(help_text="the model binding its attempts used")
    actor = ProfileRefSerializer(allow_null=True, help_text="the actor its attempts ran (a run of several actors)")
    status = serializers.ChoiceField(choices=GroupStatus.choices)
    summary = serializers.JSONField(help_text="mean_reward, pass_at_k, errors of its attempts once settled")
    created_at = serializers.DateTimeField()
    settled_at = serializers.DateTimeField(allow_null=True)


@extend_schema_serializer(component_name="TrialError")
class TrialErrorSerializer(serializers.Serializer):
    type = serializers.CharField()
    message = serializers.CharField()


@extend_schema_serializer(component_name="Trial")
class TrialSerializer(serializers.Serializer):
    id = serializers.CharField()
    group = serializers.CharField()
    task = serializers.CharField()
    task_version_id = serializers.CharField()
    attempt = serializers.IntegerField()
    source = serializers.CharField(allow_null=True, help_text="a regrade's: the trial whose outputs it re-assessed")  # type: ignore[assignment]  # a declared field: DRF's metaclass takes it off the class
    status = serializers.ChoiceField(choices=TrialStatus.choices)
    reward = serializers.FloatField(allow_null=True)
    rewards = serializers.JSONField(allow_null=True)
    error = TrialErrorSerializer(allow_null=True)
    timings = serializers.JSONField()
    need = serializers.JSONField(help_text="cpus, memory_mb, storage_mb reserved")
    tries = serializers.IntegerField()
    worker_node = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


@extend_schema_serializer(component_name="ReadGrant")
class TrialDetailSerializer(TrialSerializer):
    run = serializers.CharField(help_text="The run the trial belongs to.")


class ReadGrantSerializer(serializers.Serializer):
    url = serializers.CharField()
    method = serializers.CharField()
    expires_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="Artifact")
class ArtifactSerializer(serializers.Serializer):
    id = serializers.CharField()
    trial = serializers.CharField(allow_null=True)
    name = serializers.CharField()
    path = serializers.CharField(help_text="unique within the run: TRIAL/NAME")
    kind = serializers.CharField()
    digest = serializers.CharField(help_text="sha256:<hex>")
    size = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    download = ReadGrantSerializer()


# --------------------------------------------------------------------------- worker API


@extend_schema_serializer(component_name="Lease")
class LeaseSerializer(serializers.Serializer):
    id = serializers.CharField()
    run = serializers.CharField()
    unit = serializers.CharField()
    fence = serializers.IntegerField()
    status = serializers.CharField()
    expires_at = serializers.DateTimeField()


@extend_schema_serializer(component_name="WorkerClaim")
class WorkerClaimSerializer(serializers.Serializer):
    lease = LeaseSerializer()
    run = RunSerializer()


@extend_schema_serializer(component_name="WorkerHeartbeat")
class WorkerHeartbeatSerializer(serializers.Serializer):
    expires_at = serializers.DateTimeField()
    cancel_requested = serializers.BooleanField()


@extend_schema_serializer(component_name="WorkerReport")
class WorkerReportSerializer(serializers.Serializer):
    applied = serializers.BooleanField(help_text="false: this batch was applied before (a resend)")


@extend_schema_serializer(component_name="LeaseOutcome")
class LeaseOutcomeSerializer(serializers.Serializer):
    run = serializers.CharField()
    status = serializers.ChoiceField(choices=RunStatus.choices)


# --------------------------------------------------------------------------- judge agreement


@extend_schema_serializer(component_name="AgreementQuery")
class AgreementQuerySerializer(QuerySerializer):
    paged = False
    # "with" is a keyword: the field is declared under another name and renamed below.
    with_ = serializers.CharField(help_text="the other run (B): a regrade of the same source, or the source itself")
    threshold = serializers.FloatField(
        required=False, help_text="a reward at or above it passes (default 1.0, as pass@k)"
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["with"] = fields.pop("with_")
        return fields


@extend_schema_serializer(component_name="AgreementSide")
class AgreementSideSerializer(serializers.Serializer):
    trial = serializers.CharField()
    reward = serializers.FloatField()
    passed = serializers.BooleanField()


@extend_schema_serializer(component_name="AgreementDisagreement")
class DisagreementSerializer(serializers.Serializer):
    attempt = serializers.CharField(help_text="the trial whose retained outputs both assessed")
    task = serializers.CharField()
    a = AgreementSideSerializer()
    b = AgreementSideSerializer()


@extend_schema_serializer(component_name="AgreementConfusion")
class ConfusionSerializer(serializers.Serializer):
    pass_pass = serializers.IntegerField(help_text="A passed, B passed")
    pass_fail = serializers.IntegerField(help_text="A passed, B failed")
    fail_pass = serializers.IntegerField(help_text="A failed, B passed")
    fail_fail = serializers.IntegerField(help_text="A failed, B failed")


@extend_schema_serializer(component_name="Agreement")
class AgreementSerializer(serializers.Serializer):
    a = serializers.CharField()
    b = serializers.CharField()
    source_run = serializers.CharField(help_text="the run whose retained outputs both assessed")
    threshold = serializers.FloatField()
    compared = serializers.IntegerField(help_text="attempts both assessed (both gave a reward)")
    unassessed = serializers.IntegerField(help_text="attempts in both that one side gave no reward")
    only_in_a = serializers.IntegerField()
    only_in_b = serializers.IntegerField()
    agreement = serializers.FloatField(allow_null=True, help_text="share of compared attempts with one verdict")
    kappa = serializers.FloatField(
        allow_null=True, help_text="Cohen's kappa; null when nothing was compared or chance explains everything"
    )
    confusion = ConfusionSerializer()
    disagreements = DisagreementSerializer(many=True)
