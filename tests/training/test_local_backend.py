"""The local training backend against the proxy's own local sampler: gradient direction,
Tinker's accumulation semantics, on-policy logprobs from saved weights, exact resume."""

from __future__ import annotations

import pytest
import torch
from tinker import types

from apps.proxy.samplers.base import SampleRequest
from apps.proxy.samplers.local import LocalTorchSampler
from apps.training.backends.local import LocalServiceClient, adapter_write, path_dir
from apps.training.datums import Call, datums_to_tinker, trajectory_datums

SPEC = {"tiny": True, "family": "qwen3", "seed": 0}
ADAM = types.AdamParams(learning_rate=0.05, beta1=0.9, beta2=0.95, eps=1e-8)


@pytest.fixture
def service(tmp_path) -> LocalServiceClient:
    return LocalServiceClient(spec=SPEC, root=tmp_path)


def _sampled(sampler: LocalTorchSampler, prompt: list[int], seed: int) -> Call:
    out = sampler.sample_blocking(SampleRequest(prompt_ids=prompt, max_tokens=6, stop_token_ids=[], seed=seed))
    return Call(prompt_ids=prompt, output_ids=out.token_ids, logprobs=out.logprobs)


def _wire(call: Call, advantage: float) -> list[types.Datum]:
    return datums_to_tinker(trajectory_datums(trial_id="t", calls=[call], advantage=advantage))


def _sequence_logprob(client, call: Call) -> float:
    out = client.forward(_wire(call, 1.0), "importance_sampling").result()
    return float(sum(out.loss_fn_outputs[0]["logprobs"].tolist()))


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_one_update_moves_the_sampled_sequence_in_the_direction_of_its_advantage(service, advantage):
    client = service.create_lora_training_client("tiny", rank=4, seed=0).result()
    call = _sampled(LocalTorchSampler.tiny(**{k: SPEC[k] for k in ("family", "seed")}), [1, 2, 3], seed=7)
    before = _sequence_logprob(client, call)
    client.forward_backward(_wire(call, advantage), "importance_sampling").result()
    client.optim_step(ADAM).result()
    after = _sequence_logprob(client, call)
    assert (after - before) * advantage > 0.05


def test_gradients_accumulate_until_the_optimizer_step_and_losses_are_sums(service):
    sampler = LocalTorchSampler.tiny(family="qwen3", seed=0)
    a, b = _sampled(sampler, [1, 2, 3], seed=1), _sampled(sampler, [4, 5], seed=2)
    split = service.create_lora_training_client("tiny", rank=4, seed=3).result()
    joined = service.create_lora_training_client("tiny", rank=4, seed=3).result()
    out_a = split.forward_backward(_wire(a, 1.0), "importance_sampling").result()
    out_b = split.forward_backward(_wire(b, -0.5), "importance_sampling").result()
    out_ab = joined.forward_backward(_wire(a, 1.0) + _wire(b, -0.5), "importance_sampling").result()
    assert out_a.metrics["loss:sum"] + out_b.metrics["loss:sum"] == pytest.approx(out_ab.metrics["loss:sum"], rel=1e-5)
    split.optim_step(ADAM).result()
    joined.optim_step(ADAM).result()
    assert _sequence_logprob(split, a) == pytest.approx(_sequence_logprob(joined, a), abs=1e-4)


def test_saved_sampler_weights_serve_exactly_the_trainers_distribution(service):
    client = service.create_lora_training_client("tiny", rank=4, seed=0).result()
    base = LocalTorchSampler.tiny(family="qwen3", seed=0)
    call = _sampled(base, [9, 8, 7], seed=5)
    client.forward_backward(_wire(call, 1.0), "importance_sampling").result()
    client.optim_step(ADAM).result()
    adapter = path_dir(client.save_weights_for_sampler("000001").result().path)
    served = LocalTorchSampler.tiny(family="qwen3", seed=0, adapter_dir=adapter)
    # What the proxy would report for these tokens now equals what the trainer computes,
    # and differs from the base model's: the checkpoint is what is served.
    fresh = _sampled(served, [9, 8, 7], seed=11)
    trainer_lp = client.forward(_wire(fresh, 1.0), "importance_sampling").result().loss_fn_outputs[0]["logprobs"]
    sampled_lp = trainer_lp.tolist()[-len(fresh.output_ids) :]
    assert sampled_lp == pytest.approx(fresh.logprobs, abs=1e-4)
    base_lp = base.completion_logprobs(prompt_ids=fresh.prompt_ids, completion_ids=fresh.output_ids)
    assert max(abs(x - y) for x, y in zip(base_lp, fresh.logprobs, strict=True)) > 1e-3
    assert served.snapshot()["adapter"].startswith("sha256:")


def test_the_adapter_is_written_as_peft_writes_it_less_the_model_card(service, tmp_path):
    client = service.create_lora_training_client("tiny", rank=4, seed=0).result()
    call = _sampled(LocalTorchSampler.tiny(family="qwen3", seed=0), [1, 2, 3], seed=7)
    client.forward_backward(_wire(call, 1.0), "importance_sampling").result()
    client.optim_step(ADAM).result()  # trained weights, not the zero-initialised B matrices
    model = client._model
    model.save_pretrained(tmp_path / "peft", save_embedding_layers=False)
    adapter_write(model=model, directory=tmp_path / "ours")
    ours = {f.name: f.read_bytes() for f in (tmp_path / "ours").iterdir()}
    peft = {f.name: f.read_bytes() for f in (tmp_path / "peft").iterdir()}
    assert set(ours) == {"adapter_model.safetensors", "adapter_config.json"} == set(peft) - {"README.md"}
    assert all(ours[name] == peft[name] for name in ours)
    assert model.peft_config["default"].inference_mode is False  # the trainer's own config is left as it was


def test_resuming_from_saved_state_continues_exactly(service):
    sampler = LocalTorchSampler.tiny(family="qwen3", seed=0)
    calls = [_sampled(sampler, [1, 2, 3], seed=s) for s in range(3)]
    original = service.create_lora_training_client("tiny", rank=4, seed=0).result()
    for call in calls[:2]:
        original.forward_backward(_wire(call, 1.0), "importance_sampling").result()
        original.optim_step(ADAM).result()
    state = original.save_state("000002").result().path
    resumed = service.create_training_client_from_state_with_optimizer(state).result()
    for client in (original, resumed):
        client.forward_backward(_wire(calls[2], -1.0), "importance_sampling").result()
        client.optim_step(ADAM).result()
    assert _sequence_logprob(resumed, calls[0]) == pytest.approx(_sequence_logprob(original, calls[0]), abs=1e-5)
    # Adam's moments came back too: a weights-only restore takes a different step.
    weights_only = service.create_training_client_from_state(state).result()
    weights_only.forward_backward(_wire(calls[2], -1.0), "importance_sampling").result()
    weights_only.optim_step(ADAM).result()
    assert abs(_sequence_logprob(weights_only, calls[0]) - _sequence_logprob(original, calls[0])) > 1e-4


def test_a_state_from_another_base_model_is_refused(service, tmp_path):
    client = service.create_lora_training_client("tiny", rank=4).result()
    state = client.save_state("x").result().path
    other = LocalServiceClient(spec={**SPEC, "seed": 1}, root=tmp_path)
    with pytest.raises(ValueError, match="was trained on"):
        other.create_training_client_from_state_with_optimizer(state).result()


def test_each_client_gets_its_own_copy_of_the_pristine_base_model():
    from apps.proxy.samplers.local import tiny_model_build
    from apps.training.backends.local import base_model_build

    first = base_model_build(spec=SPEC)
    with torch.no_grad():
        first.model.embed_tokens.weight.add_(1.0)  # a client's model changed in place
    second = base_model_build(spec=SPEC)
    fresh = tiny_model_build(family="qwen3", seed=0)
    assert second.lm_head.weight is second.model.embed_tokens.weight  # still tied in the copy
    assert not second.training
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(second.state_dict()[name], tensor), name


def test_unknown_losses_are_refused(service):
    client = service.create_lora_training_client("tiny", rank=4).result()
    call = Call(prompt_ids=[1, 2], output_ids=[3], logprobs=[-1.0])
    with pytest.raises(ValueError, match="cispo"):
        client.forward_backward(_wire(call, 1.0), "cispo").result()
    torch.manual_seed(0)  # the global RNG is untouched by the backend's seeded init


def test_chunked_unembedding_gives_the_same_update_as_one_pass(service, settings):
    sampler = LocalTorchSampler.tiny(family="qwen3", seed=0)
    calls = [_sampled(sampler, [1, 2, 3], seed=s) for s in range(2)]
    wire = _wire(calls[0], 1.0) + _wire(calls[1], -0.7)
    results = []
    for chunk in (1 << 30, 2):  # everything at once, then two positions at a time
        settings.SYNTH_TRAIN_UNEMBED_CHUNK = chunk
        client = service.create_lora_training_client("tiny", rank=4, seed=0).result()
        out = client.forward_backward(wire, "importance_sampling").result()
        grad = client.optim_step(ADAM).result().metrics["optim/grad_norm"]
        results.append((out.metrics["loss:sum"], grad, _sequence_logprob(client, calls[0])))
    assert results[0] == pytest.approx(results[1], rel=1e-4, abs=1e-5)


def test_datums_sharing_a_prompt_run_it_once_and_give_the_one_by_one_update(service, settings):
    sampler = LocalTorchSampler.tiny(family="qwen3", seed=0)
    prompt = list(range(5, 45))
    # A group's four attempts of one prompt, one with no signal, then another task's attempt.
    calls = [_sampled(sampler, prompt, seed=s) for s in range(4)] + [_sampled(sampler, [9, 8, 7], seed=9)]
    wire = [d for call, adv in zip(calls, (1.0, -0.4, 0.0, -0.6, 0.8), strict=True) for d in _wire(call, adv)]
    results = {}
    for minimum in (0, 16):  # one datum at a time, then the shared prompt's decoder run once
        settings.SYNTH_TRAIN_SHARED_PREFIX_MIN = minimum
        client = service.create_lora_training_client("tiny", rank=4, seed=0).result()
        out = client.forward_backward(wire, "importance_sampling").result()
        grads = [p.grad.clone() for p in client._params]
        logprobs = [o["logprobs"].tolist() for o in out.loss_fn_outputs]
        client.optim_step(ADAM).result()
        results[minimum] = (out.metrics["loss:sum"], logprobs, grads, _sequence_logprob(client, calls[0]))
    (loss, logprobs, grads, after), (loss_s, logprobs_s, grads_s, after_s) = results[0], results[16]
    assert loss_s == pytest.approx(loss, rel=1e-5)
    assert len(logprobs_s) == len(logprobs) == 5 and not any(logprobs[2])  # no signal: not scored
    for a, b in zip(logprobs, logprobs_s, strict=True):
        assert b == pytest.approx(a, abs=1e-5)
    assert max(float((a - b).abs().max()) for a, b in zip(grads, grads_s, strict=True)) < 1e-5
    assert max(float(g.abs().max()) for g in grads) > 1e-3  # the comparison is of real gradients
    assert after_s == pytest.approx(after, abs=1e-4)


def test_the_learner_climbs_a_reward_through_saved_and_served_weights(tmp_path):
    """The whole local loop, many times: sample with the proxy's sampler from the last saved
    weights, reward, group-centred advantages, datums, one update, save, serve again. On a
    small-vocabulary model the share of tokens from a target set climbs from its base rate."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from apps.training.datums import Attempt, group_prepare

    config = Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, max_position_embeddings=4096,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen3ForCausalLM(config).save_pretrained(tmp_path / "base")
    service = LocalServiceClient(spec={"model_dir": str(tmp_path / "base")}, root=tmp_path)
    client = service.create_lora_training_client("small", rank=8, seed=0).result()
    sampler = LocalTorchSampler.from_dir(model_dir=tmp_path / "base")
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
    curve = []
    for step in range(8):
        datums, rewards = [], []
        for p, prompt in enumerate(prompts):
            attempts = []
            for k in range(8):
                call = _sampled_n(sampler, prompt, seed=step * 1000 + p * 10 + k, tokens=16)
                reward = sum(1 for t in call.output_ids if t < 64) / len(call.output_ids)
                rewards.append(reward)
                attempts.append(Attempt(trial_id=f"{p}-{k}", reward=reward, calls=[call]))
            datums += group_prepare(group_id=str(p), attempts=attempts, min_valid=2, require_variance=True).datums
        curve.append(sum(rewards) / len(rewards))
        if datums:
            client.forward_backward(datums_to_tinker(datums), "importance_sampling").result()
            client.optim_step(types.AdamParams(learning_rate=0.1, beta1=0.9, beta2=0.95, eps=1e-8)).result()
        adapter = path_dir(client.save_weights_for_sampler(f"{step + 1:06d}").result().path)
        sampler = LocalTorchSampler.from_dir(model_dir=tmp_path / "base", adapter_dir=adapter)
    assert curve[0] < 0.2, curve  # the base rate: 64 of 512 ids
    # Several times the base rate by the end. Where exactly the curve lands after 8 steps
    # depends on the CPU's floating-point paths (it differs between machines), not its shape.
    assert max(curve[-3:]) > 0.6, curve


def _sampled_n(sampler: LocalTorchSampler, prompt: list[int], *, seed: int, tokens: int) -> Call:
    out = sampler.sample_blocking(SampleRequest(prompt_ids=prompt, max_tokens=tokens, stop_token_ids=[], seed=seed))
    return Call(prompt_ids=prompt, output_ids=out.token_ids, logprobs=out.logprobs)
