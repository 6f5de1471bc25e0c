"""The learner's costs, measured side by side in one run. Prints figures; asserts nothing.

    .venv/bin/python bench/training.py [--attempts 8] [--turns 20] [--start-tokens 18000]

1. Packing (apps.training.datums.group_prepare) of one group of Claude-Code-shaped attempts:
   each attempt makes `--turns` calls whose prompt is the previous prompt + the sampled turn
   + a tool result, starting from an `--start-tokens` system-and-tools prompt. Reports the
   time per group and the tokens sent to the trainer with prefix merging (one datum per
   attempt) against one datum per call (what a learner without merging would send).
2. One local-backend update (forward_backward + optim_step, tiny Qwen3-vocabulary model,
   LoRA) on a smaller group (`--train-start-tokens`), three ways in separate processes:
   the backend's chunked selective unembedding (logits only where the advantage is
   non-zero, 512 positions at a time, one backward through the decoder), the same in one
   pass, and full logits over every position. Reports seconds and peak RSS of each, and
   that their losses agree.
3. Saving: sampler weights and trainer state, packed as the object store stores them, per
   LoRA rank: seconds and bytes.
4. Learning: the local loop (proxy sampler on the last saved weights -> reward -> group
   advantages -> datums -> update -> save -> serve) on a small-vocabulary random model, with
   reward = share of sampled ids in a target set (1/8 of the vocabulary): reward by step.

Needs no database, broker or network.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "synth_project.settings")

VOCAB = 151936


def attempt_calls(*, rng: random.Random, turns: int, start_tokens: int, turn_tokens: int, result_tokens: int):
    from apps.training.datums import Call

    prompt = [rng.randrange(VOCAB) for _ in range(start_tokens)]
    calls = []
    for _ in range(turns):
        output = [rng.randrange(VOCAB) for _ in range(turn_tokens)]
        calls.append(Call(prompt_ids=list(prompt), output_ids=output, logprobs=[-rng.random() * 5 for _ in output]))
        prompt = prompt + output + [rng.randrange(VOCAB) for _ in range(result_tokens)]
    return calls


def group_calls(*, attempts: int, turns: int, start_tokens: int, seed: int = 0) -> list[tuple[str, float, list[Any]]]:
    """(trial id, reward, calls) of each attempt of a group."""
    rng = random.Random(seed)
    return [
        (
            f"t{i}",
            float(i % 2) * 0.5 + rng.random() * 0.5,
            attempt_calls(rng=rng, turns=turns, start_tokens=start_tokens, turn_tokens=200, result_tokens=400),
        )
        for i in range(attempts)
    ]


def group(*, attempts: int, turns: int, start_tokens: int, seed: int = 0):
    from apps.training.datums import Attempt

    return [
        Attempt(trial_id=trial_id, reward=reward, calls=calls)
        for trial_id, reward, calls in group_calls(attempts=attempts, turns=turns, start_tokens=start_tokens, seed=seed)
    ]


def bench_packing(args: argparse.Namespace) -> None:
    """Packing a group: its calls added to their attempts (each packed as it comes, as the
    learner reads them), then qualification, advantages and the datums."""
    from apps.training.datums import Attempt, group_prepare

    raw = group_calls(attempts=args.attempts, turns=args.turns, start_tokens=args.start_tokens)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        attempts = [Attempt(trial_id=trial_id, reward=reward, calls=calls) for trial_id, reward, calls in raw]
        data = group_prepare(group_id="g", attempts=attempts, min_valid=2, require_variance=True)
        times.append(time.perf_counter() - t0)
    merged = sum(len(d.input_ids) for d in data.datums)
    trained = [calls for trial_id, _, calls in raw if data.advantages.get(trial_id)]
    per_call = sum(len(c.prompt_ids) + len(c.output_ids) - 1 for calls in trained for c in calls)
    calls = sum(len(calls) for calls in trained)
    print(
        f"packing: {len(raw)} attempts x {args.turns} calls, prompts {args.start_tokens} -> "
        f"{len(raw[0][2][-1].prompt_ids)} tokens: p50 {statistics.median(times) * 1000:.1f} ms per group"
    )
    print(
        f"packing: {calls} calls -> {len(data.datums)} datums; tokens sent {merged:,} merged vs {per_call:,} "
        f"one datum per call (ratio {per_call / merged:.1f}x)"
    )


def update_child(mode: str, start_tokens: int, turns: int, attempts: int) -> None:
    """One forward_backward + optim_step in this process; prints a JSON line."""
    import django

    django.setup()
    import torch
    from tinker import types

    from apps.training.backends import local
    from apps.training.datums import datums_to_tinker, group_prepare

    calls: list[int] = []  # the full mode's loss calls: its patch must be what ran
    if mode == "one-pass":
        from django.conf import settings

        settings.SYNTH_TRAIN_UNEMBED_CHUNK = 1 << 30  # every kept position unembedded at once
    elif mode == "full":

        def full_losses(*, base, items, shared, backward):  # every datum whole, whatever it shares
            calls.append(len(items))
            results = []
            for item in items:
                logits = base(input_ids=torch.tensor([item.input_ids])).logits[0].float()
                lp = torch.log_softmax(logits, dim=-1).gather(-1, item.targets[:, None])[:, 0][item.keep]
                loss = item.token_loss(lp, torch.arange(len(lp)))
                if backward:
                    loss.backward()
                results.append((float(loss.detach()), lp.detach()))
            return results

        local._scored_losses = full_losses
    data = group_prepare(
        group_id="g",
        attempts=group(attempts=attempts, turns=turns, start_tokens=start_tokens, seed=1),
        min_valid=2,
        require_variance=True,
    )
    wire = datums_to_tinker(data.datums)
    with tempfile.TemporaryDirectory() as tmp:
        service = local.LocalServiceClient(spec={"tiny": True, "family": "qwen3", "seed": 0}, root=Path(tmp))
        client = service.create_lora_training_client("tiny", rank=8).result()
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        out = client.forward_backward(wire, "importance_sampling").result()
        client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        seconds = time.perf_counter() - t0
    if mode == "full" and not calls:
        raise SystemExit("the full-logits loss was not used: the backend's loss function moved")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tokens = sum(len(d.input_ids) for d in data.datums)
    print(
        json.dumps(
            {
                "seconds": seconds,
                "loss": out.metrics["loss:sum"],
                "peak_mb": rss / 1024,
                "before_mb": rss0 / 1024,
                "tokens": tokens,
                "trained": sum(d.sampled_tokens for d in data.datums),
            }
        )
    )


def bench_update(args: argparse.Namespace) -> None:
    results = {}
    for mode in ("chunked", "one-pass", "full"):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--train-start-tokens",
                str(args.train_start_tokens),
                "--train-turns",
                str(args.train_turns),
                "--train-attempts",
                str(args.train_attempts),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    sel, full = results["chunked"], results["full"]
    print(
        f"update (tiny model, LoRA r=8): {sel['tokens']:,} tokens in datums, {sel['trained']:,} trained; "
        f"losses agree: {all(abs(r['loss'] - full['loss']) <= 1e-3 * max(1.0, abs(full['loss'])) for r in results.values())}"
    )
    for mode, r in results.items():
        print(
            f"update {mode:>8}: {r['seconds']:.2f} s, {r['tokens'] / r['seconds']:,.0f} tokens/s, "
            f"peak RSS {r['peak_mb']:.0f} MB (model loaded: {r['before_mb']:.0f} MB)"
        )
    for mode in ("one-pass", "full"):
        r = results[mode]
        print(
            f"update ratio {mode}/chunked: time {r['seconds'] / sel['seconds']:.1f}x, memory above the loaded "
            f"model {(r['peak_mb'] - r['before_mb']) / max(1.0, sel['peak_mb'] - sel['before_mb']):.1f}x"
        )


def bench_saves(args: argparse.Namespace) -> None:
    import django

    django.setup()
    from apps.objects.packages import dir_pack
    from apps.training.backends.local import LocalServiceClient, path_dir

    for rank in (8, 32):
        with tempfile.TemporaryDirectory() as tmp:
            client = (
                LocalServiceClient(spec={"tiny": True, "family": "qwen3", "seed": 0}, root=Path(tmp))
                .create_lora_training_client("tiny", rank=rank)
                .result()
            )
            t0 = time.perf_counter()
            sampler = dir_pack(path=path_dir(client.save_weights_for_sampler("s").result().path))
            t1 = time.perf_counter()
            state = dir_pack(path=path_dir(client.save_state("s").result().path))
            t2 = time.perf_counter()
        print(
            f"save r={rank}: sampler weights {len(sampler) / 1024:.0f} KiB in {(t1 - t0) * 1000:.0f} ms, "
            f"trainer state {len(state) / 1024:.0f} KiB in {(t2 - t1) * 1000:.0f} ms"
        )


def bench_learning(args: argparse.Namespace) -> None:
    import django

    django.setup()
    import torch
    from tinker import types
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from apps.proxy.samplers.base import SampleRequest
    from apps.proxy.samplers.local import LocalTorchSampler
    from apps.training.backends.local import LocalServiceClient, path_dir
    from apps.training.datums import Attempt, Call, datums_to_tinker, group_prepare

    config = Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, max_position_embeddings=4096,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        torch.manual_seed(0)
        Qwen3ForCausalLM(config).save_pretrained(base)
        client = (
            LocalServiceClient(spec={"model_dir": str(base)}, root=Path(tmp))
            .create_lora_training_client("small", rank=8, seed=0)
            .result()
        )
        sampler = LocalTorchSampler.from_dir(model_dir=base)
        prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
        curve, seconds = [], []
        for step in range(args.learn_steps):
            t0 = time.perf_counter()
            datums, rewards = [], []
            for p, prompt in enumerate(prompts):
                attempts = []
                for k in range(8):
                    request = SampleRequest(
                        prompt_ids=prompt, max_tokens=16, stop_token_ids=[], seed=step * 1000 + p * 10 + k
                    )
                    out = sampler.sample_blocking(request)
                    reward = sum(1 for t in out.token_ids if t < 64) / len(out.token_ids)
                    rewards.append(reward)
                    call = Call(prompt_ids=prompt, output_ids=out.token_ids, logprobs=out.logprobs)
                    attempts.append(Attempt(trial_id=f"{p}-{k}", reward=reward, calls=[call]))
                datums += group_prepare(group_id=str(p), attempts=attempts, min_valid=2, require_variance=True).datums
            curve.append(sum(rewards) / len(rewards))
            if datums:
                client.forward_backward(datums_to_tinker(datums), "importance_sampling").result()
                client.optim_step(types.AdamParams(learning_rate=0.1, beta1=0.9, beta2=0.95, eps=1e-8)).result()
            adapter = path_dir(client.save_weights_for_sampler(f"{step + 1:06d}").result().path)
            sampler = LocalTorchSampler.from_dir(model_dir=base, adapter_dir=adapter)
            seconds.append(time.perf_counter() - t0)
    print(
        "learning (vocab 512, 4 groups x 8 attempts x 16 tokens, lr 0.1, r=8): reward by step "
        + " ".join(f"{r:.2f}" for r in curve)
        + f"; {statistics.median(seconds):.2f} s per step"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempts", type=int, default=8)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--start-tokens", type=int, default=18000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--train-attempts", type=int, default=4)
    parser.add_argument("--train-turns", type=int, default=6)
    parser.add_argument("--train-start-tokens", type=int, default=2000)
    parser.add_argument("--learn-steps", type=int, default=10)
    parser.add_argument("--child", choices=["chunked", "one-pass", "full"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        update_child(args.child, args.train_start_tokens, args.train_turns, args.train_attempts)
        return
    bench_packing(args)
    bench_update(args)
    bench_saves(args)
    bench_learning(args)


if __name__ == "__main__":
    main()
