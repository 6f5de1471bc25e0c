"""One train-run batch with uneven attempts, lockstep against pipelined, through the real
services and the local training backend. Prints figures; asserts nothing; the last line is
one JSON object {"sequential_s", "pipelined_s", "ratio", "max_abs_kl", "staleness_steps", ...}.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/synth_bench .venv/bin/python bench/training_pipeline.py \\
        [--groups 8] [--group-size 2] [--prompt-tokens 1500] [--max-tokens 4] [--slow-seconds 0 (calibrated)]
        [--pairs 5] [--no-pin] [--no-prepare]

Each mode is its own train run (same tasks, same seeds, so the same tokens and rewards) in
its own organization. Attempts run on ``--workers`` threads as trials workers would: each
samples its group's binding with the proxy's local sampler (the route's tiny model, or the
checkpoint's adapter), its capture is staged and settled as the proxy does and published as
the evidence worker does; then the attempt "works" (one group much longer than the others:
``--slow-seconds``, by default the time the other groups' training took in a warm-up batch)
and its trial settles with a reward (the mean of (id mod 97) / 96 over its sampled ids).

* sequential (lockstep): the learner waits for the whole batch, then the training worker
  runs ``update_apply``: every group's data, forward/backward, the optimizer step and the save.
* pipelined: as each group settles, the training worker runs ``step_feed``: its contribution
  and forward/backward; when the slow group settles, its own forward/backward, the optimizer
  step and the save.

In both modes, as each group settles (after the feed's message, in the pipelined one), the
attempts' process prepares its contribution as the evidence worker does (``contribution_prepare``: its datums stored packed), so the training
worker reads one object per group instead of the group's evidence; with ``--no-prepare`` the
training worker records every group itself.

The training worker is a process of its own, spawned once and warmed by two batches (one of
each mode), as the training queue's worker is deployed: its interpreter is not the attempts'.
With ``--pin`` (the default) it runs on a CPU of its own and this process (the attempts and
their sampler) on the others, as a trainer has its own device: on 2 cores, the pipelined
batch's first forward/backward passes otherwise share a core with the groups still sampling
(0.15-0.16 s instead of 0.12). PostgreSQL's backends run where the kernel puts them.

Both are timed from the batch's groups made to its checkpoint recorded, in ``--pairs``
pairs of batches whose order alternates; the figures are the pair with the median ratio.
``floor_ratio`` is the best ratio that pair's timing allows: a pipeline that trains each
group as soon as it has settled and the one before it is trained, at the lockstep update's
time per group, then saves. Its trainer can start only once the first group has settled,
and the calibrated slow group settles about when the others' training could end: with 8
groups that best is about 0.6 on 2 cores, with 16 about 0.55.
``max_abs_kl`` is the largest |kl_sample_train| (sampler vs trainer logprobs, staleness 0)
of any group of any update, and every update's adapter weights are compared
(``weights_max_abs_diff``). The
database in DATABASE_URL is created if missing and migrated; the broker is in memory (no
Celery worker runs: the bench calls the services).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SCORE_MOD = 97  # reward: the mean of (id mod 97) / 96 over the sampled ids (attempts differ)


class Attempts:
    """Runs a train run's attempts in-process, as trials workers and the proxy would, with
    one sampler per binding (the proxy's local sampler, adapters from the object store)."""

    def __init__(self, *, prompt_tokens: int, max_tokens: int, workers: int = 8, publish: bool = False) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        # Publish each call's evidence at once, as the evidence worker does; else the learner
        # publishes it when it reads the group (what a lost publication message leaves it).
        self.publish = publish
        self._samplers: dict[str, Any] = {}
        self._lock = threading.Lock()
        # The trials worker slots: threads that live for the whole bench and keep their
        # database connections, as a trials worker's processes do.
        self.slots = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="slot")

    def sampler(self, binding: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        from apps.proxy.calls import sampler_config
        from apps.proxy.models import ModelRoute
        from apps.proxy.samplers.factory import sampler_build

        snapshot = binding.get("snapshot", "")
        with self._lock:
            if snapshot not in self._samplers:
                route = ModelRoute.objects.get(name=binding["route"])
                config = sampler_config(route=route, snapshot=snapshot)
                self._samplers[snapshot] = (sampler_build(backend=route.sampler_backend, config=config), route)
            return self._samplers[snapshot]

    def prompt(self, *, position: int) -> list[int]:
        import random

        rng = random.Random(position)
        return [rng.randrange(1, 50_000) for _ in range(self.prompt_tokens)]

    def run(self, *, trial_id: str, work_seconds: float = 0.0) -> float:
        """Sample, capture, work, settle one attempt; returns its reward."""
        from django.db import transaction
        from django.utils import timezone

        from apps.proxy import capture
        from apps.proxy.models import Delivery
        from apps.proxy.samplers.base import SampleRequest
        from apps.runs.models import Run, Trial
        from apps.runs.settlement import trial_settle

        trial = Trial.objects.select_related("group", "run").get(pk=trial_id)
        Trial.objects.filter(pk=trial_id).update(status="running", started_at=timezone.now())
        sampler, route = self.sampler(trial.group.sampler)
        prompt = self.prompt(position=trial.group.position)
        seed = trial.group.step * 100_000 + trial.group.position * 100 + trial.attempt
        # In arrival order, as the proxy serves concurrent calls to a local sampler.
        out = sampler.sample_in_turn(
            SampleRequest(prompt_ids=prompt, max_tokens=self.max_tokens, stop_token_ids=[], seed=seed)
        )
        rec = capture.CaptureRecord(
            org_id=trial.run.org_id,
            principal_kind="attempt",
            credential_id="",
            token_id="",
            run_id=trial.run_id,
            trial_id=trial.id,
            correlation_id=trial.id,
            session_id=trial.id,
            agent_id="",
            parent_agent_id="",
            request_id=f"req-{trial.id}",
            route_id=route.id,
            route={"name": route.name, "family": route.family},
            model_requested=route.name,
            stream=False,
            snapshot=out.snapshot,
            request={"messages": [{"role": "user", "content": "go"}]},
            sampling={"max_tokens": self.max_tokens},
            fitting=[],
            original_prompt_tokens=len(prompt),
            prompt_ids=prompt,
            prompt_reused_ids=0,
            output_ids=out.token_ids,
            logprobs=out.logprobs,
            finish=out.finish,
        )
        interaction = capture.interaction_stage(rec=rec)  # packed prompt ids, as the proxy stages them
        capture.interaction_settle(interaction_id=interaction.id, delivery=Delivery.DELIVERED)
        if self.publish:  # the evidence worker's part (queue "evidence"), as soon as the call settled
            capture.interaction_publish(interaction_id=interaction.id)
        if work_seconds:
            time.sleep(work_seconds)  # the attempt's tools and tests, in its sandbox
        reward = sum((t % SCORE_MOD) / (SCORE_MOD - 1) for t in out.token_ids) / len(out.token_ids)
        with transaction.atomic():
            run = Run.objects.select_for_update(of=("self",)).get(pk=trial.run_id)
            trial_settle(run=run, trial=Trial.objects.get(pk=trial_id), status="succeeded", rewards={"reward": reward})
        return reward


def make_train_run(*, org_slug: str, tasks: int, plan: dict[str, Any]) -> Any:
    from apps.accounts.services import org_get_or_create
    from tests.factories import make_train_run as factory

    return factory(org=org_get_or_create(slug=org_slug), tasks=tasks, **plan)


def batch_run(
    *,
    attempts: Attempts,
    run_id: str,
    step: int,
    slow_position: int | None,
    slow_seconds: float,
    on_group: Any = None,
    prepare: bool = True,
) -> None:
    """Run every attempt of ``step`` on the attempts' slots, the slow group's first (they
    sample, then work longest); each time one of its groups settles, call ``on_group(step)``
    and prepare its contribution (with ``prepare``, as the evidence worker does)."""
    from apps.runs.models import GroupStatus, SamplingGroup, Trial
    from apps.training.pipeline import contribution_prepare

    trials = list(
        Trial.objects.filter(run_id=run_id, group__step=step)
        .order_by("group__position", "attempt")
        .values_list("id", "group_id", "group__position")
    )
    trials.sort(key=lambda t: t[2] != slow_position)

    def one(trial: tuple[str, str, int]) -> None:
        attempts.run(trial_id=trial[0], work_seconds=slow_seconds if trial[2] == slow_position else 0.0)
        if SamplingGroup.objects.filter(pk=trial[1], status=GroupStatus.SETTLED).exists():
            # group.settled: the training queue's message and the evidence worker's part go
            # out together, as the receiver sends them; the feed may find the group before
            # it is prepared (and records it itself if its client has nothing queued).
            if on_group is not None:
                on_group(step)
            if prepare:
                contribution_prepare(run_id=run_id, group_id=trial[1])

    list(attempts.slots.map(one, trials))


def training_worker(inbox: Any, outbox: Any, pin: int | None = None) -> None:
    """The training queue's one process (spawned: its own interpreter, as the deployed
    training worker is). Takes ("warm", run, 0) as the run starts (its training
    client made while the batch samples, as the start task does), ("feed", run, step) as
    each group settles and ("apply", run, step) for a lockstep batch; answers each message
    with None or the error."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    import torch

    torch.set_num_threads(1)
    if pin is not None:
        os.sched_setaffinity(0, {pin})
    from apps.training.clients import client_warm
    from apps.training.models import Trainer, TrainerStatus
    from apps.training.pipeline import step_feed
    from apps.training.updates import update_apply

    while (message := inbox.get()) is not None:
        kind, run_id, step = message
        try:
            if kind == "warm":
                client_warm(run_id=run_id)
            elif kind == "feed":
                step_feed(run_id=run_id, step=step)
                trainer = Trainer.objects.get(run_id=run_id)
                if trainer.status == TrainerStatus.UPDATING and trainer.step == step:
                    update_apply(run_id=run_id, step=step)
            else:
                update_apply(run_id=run_id, step=step)
            outbox.put(None)
        except BaseException as exc:  # noqa: BLE001 - reported by the bench
            outbox.put(f"{type(exc).__name__}: {exc}")


class TrainingWorker:
    """The spawned training process and its two queues; every message is answered, so
    ``drain`` returns once the process has done everything it was given."""

    def __init__(self, *, pin: int | None = None) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.inbox, self.outbox = context.Queue(), context.Queue()
        self.process = context.Process(target=training_worker, args=(self.inbox, self.outbox, pin), daemon=True)
        self.process.start()
        self.sent = 0
        self._lock = threading.Lock()

    def send(self, kind: str, run_id: str, step: int) -> None:
        with self._lock:
            self.sent += 1
        self.inbox.put((kind, run_id, step))

    def drain(self) -> None:
        errors = [error for error in (self.outbox.get() for _ in range(self.sent)) if error is not None]
        self.sent = 0
        if errors:
            raise RuntimeError(f"the training worker failed: {errors[0]}")

    def close(self) -> None:
        self.inbox.put(None)
        self.process.join()


def one_batch(
    *,
    args: argparse.Namespace,
    mode: str,
    slow_seconds: float,
    attempts: Attempts,
    org: str,
    worker: TrainingWorker,
) -> dict[str, Any]:
    from apps.training.models import GroupContribution, LearningUpdate, Trainer
    from apps.training.services import step_settled, training_start

    plan = {
        "steps": 1,
        "batch_size": args.groups,
        "group_size": args.group_size,
        "learning_rate": 0.01,
        "lora_rank": 4,
        "max_concurrency": 1000,
    }
    run = make_train_run(org_slug=org, tasks=args.groups, plan=plan)
    training_start(run_id=run.id)
    worker.send("warm", run.id, 0)
    slow = args.groups - 1
    if mode == "sequential":
        batch_run(
            attempts=attempts,
            run_id=run.id,
            step=0,
            slow_position=slow,
            slow_seconds=slow_seconds,
            prepare=args.prepare,
        )
        assert step_settled(run_id=run.id, step=0)
        worker.send("apply", run.id, 0)
    else:
        batch_run(
            attempts=attempts,
            run_id=run.id,
            step=0,
            slow_position=slow,
            slow_seconds=slow_seconds,
            on_group=lambda step: worker.send("feed", run.id, step),
            prepare=args.prepare,
        )
    worker.drain()
    from apps.runs.models import SamplingGroup

    settled = [g.settled_at for g in SamplingGroup.objects.filter(run=run, step=0)]
    started = min(g.created_at for g in SamplingGroup.objects.filter(run=run, step=0))
    sampled = (max(settled) - started).total_seconds()
    first = (min(settled) - started).total_seconds()
    update = LearningUpdate.objects.get(run=run, step=0)
    assert update.status == "applied", (update.status, update.error)
    # From the batch's groups made to its checkpoint recorded (the run's set-up and end aside).
    seconds = (update.checkpoint.created_at - started).total_seconds()
    assert Trainer.objects.get(run=run).step == 1
    last = max(settled)
    submitted = list(
        GroupContribution.objects.filter(update=update, submitted_at__isnull=False).values_list(
            "submitted_at", flat=True
        )
    )
    m = update.metrics
    # Where the time after the last group went. A trainer that kept up with the batch has
    # only the last group's forward/backward left then (groups_after_last 1); the others
    # are groups it had not reached (the feeder's call still running, or left to the update).
    tail = (update.checkpoint.created_at - last).total_seconds()
    breakdown = {
        "tail_s": round(tail, 3),
        "groups_after_last": sum(1 for t in submitted if t > last),
        # Until the trainer moved to updating: the feeder's call in flight at the last group.
        "feeder_s": round(max(0.0, (updating_at(run_id=run.id) - last).total_seconds()), 3),
        "gather_s": m.get("gather_seconds"),  # recording the groups not recorded yet
        "client_s": m.get("client_seconds"),  # making the training client (0: the feeder's)
        "train_s": m["train_seconds"],  # the update's forward/backward and optimizer step
        "save_s": m["save_seconds"],  # saving and storing sampler weights and state
        "groups_submitted_late": m["groups_submitted_late"],
    }
    # The rest: checkpoint and update rows, the hand-off to the update.
    breakdown["other_s"] = round(
        tail - sum(breakdown[k] or 0 for k in ("feeder_s", "gather_s", "client_s", "train_s", "save_s")), 3
    )
    return {
        "seconds": seconds,
        "update": update,
        "sampled": sampled,
        "first": first,
        # When each group settled, from the batch's start, in order.
        "settled": sorted((at - started).total_seconds() for at in settled),
        "breakdown": breakdown,
    }


def updating_at(*, run_id: str) -> Any:
    """When the trainer moved to updating (the whole batch settled and fed)."""
    from apps.runs.models import RunEvent

    return RunEvent.objects.get(run_id=run_id, type="training.updating").created_at


def adapter_weights(checkpoint: Any) -> dict[str, Any]:
    from django.conf import settings
    from safetensors.torch import load_file

    from apps.objects.packages import package_materialize

    directory = package_materialize(sha256=checkpoint.sha256, cache_dir=Path(settings.SYNTH_WEIGHTS_CACHE_DIR), keep=8)
    return load_file(str(Path(directory) / "adapter_model.safetensors"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument(
        "--pairs", type=int, default=5, help="lockstep and pipelined batches measured, in alternated order"
    )
    parser.add_argument("--workers", type=int, default=8, help="attempts running at once (trials worker slots)")
    parser.add_argument(
        "--slow-seconds", type=float, default=0.0, help="extra time each attempt of the slow group takes (0: calibrate)"
    )
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the training worker on a CPU of its own, the attempts on the others (a trainer has its own device)",
    )
    parser.add_argument(
        "--prepare",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="each settled group's contribution prepared where it settled, as the evidence worker does "
        "(--no-prepare: the training worker records every group itself)",
    )
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    args = parser.parse_args()

    os.environ["DATABASE_URL"] = args.database_url or "postgres://postgres@127.0.0.1:5432/synth_bench"
    os.environ["CELERY_BROKER_URL"] = "memory://localhost/"  # no worker: the bench calls the services
    os.environ.setdefault("SYNTH_VAR_DIR", tempfile.mkdtemp(prefix="synth-bench-pipeline-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")
    if os.environ["DATABASE_URL"].startswith("postgres"):
        from bench.cancel import ensure_database

        ensure_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import torch

    from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
    from apps.training.models import GroupContribution

    # The sampler and the trainer would be processes of their own: a core each, no thrashing.
    torch.set_num_threads(1)
    stamp = f"{int(time.time())}"
    attempts = Attempts(
        prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, workers=args.workers, publish=True
    )
    route_upsert(**DEFAULT_ROUTE)
    attempts.sampler({"route": DEFAULT_ROUTE["name"]})  # built once, before anything is timed

    # A first lockstep batch without a slow group warms the process (models built, first
    # torch calls) and calibrates: unless told, the slow group then works as long as the
    # other groups' training takes (real batches differ by minutes).
    cpus = sorted(os.sched_getaffinity(0))
    pin = cpus[-1] if args.pin and len(cpus) > 1 else None
    if pin is not None:
        os.sched_setaffinity(0, set(cpus) - {pin})  # the attempts (and their sampler) on the others
    worker = TrainingWorker(pin=pin)  # after the database is migrated: it inherits this environment
    probe = one_batch(
        args=args, mode="sequential", slow_seconds=0.0, attempts=attempts, org=f"probe-{stamp}", worker=worker
    )
    per_group = probe["update"].metrics["train_seconds"] / args.groups
    slow_seconds = args.slow_seconds or round(max(1.0, per_group * (args.groups - 1)), 2)
    # And a pipelined one: the training worker's own first publish of a task (its broker
    # connection, made once per process) and first feed are warm-up too, as they are in a
    # worker that has been serving.
    fed = one_batch(
        args=args, mode="pipelined", slow_seconds=0.0, attempts=attempts, org=f"probe-fed-{stamp}", worker=worker
    )
    print(
        f"warm-up: lockstep batch {probe['seconds']:.2f} s (sampled in {probe['sampled']:.2f} s), "
        f"{per_group:.2f} s of training per group; pipelined batch {fed['seconds']:.2f} s"
    )
    # Pairs of batches, the order alternated (this machine's speed drifts by a few percent
    # within a minute); the figures are the pair with the median ratio, every ratio printed.
    pairs: list[dict[str, Any]] = []
    for index in range(args.pairs):
        order = ("sequential", "pipelined") if index % 2 == 0 else ("pipelined", "sequential")
        results = {}
        for mode in order:
            results[mode] = one_batch(
                args=args,
                mode=mode,
                slow_seconds=slow_seconds,
                attempts=attempts,
                org=f"{mode}-{stamp}-{index}",
                worker=worker,
            )
            m = results[mode]["update"].metrics
            print(
                f"{mode:>10}: {results[mode]['seconds']:.2f} s from batch start to saved checkpoint "
                f"({args.groups} groups x {args.group_size}, slow group +{slow_seconds:.2f} s per attempt; first "
                f"group settled at {results[mode]['first']:.2f} s, last at {results[mode]['sampled']:.2f} s); "
                f"training {m['train_seconds']:.2f} s after the last group, {m['groups_submitted_late']} groups' "
                f"forward/backward then, save {m['save_seconds']:.2f} s; kl_sample_train {m['kl_sample_train']:.2e}"
            )
        results["ratio"] = results["pipelined"]["seconds"] / results["sequential"]["seconds"]
        # What a pipeline that kept up would take: each group trained as soon as it has
        # settled and the group before it is trained, at the lockstep update's time per group
        # (its share of the optimizer step included), then the save. The ratio cannot go
        # below this one.
        lockstep = results["sequential"]["update"].metrics
        end = 0.0
        for at in results["pipelined"]["settled"]:
            end = max(end, at) + lockstep["train_seconds"] / args.groups
        results["floor_s"] = end + lockstep["save_seconds"]
        results["floor_ratio"] = results["floor_s"] / results["sequential"]["seconds"]
        pairs.append(results)
    worker.close()
    ratios = [pair["ratio"] for pair in pairs]
    results = sorted(pairs, key=lambda pair: pair["ratio"])[len(pairs) // 2]
    pipelined = results["pipelined"]["update"]
    sequential = results["sequential"]["update"]
    updates = [pair[mode]["update"] for pair in pairs for mode in ("sequential", "pipelined")]
    # Per group, not the batch's mean (whose terms of either sign can cancel): the largest
    # |mean of sampler - trainer logprob| over the trained tokens of any group of any update.
    kls = [
        abs(v)
        for u in updates
        if u.metrics.get("kl_sample_train_by_staleness")
        for v in u.metrics["kl_sample_train_by_staleness"].values()
    ]
    kls += [abs(u.metrics["kl_sample_train"]) for u in updates]
    kls += [
        abs(kl_sum / tokens)
        for kl_sum, tokens in GroupContribution.objects.filter(
            update__in=updates, metrics__kl_tokens__gt=0
        ).values_list("metrics__kl_sum", "metrics__kl_tokens")
    ]
    # Every update of the same batch, fed group by group or lockstep, gives the same adapter.
    a = adapter_weights(sequential.checkpoint)
    diff = max(float((a[k] - b[k]).abs().max()) for b in (adapter_weights(u.checkpoint) for u in updates) for k in a)
    scale = max(float(t.abs().max()) for t in a.values())
    ratio = results["ratio"]
    for mode in ("sequential", "pipelined"):
        print(
            f"{mode:>10} after the last group: " + ", ".join(f"{k} {v}" for k, v in results[mode]["breakdown"].items())
        )
    print(
        f"pipelined / sequential: {ratio:.2f} (the median of {len(ratios)} pairs: "
        f"{', '.join(f'{r:.3f}' for r in ratios)}); max |kl_sample_train| {max(kls):.2e}"
    )
    print(
        f"a pipeline that trained each group as soon as it and the one before were done would end "
        f"{results['floor_s']:.2f} s after the batch started (groups settled from "
        f"{results['pipelined']['first']:.2f} s to {results['pipelined']['sampled']:.2f} s, "
        f"{results['sequential']['update'].metrics['train_seconds'] / args.groups:.2f} s of training each, then "
        f"the save): pipelined / sequential at best {results['floor_ratio']:.3f} in this pair "
        f"({', '.join(f'{pair["floor_ratio"]:.3f}' for pair in pairs)} in all)"
    )
    print(f"adapters of the {len(updates)} updates: max |difference| {diff:.2e} (max |weight| {scale:.2e})")
    print(
        json.dumps(
            {
                "sequential_s": round(results["sequential"]["seconds"], 3),
                "pipelined_s": round(results["pipelined"]["seconds"], 3),
                "ratio": round(ratio, 3),
                # The best ratio this batch's timing allows (the same pair): see floor_s above.
                "floor_ratio": round(results["floor_ratio"], 3),
                "ratios": [round(r, 3) for r in ratios],
                "max_abs_kl": max(kls),
                "staleness_steps": pipelined.metrics["staleness_max"],
                "slow_seconds": slow_seconds,
                "groups": args.groups,
                "prepare": args.prepare,
                "group_size": args.group_size,
                "weights_max_abs_diff": diff,
                # The time after the last group settled, by where it went, in each mode.
                "breakdown": {mode: results[mode]["breakdown"] for mode in ("sequential", "pipelined")},
                "loadavg": [round(v, 2) for v in os.getloadavg()],
                "trainer_cpu": pin,
            }
        )
    )


if __name__ == "__main__":
    main()
