"""A trial's files to the object store: logs, transcript, verifier output, outputs, the
retained workdir and the launch plan, each an Artifact, content-addressed."""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.objects.services import objects_put_many
from apps.runs.models import Artifact, Trial
from synth_common.canonical import canonical_bytes
from synth_launcher.engines import ENGINES

# The engines' transcripts by file name (JSON Lines ones are recognised by their suffix too).
_TRANSCRIPTS = frozenset(engine.transcript for engine in ENGINES.values() if engine.transcript)

logger = logging.getLogger(__name__)


def artifacts_publish(*, trial: Trial, trial_dir: Path, launch_plan: Any) -> list[Artifact]:
    """Upload the trial's files (logs, transcript, verifier output, outputs) content-addressed.
    The launch plan goes too; it never holds the scoped credential (see LaunchPlan.to_dict).
    Idempotent: a file already recorded under its name is kept."""
    org = trial.run.org
    files: list[tuple[str, bytes]] = []
    if launch_plan is not None:  # a regrade launched no agent
        plan_doc = {**launch_plan.to_dict(), "digest": launch_plan.digest()}
        files.append(("launch-plan.json", canonical_bytes(plan_doc)))
    if trial_dir.is_dir():
        for path in sorted(trial_dir.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            size = path.stat().st_size
            if size > settings.SYNTH_ARTIFACT_MAX_BYTES:
                logger.warning("artifact %s is %d bytes; over the limit, skipped", path, size)
                continue
            files.append((_artifact_name(path.relative_to(trial_dir).as_posix()), path.read_bytes()))
    # A few statements for the whole trial, not two per file: this runs while the trial
    # still holds its slot.
    objects = objects_put_many(org=org, blobs=[data for _, data in files])
    names = list(dict.fromkeys(name[:500] for name, _ in files))
    recorded = set(Artifact.objects.filter(trial=trial).values_list("name", flat=True))
    new: dict[str, Artifact] = {}
    for name, data in files:
        if name[:500] in recorded or name[:500] in new:
            continue  # the first file of a name is kept, as on a repeat
        obj = objects[hashlib.sha256(data).hexdigest()]
        new[name[:500]] = Artifact(
            trial=trial,
            name=name[:500],
            run=trial.run,
            kind=_artifact_kind(name),
            object=obj,
            sha256=obj.sha256,
            size=obj.size,
        )
    # ignore_conflicts: a concurrent repeat of this publication may have recorded a name first.
    Artifact.objects.bulk_create(list(new.values()), ignore_conflicts=True)
    by_name = {a.name: a for a in Artifact.objects.filter(trial=trial)}
    return [by_name[name] for name in names if name in by_name]


def _artifact_name(relative: str) -> str:
    """A file name as text: the agent may have made names that are not UTF-8 (Python holds
    those bytes as surrogates, which no database or JSON document takes). Each such byte is
    written ``%XX``; every valid name is kept as it is."""
    return re.sub(r"[\udc80-\udcff]", lambda m: f"%{ord(m.group()) - 0xDC00:02X}", relative)


def _artifact_kind(name: str) -> str:
    top = name.split("/", 1)[0]
    if top == "artifacts" and "/outputs/" in f"/{name}":
        return "output"
    if name.startswith("artifacts/workdir/"):
        return "work"
    if top == "agent" and (name.endswith(".jsonl") or name.removeprefix("agent/") in _TRANSCRIPTS):
        return "transcript"
    return {"agent": "agent", "verifier": "verifier", "artifacts": "artifact"}.get(top, "trial")
