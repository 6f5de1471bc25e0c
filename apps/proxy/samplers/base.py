"""The sampler interface: prompt token ids in, sampled token ids and their logprobs out.

Samplers know nothing of chat formats (adapters do) or of Anthropic (the proxy does).
Backends: local torch (a tiny model with a family's real vocabulary, or a checkpoint
directory, plus LoRA adapters), Tinker's SamplingClient, and OpenAI-compatible token
endpoints (vLLM / SGLang completions with prompt token ids and logprobs).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class SampleRequest:
    prompt_ids: list[int]
    max_tokens: int
    stop_token_ids: list[int]
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None


@dataclass
class SampleResult:
    token_ids: list[int]  # sampled ids, including the stop token if one was sampled
    logprobs: list[float]  # one per sampled id, from the distribution actually sampled
    finish: Literal["stop", "length"]  # stop token sampled, or max_tokens reached
    # The exact snapshot that sampled (route, checkpoint, adapter digest, ...).
    snapshot: dict[str, Any] = field(default_factory=dict)


class Sampler(ABC):
    @abstractmethod
    async def sample(self, request: SampleRequest) -> SampleResult:
        """Sample one completion. Must not block the event loop (use a thread or an
        async client for heavy work)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (clients, models)."""
