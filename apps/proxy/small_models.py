"""A tiny local model whose sampling is confined to a few single-character tokens.

The embedded default route's tiny model spreads its probability over the whole Qwen3
vocabulary (151,936 ids), so a reward defined on its text moves by a few hundredths in a few
updates. This model keeps the Qwen3 tokenizer and chat format (prompts, stops and parsing are
the real ones) but its unembedding gives every id outside ``chars`` a logit near -60: what it
samples is, in practice, a string over ``chars`` (by default lowercase letters and digits). A
reward defined on those characters (the share of digits, say) then has variance within a
group from the first step and climbs under a handful of LoRA updates, which is what the
embedded training job shows.

How the logits are pinned without a bias term (Qwen3's lm_head has none): hidden dimension 0
of the residual stream is held at a constant (every input embedding has ``BIAS_VALUE`` there
and no attention or MLP output writes to it), so after the final RMSNorm it is a positive
number of roughly the same size at every position; the unembedding rows of ids outside the
set are ``-OUTSIDE_WEIGHT`` on that dimension and zero elsewhere, the rows of ids in the set
are zero there and random elsewhere.

Built deterministically from ``seed`` (torch's CPU generator; no hub, no download) and written
as a Hugging Face checkpoint directory that both the proxy's local sampler and the local
training backend load with ``{"model_dir": ...}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

BUILDER_VERSION = 1
MANIFEST = "synth-small-model.json"
DEFAULT_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"
BIAS_VALUE = 20.0
OUTSIDE_WEIGHT = 8.0
# Standard deviation of the in-set unembedding rows: logits of roughly unit spread over the
# set, so the first samples are varied (no character dominates before training).
INSET_STD = 0.34


def small_model_config() -> Any:
    """The architecture: the tiny Qwen3 decoder, the real vocabulary size, an untied unembedding."""
    from transformers import Qwen3Config

    from apps.proxy.samplers.local import TINY_VOCAB_SIZES

    return Qwen3Config(
        vocab_size=TINY_VOCAB_SIZES["qwen3"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    )


def char_token_ids(*, chars: str, tokenizer: Any) -> list[int]:
    """The id of each character, refusing characters the tokenizer does not encode as one id."""
    ids = []
    for char in dict.fromkeys(chars):
        encoded = tokenizer.encode(char, add_special_tokens=False).ids
        if len(encoded) != 1:
            raise ValueError(f"{char!r} is not a single token of this tokenizer ({encoded})")
        ids.append(encoded[0])
    return ids


def small_model_build(*, token_ids: list[int], seed: int) -> Any:
    """The model, in memory. The caller's global torch RNG state is left untouched."""
    from transformers import Qwen3ForCausalLM

    config = small_model_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            embed = model.model.embed_tokens.weight
            embed.copy_(torch.randn(embed.shape, generator=generator))
            embed[:, 0] = BIAS_VALUE
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight[0, :] = 0.0
                layer.mlp.down_proj.weight[0, :] = 0.0
            head = model.lm_head.weight
            head.zero_()
            head[:, 0] = -OUTSIDE_WEIGHT
            index = torch.tensor(token_ids, dtype=torch.long)
            head[index] = torch.randn((len(token_ids), config.hidden_size), generator=generator) * INSET_STD
            head[index, 0] = 0.0
    return model.eval()


def small_model_provision(*, directory: Path, chars: str, seed: int, tokenizer: Any) -> str:
    """Write the checkpoint directory unless it already holds this build; "built" or "current"."""
    token_ids = char_token_ids(chars=chars, tokenizer=tokenizer)
    spec = {"builder_version": BUILDER_VERSION, "chars": chars, "token_ids": token_ids, "seed": seed}
    manifest = directory / MANIFEST
    try:
        if json.loads(manifest.read_text(encoding="utf-8")) == spec and (directory / "config.json").is_file():
            return "current"
    except (OSError, ValueError):
        pass
    directory.mkdir(parents=True, exist_ok=True)
    small_model_build(token_ids=token_ids, seed=seed).save_pretrained(directory)
    # Written last: a directory without it (an interrupted build) is rebuilt next time.
    manifest.write_text(json.dumps(spec, sort_keys=True), encoding="utf-8")
    return "built"
