"""Fixtures for the sampler tests: the tiny random Qwen3 (real Qwen vocabulary), saved as a
checkpoint directory, and a vLLM-shaped completions server in front of it.

Building the model costs a few seconds, so one instance serves the whole session; tests
that need isolation build their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.proxy.samplers.local import LocalTorchSampler, tiny_model_build
from tests.proxy_samplers.vllm_like_server import CompletionsApp, ServerThread

# 24 ordinary Qwen3 ids (no special tokens) as the prompt in most tests.
PROMPT = list(range(9707, 9731))


@pytest.fixture(scope="session")
def tiny() -> Iterator[LocalTorchSampler]:
    sampler = LocalTorchSampler.tiny(family="qwen3", seed=0)
    yield sampler
    asyncio.run(sampler.close())


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seed-0 tiny model saved as an HF checkpoint directory."""
    path = tmp_path_factory.mktemp("tiny-qwen3")
    tiny_model_build(family="qwen3", seed=0).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def completions_server(tiny: LocalTorchSampler) -> Iterator[ServerThread]:
    with ServerThread(CompletionsApp(tiny)) as server:
        yield server
