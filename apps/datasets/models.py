from __future__ import annotations

from django.db import models

from apps.accounts.models import Organization
from apps.core.ids import PrefixedIdField


class TaskVersion(models.Model):
    """One immutable Harbor task, content-addressed by the sha256 of its canonical archive."""

    id = PrefixedIdField(prefix="tv")
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="task_versions")
    name = models.CharField(max_length=200, help_text="Harbor task name (org/name or directory name)")
    digest = models.CharField(max_length=64, help_text="sha256 of the canonical archive")
    archive = models.ForeignKey("objects.StoredObject", on_delete=models.PROTECT, related_name="+")
    config = models.JSONField(help_text="Harbor TaskConfig as parsed by the harbor package")
    instruction = models.TextField()
    agent_timeout_sec = models.FloatField(null=True, blank=True)
    verifier_timeout_sec = models.FloatField()
    cpus = models.FloatField(default=1)
    memory_mb = models.IntegerField(default=2048)
    storage_mb = models.IntegerField(default=10240)
    docker_image = models.CharField(max_length=300, blank=True)
    has_dockerfile = models.BooleanField(default=False)
    has_solution = models.BooleanField(default=False)
    # Null for versions imported before the check existed (admission then lets them through;
    # the sandbox still refuses them when a trial starts).
    local_support = models.JSONField(
        null=True,
        blank=True,
        help_text="the local sandbox's verdict at import: {version, supported, problems, warnings}",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "digest"], name="taskversion_unique_org_digest")]

    @property
    def local_problems(self) -> list[str]:
        """Why the local sandbox cannot run this task ([] if it can, or if never checked)."""
        return list((self.local_support or {}).get("problems") or [])

    def __str__(self) -> str:
        return f"{self.name} ({self.digest[:12]})"


class Dataset(models.Model):
    id = PrefixedIdField(prefix="ds")
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "name"], name="dataset_unique_org_name")]

    def __str__(self) -> str:
        return f"{self.org.slug}/{self.name}"


class DatasetVersion(models.Model):
    """An ordered, immutable list of task versions, referenced as org/name@version."""

    id = PrefixedIdField(prefix="dsv")
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    version = models.CharField(max_length=64)
    digest = models.CharField(max_length=64, help_text="sha256 over the ordered task digests")
    task_count = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "version"], name="datasetversion_unique")]

    @property
    def reference(self) -> str:
        return f"{self.dataset.org.slug}/{self.dataset.name}@{self.version}"

    def __str__(self) -> str:
        return self.reference


class DatasetVersionTask(models.Model):
    dataset_version = models.ForeignKey(DatasetVersion, on_delete=models.CASCADE, related_name="entries")
    position = models.IntegerField()
    task_version = models.ForeignKey(TaskVersion, on_delete=models.PROTECT, related_name="dataset_entries")

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(fields=["dataset_version", "position"], name="datasetversiontask_unique_pos")
        ]
