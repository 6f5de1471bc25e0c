"""Writes for runs: admission (submission, regrade), scheduling and cancellation.

Expansion into trials is apps.runs.dispatch, settlement apps.runs.settlement, leases and
the reaper apps.runs.leases. Lock order everywhere: a worker node's row (admission only)
first, then the Run row, then its Lease rows, then its trials, groups and reservations.
Every event append takes the run row's lock (it bumps `last_event_seq`), so events of one
run commit in sequence order and a reader never sees seq N+1 before seq N. Status changes
go through apps.runs.transitions (claims, each with its event).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from apps.accounts.models import Organization
from apps.core.bulk import row_insert
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.core.send_batch import ProcessBatcher
from apps.datasets.models import DatasetVersion
from apps.datasets.services import dataset_version_local_check
from apps.profiles.models import ProfileVersion
from apps.profiles.selectors import profile_version_recipe
from apps.runs.bindings import model_binding_resolve
from apps.runs.events import event_append, events_append
from apps.runs.models import TERMINAL_STATUSES, Artifact, Run, RunKind, RunSpec, RunStatus
from apps.runs.pins import dataset_version_pinned, pins_forget, profile_version_pinned
from apps.runs.plans import plan_normalize, plan_uses_local_sandbox
from apps.runs.settlement import run_cancel_settle
from apps.runs.transitions import run_transition
from synth_common.canonical import canonical_digest

__all__ = ["event_append", "events_append"]  # re-exported: the events API callers know

logger = logging.getLogger(__name__)

# A cancel settles this many not-started trials in the caller (each batch its own short
# transaction); the control queue settles the rest (runs.cancel_settle), the sweeper
# finishes what a lost message left.
CANCEL_INLINE_BATCHES = 4

# A mixed run (`actors`) compares 2..8 harnesses on one model; more would leave each too few
# groups per batch to compare.
ACTORS_MIN, ACTORS_MAX = 2, 8
MIXED_KINDS = frozenset({RunKind.TRAIN, RunKind.EVALUATE})


# --------------------------------------------------------------------------- admission


@dataclass(frozen=True)
class ProfileRef:
    name: str
    version: int | None
    digest: str | None


def _profile_ref(value: Any, *, field: str) -> ProfileRef | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("profile"), str) or not value["profile"]:
        raise ValidationFailed(f'{field} must be {{"profile": NAME, "version": N}}', field=field)
    extra = set(value) - {"profile", "version", "digest"}
    if extra:
        raise ValidationFailed(
            f"{field}: unknown field {sorted(extra)[0]!r}",
            field=f"{field}.{sorted(extra)[0]}",
        )
    version = value.get("version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
        raise ValidationFailed(f"{field}.version must be a positive integer", field=f"{field}.version")
    digest = value.get("digest")
    if digest is not None:
        if not isinstance(digest, str):
            raise ValidationFailed(f"{field}.digest must be a string", field=f"{field}.digest")
        digest = digest.removeprefix("sha256:")
    return ProfileRef(name=value["profile"], version=version, digest=digest)


def run_request_normalize(*, body: Any) -> dict[str, Any]:
    """The submission body in one canonical shape; its digest identifies the request."""
    if not isinstance(body, dict):
        raise ValidationFailed("the request body must be a JSON object")
    allowed = {"kind", "dataset", "actor", "actors", "judge", "plan"}
    extra = set(body) - allowed
    if extra:
        name = sorted(extra)[0]
        raise ValidationFailed(f"unknown field {name!r}", field=name)
    kind = body.get("kind")
    if kind not in RunKind.values:
        raise ValidationFailed(f"kind must be one of {', '.join(RunKind.values)}", field="kind")
    dataset = body.get("dataset")
    if not isinstance(dataset, str) or not dataset:
        raise ValidationFailed("dataset must be a reference ORG/NAME@VERSION", field="dataset")
    actors = _actors_normalize(body=body, kind=kind)
    if actors is None and body.get("actor") is None:
        raise ValidationFailed("actor is required", field="actor")
    actor = actors[0] if actors else _profile_ref(body.get("actor"), field="actor")
    judge = _profile_ref(body.get("judge"), field="judge")
    request = {
        "kind": kind,
        "dataset": dataset,
        "actor": actor.__dict__ if actor else None,
        "judge": judge.__dict__ if judge else None,
        "plan": plan_normalize(kind=kind, plan=body.get("plan")),
    }
    if actors:
        # Only a mixed request carries the key, so a one-actor request keeps its digest.
        request["actors"] = [ref.__dict__ for ref in actors]
    return request


def _actors_normalize(*, body: dict[str, Any], kind: str) -> list[ProfileRef] | None:
    """`actors`, a list of profile references used instead of `actor`: the run's groups are
    shared among them (apps.runs.dispatch), each group running one of them."""
    value = body.get("actors")
    if value is None:
        return None
    if kind not in MIXED_KINDS:
        raise ValidationFailed(f"actors is for runs of kind {' or '.join(sorted(MIXED_KINDS))}", field="actors")
    if body.get("actor") is not None:
        raise ValidationFailed("give actor or actors, not both", field="actors")
    if not isinstance(value, list) or not ACTORS_MIN <= len(value) <= ACTORS_MAX:
        raise ValidationFailed(
            f"actors must be a list of {ACTORS_MIN} to {ACTORS_MAX} profile references", field="actors"
        )
    refs = [_profile_ref(item, field=f"actors[{i}]") for i, item in enumerate(value)]
    for i, ref in enumerate(refs):
        if ref is None:
            raise ValidationFailed(f'actors[{i}] must be {{"profile": NAME, "version": N}}', field=f"actors[{i}]")
    return [ref for ref in refs if ref is not None]


def _resolve_profile(
    *, org: Organization, ref: ProfileRef, field: str, cached: bool
) -> tuple[ProfileVersion, dict[str, Any]]:
    """The profile version a reference names, and its recipe (shared: read it only)."""
    if ref.version is None:
        from apps.profiles.selectors import profile_version_latest

        version = profile_version_latest(org=org, name=ref.name)
        recipe = profile_version_recipe(profile_version=version)
    else:
        version, recipe = profile_version_pinned(org=org, name=ref.name, version=ref.version, cached=cached)
    if ref.digest is not None and ref.digest != version.digest:
        raise Conflict(
            f"{field}: {ref.name}@{version.version} has digest sha256:{version.digest}, not sha256:{ref.digest}",
            field=f"{field}.digest",
        )
    return version, recipe


@dataclass(frozen=True)
class _PinnedActor:
    version: ProfileVersion
    binding: dict[str, Any]
    engine: str

    def described(self) -> dict[str, Any]:
        return {
            "id": self.version.pk,
            "profile": self.version.profile.name,
            "version": self.version.version,
            "digest": self.version.digest,
            "engine": self.engine,
        }


def _actors_pin(
    *, org: Organization, refs: list[ProfileRef], fields: list[str], train: bool, cached: bool
) -> list[_PinnedActor]:
    """Resolve the run's actors and their model bindings. Several actors must bind the same
    model (the same route, or the same checkpoint): a mixed run compares harnesses on one
    model, and a train run's learner trains that one model from every group."""
    pinned: list[_PinnedActor] = []
    for ref, field in zip(refs, fields, strict=True):
        try:
            version, recipe = _resolve_profile(org=org, ref=ref, field=field, cached=cached)
        except NotFound as exc:
            if field == "actor":
                raise  # a one-actor run answers as it always has
            raise NotFound(f"{field}: {exc}", field=field) from None
        if any(p.version.pk == version.pk for p in pinned):
            raise ValidationFailed(f"{field}: {ref.name}@{version.version} is listed twice", field=field)
        binding = model_binding_resolve(org=org, binding=recipe.get("model") or {}, field=field)
        if pinned and binding != pinned[0].binding:
            raise ValidationFailed(
                f"{field} binds {binding or 'no model'}, not {pinned[0].binding}: every actor of a run must bind "
                "the same model (the same route or the same checkpoint)",
                field=f"{field}.model",
            )
        if train:
            _trainable_check(binding=binding, field=field)
            _harness_checked(recipe=recipe, field=field)
        pinned.append(
            _PinnedActor(version=version, binding=binding, engine=(recipe.get("engine") or {}).get("name", ""))
        )
    return pinned


def _existing_run(*, org: Organization, idempotency_key: str, request_digest: str) -> Run | None:
    run = Run.objects.filter(org=org, idempotency_key=idempotency_key).first()
    if run is not None and run.request_digest != request_digest:
        raise Conflict(
            "Idempotency-Key was already used for a different request body",
            field="Idempotency-Key",
        )
    return run


def _trainable_check(*, binding: dict[str, Any], field: str = "actor") -> None:
    """A train run must bind a model route that exists and may be trained: refused at
    submission rather than failing once admitted."""
    from apps.trials.model_access import model_route_get  # lazy: runs' models do not depend on the proxy

    name = binding.get("route")
    if not name:
        raise ValidationFailed(
            f"a train run's {field} must bind a model (a route or a checkpoint)", field=f"{field}.model"
        )
    route = model_route_get(name=name)
    if route is None:
        raise ValidationFailed(f"model route {name!r} does not exist", field=f"{field}.model.route")
    if not route.trainable:
        raise ValidationFailed(f"model route {name!r} is not trainable", field=f"{field}.model.route")


def _harness_checked(*, recipe: dict[str, Any], field: str = "actor") -> None:
    """A train run learns from what its harness sends: an engine whose harness must be
    checked (apps.trials.harness_check.identity) needs a passing check of the build this
    installation runs, refused at submission with the command that checks it."""
    from apps.proxy.models import HarnessCheck  # lazy, as above
    from apps.trials.harness_check.identity import REQUIRED_FOR_TRAINING, HarnessUnavailable, harness_identity

    engine = (recipe.get("engine") or {}).get("name")
    if engine not in REQUIRED_FOR_TRAINING:
        return
    how = f"run `manage.py harness_check {engine}` on this installation"
    try:
        identity = harness_identity(engine=engine)
    except HarnessUnavailable as exc:
        raise ValidationFailed(
            f"a train run on engine {engine} needs its harness checked: {exc}; then {how}", field=f"{field}.engine"
        ) from None
    if not HarnessCheck.objects.filter(engine=engine, digest=identity.digest, passed=True).exists():
        raise ValidationFailed(
            f"the installed {engine} harness ({identity.version or 'unknown version'}, sha256 {identity.digest[:16]}) "
            f"has no passing harness check; {how}",
            field=f"{field}.engine",
        )


def _regrade_source_check(*, org: Organization, source_id: str, judge: ProfileVersion | None) -> None:
    if judge is None:
        raise ValidationFailed("a regrade needs a judge", field="judge")
    source = Run.objects.filter(org=org, pk=source_id).first()
    if source is None:
        raise NotFound(f"run {source_id} not found", field="plan.source_run")
    if not source.is_terminal:
        raise Conflict(f"run {source_id} is {source.status}; regrade it once it has ended", field="plan.source_run")
    if not Artifact.objects.filter(run=source, kind="work").exists():
        raise Conflict(
            f"run {source_id} retained no outputs to re-assess (its attempts' workdirs were not kept: "
            "plan.retain_workdir)",
            field="plan.source_run",
        )


def run_regrade(
    *, org: Organization, user: AbstractBaseUser | None, run_id: str, idempotency_key: str, body: Any
) -> tuple[Run, bool]:
    """Re-assess a finished run's retained outputs with a judge: a new run of kind regrade
    on the same dataset version and actor, one trial per retained attempt. ``body`` is
    ``{"judge": <profile ref>, "plan": {...}}`` (plan optional). Idempotent like run_submit."""
    if not isinstance(body, dict):
        raise ValidationFailed("the request body must be a JSON object")
    extra = set(body) - {"judge", "plan"}
    if extra:
        raise ValidationFailed(f"unknown field {sorted(extra)[0]!r}", field=sorted(extra)[0])
    source = Run.objects.select_related("spec__actor_version__profile").filter(org=org, pk=run_id).first()
    if source is None:
        raise NotFound(f"run {run_id} not found")
    plan = body.get("plan") or {}
    if not isinstance(plan, dict):
        raise ValidationFailed("plan must be a JSON object", field="plan")
    if plan.get("source_run", run_id) != run_id:
        raise ValidationFailed("plan.source_run must be the run being regraded", field="plan.source_run")
    actor = source.spec.actor_version
    submission = {
        "kind": RunKind.REGRADE.value,
        "dataset": source.spec.dataset_ref,
        "actor": {"profile": actor.profile.name, "version": actor.version},
        "judge": body.get("judge"),
        "plan": {**plan, "source_run": run_id},
    }
    return run_submit(org=org, user=user, idempotency_key=idempotency_key, body=submission)


@dataclass(frozen=True)
class _Pins:
    dataset_version: DatasetVersion
    pinned: list[_PinnedActor]
    judge: ProfileVersion | None
    judge_binding: dict[str, Any] | None


def _admission_pin(*, org: Organization, request: dict[str, Any], body: Any, cached: bool) -> _Pins:
    """Resolve and pin a normalized request's inputs (reads only; versions from apps.runs.pins
    when ``cached``); a train run's plan is completed in ``request`` by the learner's resolver."""
    local = plan_uses_local_sandbox(plan=request["plan"])
    dataset_version = dataset_version_pinned(
        org=org, reference=request["dataset"], with_local_support=local, cached=cached
    )
    if local:
        dataset_version_local_check(dataset_version=dataset_version, task_names=request["plan"].get("task_names"))
    fields = [f"actors[{i}]" for i in range(len(request["actors"]))] if "actors" in request else ["actor"]
    refs = [ProfileRef(**ref) for ref in request.get("actors", [request["actor"]])]
    pinned = _actors_pin(org=org, refs=refs, fields=fields, train=request["kind"] == RunKind.TRAIN, cached=cached)
    model_binding = pinned[0].binding
    judge, judge_recipe = (
        _resolve_profile(org=org, ref=ProfileRef(**request["judge"]), field="judge", cached=cached)
        if request["judge"]
        else (None, None)
    )
    if request["kind"] == RunKind.REGRADE:
        _regrade_source_check(org=org, source_id=request["plan"]["source_run"], judge=judge)
    if request["kind"] == RunKind.TRAIN:
        # The learner checks the plan against the weights it starts from (a continued
        # checkpoint's rank, backend, seed, dataset cursor) and pins what they fix.
        given = set(body["plan"]) if isinstance(body.get("plan"), dict) else set()
        resolve_train_plan = import_string(settings.SYNTH_TRAIN_PLAN_RESOLVER)
        request["plan"] = resolve_train_plan(
            org=org, binding=model_binding, plan=request["plan"], given=given, dataset_digest=dataset_version.digest
        )
    # The judge's weights are pinned too (a checkpoint judge is resolved now, not per trial).
    judge_binding = None
    if judge_recipe is not None:
        judge_model = judge_recipe.get("model")
        judge_binding = model_binding_resolve(org=org, binding=judge_model, field="judge") if judge_model else None
    return _Pins(dataset_version=dataset_version, pinned=pinned, judge=judge, judge_binding=judge_binding)


def run_submit(
    *,
    org: Organization,
    user: AbstractBaseUser | None,
    idempotency_key: str,
    body: Any,
) -> tuple[Run, bool]:
    """Admit a run: resolve and pin its inputs, then write Run, RunSpec and `run.created`
    in one transaction. Returns (run, created). Same key + same body returns the first
    run; same key + another body is a Conflict."""
    if not idempotency_key or len(idempotency_key) > 200:
        raise ValidationFailed("Idempotency-Key must be 1-200 characters", field="Idempotency-Key")
    request = run_request_normalize(body=body)
    request_digest = canonical_digest(request)

    admit = functools.partial(
        _run_admit,
        org=org,
        user=user,
        idempotency_key=idempotency_key,
        request_digest=request_digest,
        body=body,
    )
    admitted = admit(request=request, cached=True)
    if admitted is None:
        # A cached pin went away since it was read (a purged version; SQLite allows a DELETE):
        # admitted again from the database, which gives the answer (most likely a 404).
        pins_forget()
        admitted = admit(request=run_request_normalize(body=body), cached=False)
        assert admitted is not None  # uncached, a failed insert raises
    return admitted


def _run_admit(
    *,
    org: Organization,
    user: AbstractBaseUser | None,
    idempotency_key: str,
    request: dict[str, Any],
    request_digest: str,
    body: Any,
    cached: bool,
) -> tuple[Run, bool] | None:
    """run_submit's admission and insert; None when, with ``cached`` pins, the insert met
    a foreign key that no longer holds (see apps.runs.pins)."""
    # The Idempotency-Key is looked up only when admission fails here or its insert meets
    # the key's unique constraint, not before every admission (one query less for each
    # new run): a replay still answers with its first run, whatever its inputs resolve to
    # now (a dataset or profile version since removed), and another body is a Conflict.
    try:
        pins = _admission_pin(org=org, request=request, body=body, cached=cached)
    except Exception:
        existing = _existing_run(org=org, idempotency_key=idempotency_key, request_digest=request_digest)
        if existing is None:
            raise
        return existing, False
    dataset_version, pinned, judge = pins.dataset_version, pins.pinned, pins.judge
    actor, model_binding, judge_binding = pinned[0].version, pinned[0].binding, pins.judge_binding

    try:
        with transaction.atomic():
            # Inserted as save(force_insert=True) writes them, without the ORM's per-row
            # compile (apps.core.bulk.row_insert): a submission's two rows, every run.
            run = Run(
                org=org,
                created_by=user,
                kind=request["kind"],
                idempotency_key=idempotency_key,
                request_digest=request_digest,
            )
            row_insert(obj=run, prepared=True)
            spec = RunSpec(
                run=run,
                dataset_version=dataset_version,
                dataset_ref=dataset_version.reference,
                dataset_digest=dataset_version.digest,
                actor_version=actor,
                actor_digest=actor.digest,
                judge_version=judge,
                judge_digest=judge.digest if judge else "",
                model_binding=model_binding,
                actors=[p.described() for p in pinned] if "actors" in request else [],
                judge_binding=judge_binding,
                plan=request["plan"],
            )
            row_insert(obj=spec, prepared=True)
            created = event_append(
                run_id=run.id,
                type="run.created",
                data={
                    "kind": run.kind,
                    "dataset": dataset_version.reference,
                    "dataset_digest": dataset_version.digest,
                    "tasks": dataset_version.task_count,
                    "actor": {
                        "profile": actor.profile.name,
                        "version": actor.version,
                        "digest": actor.digest,
                    },
                    **({"actors": [p.described() for p in pinned]} if "actors" in request else {}),
                    "judge": (
                        {
                            "profile": judge.profile.name,
                            "version": judge.version,
                            "digest": judge.digest,
                        }
                        if judge
                        else None
                    ),
                },
            )
            # The returned run is what a re-read would give (its spec is cached by the
            # create above): the caller can answer without reading it back.
            assert created is not None  # appended now: no run_locked block holds it
            run.last_event_seq = created.seq
            transaction.on_commit(lambda: run_schedule_enqueue(run_id=run.id))
    except IntegrityError:
        # A concurrent submission with the same key won the unique constraint.
        existing = _existing_run(org=org, idempotency_key=idempotency_key, request_digest=request_digest)
        if existing is not None:
            return existing, False
        if cached:
            return None
        raise
    return run, True


def _schedule_send(run_ids: list[str]) -> None:
    from apps.runs.tasks import run_schedule_many_task

    run_schedule_many_task.apply_async(args=[run_ids], retry=False)


# The gateway process' admitted runs, sent to the control worker in batches.
SCHEDULES = ProcessBatcher(send=_schedule_send, what="runs.schedule_many")


def run_schedule_enqueue(*, run_id: str) -> None:
    """Hand an admitted (committed) run to the control worker, which schedules it. In the
    gateway's process the id joins the process' next "runs.schedule_many" message, sent within
    SYNTH_GATEWAY_SCHEDULE_BATCH_SECONDS: a message per submission cost the gateway a fifth of
    its CPU per run. A run whose message is lost stays accepted, and the sweeper schedules it."""
    if settings.SYNTH_GATEWAY_PROCESS and settings.SYNTH_GATEWAY_SCHEDULE_BATCH_SECONDS > 0:
        SCHEDULES.get(seconds=settings.SYNTH_GATEWAY_SCHEDULE_BATCH_SECONDS).add(run_id)
        return
    from apps.runs.tasks import run_schedule_task

    run_schedule_task.delay(run_id)


def run_schedule_many(*, run_ids: list[str]) -> None:
    """Schedule each run in turn. One that fails (the database away, a run since deleted) is
    logged and left as it is, for the sweeper, without holding back the others."""
    for run_id in run_ids:
        try:
            run_schedule(run_id=run_id)
        except Exception:  # noqa: BLE001 - the sweeper drives an accepted run again
            logger.warning("scheduling run %s failed in a batch; the sweeper will retry", run_id, exc_info=True)


def run_schedule(*, run_id: str) -> Run:
    """Move an admitted run to `queued` once its prerequisites are durably ready.

    Prerequisites: the pinned spec is committed (it is, since this runs after commit)
    and every task package of the dataset version is a committed, verified object.
    """
    with transaction.atomic():
        run = Run.objects.select_for_update(no_key=True, of=("self",)).select_related("spec").get(pk=run_id)
        if run.status != RunStatus.ACCEPTED:
            return run  # already scheduled, cancelled, ...: nothing to do (safe to run twice)
        missing = run.spec.dataset_version.entries.filter(task_version__archive__isnull=True).count()
        if missing:
            error = f"{missing} task packages are not in the object store"
            run_transition(
                run=run, to=RunStatus.FAILED, event="run.failed", data={"error": error}, values={"error": error}
            )
            return run
        run_transition(run=run, to=RunStatus.QUEUED, event="run.queued")
        from apps.runs.tasks import run_dispatch_task

        transaction.on_commit(lambda: run_dispatch_task.delay(run.id))
    return run


def _cancel_mark(*, run: Run, reason: str) -> bool:
    """The cancel's one short transaction. True if the run is now cancelling (its trials
    still to settle); False if it ended here or had ended or was cancelling already."""
    now = timezone.now()
    # The run may move between the read and the claim (dispatched, claimed): then the claim
    # fails and the next round tries the move that fits its new status.
    for _ in range(3):
        status = Run.objects.filter(pk=run.id).values_list("status", flat=True).get()
        if status in TERMINAL_STATUSES or status == RunStatus.CANCELLING:
            return False
        if status == RunStatus.RUNNING:
            if run_transition(
                run=run,
                to=RunStatus.CANCELLING,
                source={RunStatus.RUNNING},
                event="run.cancel_requested",
                data={"reason": reason},
                values={"cancel_requested_at": now},
            ):
                return True
        elif run_transition(
            run=run,
            to=RunStatus.CANCELLED,
            source={RunStatus.ACCEPTED, RunStatus.QUEUED},
            event="run.cancelled",
            data={"reason": reason},
            values={"cancel_requested_at": now},
        ):
            return False
    raise Conflict(f"run {run.id} kept changing status; cancel it again")


def run_cancel(*, org: Organization, run_id: str, reason: str = "cancelled by operator") -> Run:
    """Cancel a run. Unclaimed runs end at once. A running run becomes `cancelling` in one
    short transaction; its trials that have not started are then settled in batches, each
    its own short transaction (a few here, the rest by the control queue); running trials
    keep their leases and learn of it at their next heartbeat. The run ends `cancelled`
    when its last trial ends."""
    run = Run.objects.filter(org=org, pk=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} not found")
    if _cancel_mark(run=run, reason=reason):
        if not run_cancel_settle(run_id=run.id, max_batches=CANCEL_INLINE_BATCHES):
            from apps.runs.tasks import run_cancel_settle_task

            transaction.on_commit(lambda: run_cancel_settle_task.delay(run.id))
    run.refresh_from_db()
    return run
