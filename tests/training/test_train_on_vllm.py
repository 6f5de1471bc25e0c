"""A train run on a vLLM route, through the whole platform: the attempts sample the vLLM-
shaped server (the tiny model behind /v1/completions), the local backend trains the same
weights (the route's train_base), and the next batch samples the checkpoint THROUGH THE
SERVER, its LoRA adapter loaded there at run time, on-policy."""

from __future__ import annotations

import json

import pytest

from apps.datasets.services import dataset_import_dir
from apps.proxy.models import Interaction
from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
from apps.proxy.samplers.local import LocalTorchSampler
from apps.proxy.samplers.vllm_lora import lora_name_for
from apps.runs.models import Run, SamplingGroup
from apps.training.models import Checkpoint, LearningUpdate, UpdateStatus
from tests.cli.conftest import one_line
from tests.harness.conftest import proxy_start
from tests.proxy_samplers.checkpoints import with_adapter
from tests.proxy_samplers.vllm_like_server import CompletionsApp, ServerThread
from tests.trials.conftest import EXAMPLES, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PLAN = {
    "backend": "local",
    "batch_size": 2,
    "group_size": 3,
    "steps": 2,
    "learning_rate": 0.02,
    "lora_rank": 4,
    "max_concurrency": 6,
}


def test_a_train_run_on_a_vllm_route_samples_its_checkpoint_through_the_server(
    stack, synth, alice, tmp_path, proxy_socket, tokenizer_dir, settings
):
    settings.SYNTH_PROXY_SOCKET = proxy_socket
    tiny = LocalTorchSampler.tiny(family="qwen3", seed=0)
    with ServerThread(CompletionsApp(tiny, adapter_loader=with_adapter)) as vllm:
        config = {
            "base_url": vllm.base_url,
            "model": "tiny",
            "adapter_root": str(tmp_path / "adapters"),
            "train_base": DEFAULT_ROUTE["sampler_config"],
        }
        route_upsert(**{**DEFAULT_ROUTE, "sampler_backend": "openai", "sampler_config": config})
        dataset, _ = dataset_import_dir(org=alice.org, name="toys", version="v1", path=EXAMPLES / "train-tasks")
        stack.env.update({"SYNTH_PROXY_SOCKET": str(proxy_socket)})
        proxy_start(stack, socket_path=proxy_socket, tokenizer_dir=tokenizer_dir)
        stack.start_worker("control", queues="control,evidence", concurrency=2, beat=True)
        stack.start_worker("trials", queues="trials", concurrency=3)
        stack.start_worker("training", queues="training", concurrency=1)

        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps(PLAN))
        result = synth(
            "train", "start", "--dataset", dataset.reference, "--actor", f"@{EXAMPLES / 'train-agent.json'}",
            "--plan", f"@{plan}",
        )  # fmt: skip
        assert result.exit_code == 0, result.stderr
        run_id = one_line(result.stdout)
        run = wait_for(
            lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r,
            timeout=300,
            what="the train run to end",
            stack=stack,
        )
        assert run.status == "succeeded", (run.error, stack.logs())

    updates = list(LearningUpdate.objects.filter(run=run).order_by("step"))
    assert [u.status for u in updates] == [UpdateStatus.APPLIED, UpdateStatus.APPLIED]
    checkpoints = list(Checkpoint.objects.filter(run=run).order_by("step"))
    assert checkpoints[0].route == "qwen3-8b"
    name = lora_name_for(sha256=checkpoints[0].sha256)

    # Step 0 sampled the server's base model; step 1 the first checkpoint's adapter, loaded
    # into the server once for all of that step's attempts.
    step1_trials = list(SamplingGroup.objects.filter(run=run, step=1).values_list("trials__id", flat=True))
    served = Interaction.objects.filter(trial_id__in=step1_trials)
    assert served.exists() and all(i.snapshot["adapter"] == name for i in served)
    base_served = Interaction.objects.filter(run_id=run_id).exclude(trial_id__in=step1_trials)
    assert base_served.exists() and all(i.snapshot.get("adapter") is None for i in base_served)
    assert all(i.snapshot["backend"] == "openai" for i in [*served, *base_served])
    assert vllm.app.loads == [name]
    assert {r["body"]["model"] for r in vllm.app.requests} == {"tiny", name}
    assert (tmp_path / "adapters" / checkpoints[0].sha256 / "adapter_config.json").is_file()

    for update in updates:
        assert update.datums > 0 and update.metrics["grad_norm"] > 0
        # What the server sampled is what the trainer computes: on-policy at step 0 with the
        # base weights AND at step 1 with the checkpoint's adapter, served by vLLM.
        assert abs(update.metrics["kl_sample_train"]) < 1e-3, update.metrics
