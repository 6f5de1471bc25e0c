"""The small-character-set tiny model (the embedded training job's route digits-tiny)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from apps.proxy.samplers.base import SampleRequest
from apps.proxy.samplers.local import LocalTorchSampler
from apps.proxy.small_models import DEFAULT_CHARS, MANIFEST, char_token_ids, small_model_provision


def test_provisioning_is_deterministic_and_idempotent(tmp_path, qwen3_tokenizer):
    first, second = tmp_path / "a", tmp_path / "b"
    assert small_model_provision(directory=first, chars=DEFAULT_CHARS, seed=0, tokenizer=qwen3_tokenizer) == "built"
    assert small_model_provision(directory=first, chars=DEFAULT_CHARS, seed=0, tokenizer=qwen3_tokenizer) == "current"
    small_model_provision(directory=second, chars=DEFAULT_CHARS, seed=0, tokenizer=qwen3_tokenizer)
    weights = "model.safetensors"
    assert (first / weights).read_bytes() == (second / weights).read_bytes()
    assert (first / MANIFEST).read_text() == (second / MANIFEST).read_text()
    # Another seed is another model, and rebuilds the directory in place.
    assert small_model_provision(directory=second, chars=DEFAULT_CHARS, seed=1, tokenizer=qwen3_tokenizer) == "built"
    assert (first / weights).read_bytes() != (second / weights).read_bytes()


def test_it_samples_only_its_characters_and_not_yet_mostly_digits(tmp_path, qwen3_tokenizer):
    small_model_provision(directory=tmp_path, chars=DEFAULT_CHARS, seed=0, tokenizer=qwen3_tokenizer)
    allowed = set(char_token_ids(chars=DEFAULT_CHARS, tokenizer=qwen3_tokenizer))
    digits = set(char_token_ids(chars="0123456789", tokenizer=qwen3_tokenizer))
    sampler = LocalTorchSampler.from_dir(model_dir=tmp_path)
    prompt = qwen3_tokenizer.encode(
        "<|im_start|>user\nWhat is six times seven? Answer with digits only.<|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    ).ids
    sampled: list[int] = []
    for seed in range(8):
        out = sampler.sample_blocking(SampleRequest(prompt_ids=prompt, max_tokens=32, stop_token_ids=[], seed=seed))
        # The trainer's recomputed logprobs are the sampler's (what importance sampling needs).
        again = sampler.completion_logprobs(prompt_ids=prompt, completion_ids=out.token_ids)
        assert all(abs(a - b) < 1e-4 for a, b in zip(out.logprobs, again, strict=True))
        sampled += out.token_ids
    assert set(sampled) <= allowed
    assert len(set(sampled)) >= 12  # varied: no character dominates before training
    share = sum(1 for t in sampled if t in digits) / len(sampled)
    assert 0.1 <= share <= 0.45, share  # about 10/36: room for training to climb


def test_the_command_refuses_a_character_that_is_not_one_token(tmp_path, qwen3_tokenizer):
    with pytest.raises(CommandError, match="not a single token"):
        call_command("provision_small_model", "--dir", str(tmp_path / "m"), "--chars", "ab\U00013000")
    assert not (tmp_path / "m").exists()
