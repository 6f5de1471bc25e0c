"""A checkpoint as the local training backend saves it, for the serving tests."""

from __future__ import annotations

from pathlib import Path

from tinker import types

from apps.proxy.samplers.base import SampleRequest
from apps.proxy.samplers.local import LocalTorchSampler
from apps.training.backends.local import LocalServiceClient, path_dir
from apps.training.datums import Call, datums_to_tinker, trajectory_datums

SPEC = {"tiny": True, "family": "qwen3", "seed": 0}


def trained_adapter_save(*, root: Path, prompt: list[int]) -> Path:
    """The adapter directory of a local training run after one update on the tiny model (a
    fresh LoRA has zero B matrices and would sample exactly the base model)."""
    client = LocalServiceClient(spec=SPEC, root=root).create_lora_training_client("tiny", rank=4, seed=0).result()
    base = LocalTorchSampler.tiny(family="qwen3", seed=0)
    out = base.sample_blocking(SampleRequest(prompt_ids=prompt, max_tokens=6, stop_token_ids=[], seed=3))
    call = Call(prompt_ids=prompt, output_ids=out.token_ids, logprobs=out.logprobs)
    datums = datums_to_tinker(trajectory_datums(trial_id="t", calls=[call], advantage=1.0))
    client.forward_backward(datums, "importance_sampling").result()
    client.optim_step(types.AdamParams(learning_rate=0.05, beta1=0.9, beta2=0.95, eps=1e-8)).result()
    path = path_dir(client.save_weights_for_sampler("000001").result().path)
    client.close()
    return path


def with_adapter(path: str) -> LocalTorchSampler:
    """How the vLLM-shaped test server loads an adapter: PEFT onto the same tiny base model."""
    return LocalTorchSampler.tiny(family="qwen3", seed=0, adapter_dir=path)
