"""Training state, learning updates and checkpoints.

A train run samples batches of sampling groups against a sampler snapshot. As each group
of a batch settles, its contribution to the step's learning update is recorded (its
datums' forward/backward goes to the backend while slower groups still sample); when every
group has contributed or been excluded, the update takes an optimizer step and saves a
checkpoint, which the next batch samples from (or, with ``max_staleness`` > 0, the batch
after it: the next batch may already be sampling the previous weights).
"""

from __future__ import annotations

from django.db import models

from apps.accounts.models import Organization
from apps.core.ids import PrefixedIdField


class TrainerStatus(models.TextChoices):
    SAMPLING = "sampling"  # the current step's groups are running
    UPDATING = "updating"  # the step's update is being computed
    BLOCKED = "blocked"  # an update was left unresolved: automatic continuation stops
    DONE = "done"
    FAILED = "failed"


class Trainer(models.Model):
    """The learning state of one train run: where it is, what it samples from, its cursor."""

    run = models.OneToOneField("runs.Run", primary_key=True, on_delete=models.CASCADE, related_name="trainer")
    backend = models.CharField(max_length=16)
    route = models.CharField(max_length=100, help_text="the base model route being trained")
    base_model = models.CharField(max_length=300, help_text="the backend's name for the base model")
    step = models.PositiveIntegerField(default=0, help_text="the step whose batch is sampling (or updating)")
    dataset_cursor = models.PositiveIntegerField(default=0, help_text="tasks consumed so far, across epochs")
    sampler = models.JSONField(help_text="the model binding the current batch samples from")
    sampler_step = models.PositiveIntegerField(
        default=0, help_text="the step whose weights `sampler` holds (a skipped update keeps them and counts)"
    )
    state_path = models.CharField(max_length=500, blank=True, help_text="last saved trainer state (to resume)")
    # A continuation starts at the step of the checkpoint it continues (numbering goes on);
    # the run takes plan.steps updates from there.
    first_step = models.PositiveIntegerField(default=0, help_text="the step this run started at")
    # A weights-only continuation's starting state is loaded without its optimizer state
    # (a fresh optimizer); every state this run saves is loaded with it.
    weights_only_state = models.CharField(
        max_length=500, blank=True, help_text="the state path loaded without optimizer state"
    )
    status = models.CharField(max_length=16, choices=TrainerStatus.choices, default=TrainerStatus.SAMPLING)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"trainer of {self.run_id} (step {self.step}, {self.status})"


class UpdateStatus(models.TextChoices):
    PENDING = "pending"  # gathering data
    UNRESOLVED = "unresolved"  # optimizer step submitted, not yet confirmed saved
    APPLIED = "applied"  # weights changed and a checkpoint saved
    SKIPPED = "skipped"  # the batch gave no learning signal; weights unchanged
    FAILED = "failed"


class LearningUpdate(models.Model):
    """One optimizer step of a train run, with what went into it and what it measured."""

    id = PrefixedIdField(prefix="upd")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="learning_updates")
    step = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=UpdateStatus.choices, default=UpdateStatus.PENDING)
    sampler = models.JSONField(help_text="the binding the batch was sampled from")
    groups = models.JSONField(default=list, blank=True, help_text="per group: qualified, rewards, skipped reason")
    datums = models.PositiveIntegerField(default=0)
    sampled_tokens = models.PositiveIntegerField(default=0, help_text="tokens with an advantage (trained on)")
    metrics = models.JSONField(default=dict, blank=True)
    checkpoint = models.OneToOneField(
        "training.Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="update"
    )
    error = models.TextField(blank=True)
    # The training worker process applying it heartbeats like a trial lease: a holder whose
    # heartbeat lapsed is gone, and the sweeper redoes (pending) or blocks (unresolved) it.
    holder = models.CharField(max_length=200, blank=True, help_text="host/boot/pid/start of the worker process")
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="learningupdate_unique_step")]
        indexes = [models.Index(fields=["status", "heartbeat_at"])]

    def __str__(self) -> str:
        return f"{self.run_id} step {self.step} ({self.status})"


class Checkpoint(models.Model):
    """Weights a train run produced, usable as a model binding ``{"checkpoint": "ckpt_..."}``.

    `snapshot` is what the proxy samples from (an object-store package of a LoRA adapter,
    ``object:sha256:<hex>``, or a ``tinker://`` sampler path); `state_path` resumes training.
    """

    id = PrefixedIdField(prefix="ckpt")
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="checkpoints")
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="checkpoints")
    step = models.PositiveIntegerField(help_text="the number of updates in these weights")
    backend = models.CharField(max_length=16)
    route = models.CharField(max_length=100, help_text="the base model route these weights adapt")
    base_model = models.CharField(max_length=300)
    lora_rank = models.PositiveIntegerField()
    snapshot = models.CharField(max_length=500, help_text="sampler weights the proxy serves")
    state_path = models.CharField(max_length=500, blank=True, help_text="trainer state (weights + optimizer)")
    sha256 = models.CharField(max_length=64, blank=True, help_text="of the stored adapter package (local)")
    size = models.BigIntegerField(null=True, blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    # What exact continuation restores besides the state package (weights + optimizer):
    # apps.training.continuation. Empty on checkpoints saved before it was recorded.
    resume = models.JSONField(
        default=dict, blank=True, help_text="dataset cursor, dataset, task filter, seed: for exact continuation"
    )
    milestone = models.BooleanField(
        default=False, help_text="saved at a multiple of the plan's save_every, or the run's last step"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="checkpoint_unique_step")]

    def binding(self) -> dict[str, str]:
        """The model binding that samples from these weights."""
        return {"checkpoint": self.id, "route": self.route, "snapshot": self.snapshot}

    def __str__(self) -> str:
        return f"{self.id} ({self.run_id} step {self.step})"


class ContributionStatus(models.TextChoices):
    READY = "ready"  # eligible, with datums: its forward/backward is due
    SUBMITTED = "submitted"  # its forward/backward ran in the process `holder`
    EXCLUDED = "excluded"  # gives the update nothing: `reason` says why


class GroupContribution(models.Model):
    """What one sampling group gave one learning update: the update's lineage, and the
    idempotency of the group's forward/backward (one per group per update, ``key``).

    A process that runs the forward/backward of a contribution remembers its key with the
    gradients it accumulated; the process taking the optimizer step submits every included
    contribution its own training client has not accumulated, so gradients that died with
    another process are computed again and none is counted twice.
    """

    group = models.OneToOneField(
        "runs.SamplingGroup", primary_key=True, on_delete=models.CASCADE, related_name="contribution"
    )
    update = models.ForeignKey(LearningUpdate, on_delete=models.CASCADE, related_name="contributions")
    sampler_step = models.PositiveIntegerField(help_text="the step whose weights the group sampled")
    staleness = models.PositiveIntegerField(default=0, help_text="update step - sampler step")
    status = models.CharField(max_length=16, choices=ContributionStatus.choices)
    reason = models.TextField(blank=True, help_text="why it is excluded")
    summary = models.JSONField(default=dict, blank=True, help_text="qualified, rewards, problems")
    datums = models.PositiveIntegerField(default=0)
    sampled_tokens = models.PositiveIntegerField(default=0)
    # Recorded on the evidence queue (apps.training.pipeline.contribution_prepare), a group's
    # datums are stored packed, so that the training process reads one object instead of the
    # group's evidence; recorded by the training process itself, they are not (it holds them).
    datums_object = models.ForeignKey(
        "objects.StoredObject",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="the packed datums, when stored",
    )
    holder = models.CharField(max_length=200, blank=True, help_text="the process that last ran its forward/backward")
    metrics = models.JSONField(default=dict, blank=True, help_text="loss, kl_sum, kl_tokens of its forward/backward")
    created_at = models.DateTimeField(auto_now_add=True)
    submitted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["update", "created_at"]

    @property
    def key(self) -> str:
        return f"{self.update_id}:{self.group_id}"

    def __str__(self) -> str:
        return f"{self.group_id} -> {self.update_id} ({self.status})"


class GroupReplacement(models.Model):
    """Dynamic sampling's lineage: a settled sampling group without learning signal (all
    rewards equal, or too few usable attempts) and the group drawn from the dataset in its
    place, in the same step (``plan.dynamic_sampling``)."""

    id = PrefixedIdField(prefix="rpl")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="group_replacements")
    step = models.PositiveIntegerField()
    replaced = models.OneToOneField("runs.SamplingGroup", on_delete=models.CASCADE, related_name="replaced_by")
    replacement = models.OneToOneField("runs.SamplingGroup", on_delete=models.CASCADE, related_name="replaces")
    reason = models.CharField(max_length=200)
    rewards = models.JSONField(default=list, blank=True, help_text="the replaced group's usable rewards")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "step", "created_at"]
        indexes = [models.Index(fields=["run", "step"])]

    def __str__(self) -> str:
        return f"{self.replaced_id} -> {self.replacement_id} ({self.run_id} step {self.step})"
