"""LocalTorchSampler: a causal LM in this process (CPU, or the GPU when there is one).

Two ways to get a model:

* ``LocalTorchSampler.tiny(family="qwen3", seed=0)`` builds a tiny randomly initialised
  decoder whose embedding has the family's REAL vocabulary size, so the ids it samples are
  ids of that family's tokenizer (the text is gibberish; the token plumbing is real). It is
  deterministic for a given seed and torch version, and costs ~0.2 s and ~200 MB.
* ``LocalTorchSampler.from_dir(model_dir=..., adapter_dir=...)`` loads a Hugging Face
  checkpoint directory (never the hub) plus, optionally, a PEFT LoRA adapter directory as a
  training run saves it.

Sampling is a manual loop over the KV cache so we control the distribution exactly:

* temperature ``<= 0`` is greedy; the distribution sampled from is then a point mass, so the
  reported logprob is 0.0;
* otherwise logits are divided by the temperature, then top-k, then top-p (nucleus) filtering
  is applied, and the token is drawn from the renormalised remainder;
* the reported logprob of each sampled token is under THAT distribution: after temperature
  AND after top-k/top-p renormalisation. RL importance sampling needs q(token), the
  probability with which the token was actually drawn; with temperature 1 and no top-k/top-p
  (the RL default) this equals the model's plain log-softmax, which a trainer recomputes.

Generation holds a lock and runs on one dedicated worker thread per sampler, so concurrent
requests queue instead of interleaving on the model (which would thrash the caches and the
two CPU cores) and never block the event loop.

A prompt the sampler has just prefilled is kept (its KV cache and last logits, within
``prompt_cache_bytes``): the attempts of a group open with the same prompt, and each reuses
the first one's prefill. Only an identical prompt is reused, so a hit computes exactly what
a fresh prefill would (the same cache, bit for bit) and a seeded call samples the same
tokens and logprobs either way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import hashlib
import inspect
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from apps.proxy.samplers.base import Sampler, SampleRequest, SampleResult
from apps.proxy.samplers.factory import SamplerError

# Embedding sizes (config.vocab_size, which is >= the tokenizer's length) of each family's
# released checkpoints. The tiny model uses the Qwen3 decoder architecture for every family:
# only the id space matters to the proxy, and one small, well-tested architecture keeps the
# KV-cache path identical across families.
TINY_VOCAB_SIZES: dict[str, int] = {
    "qwen3": 151936,
    "qwen": 151936,
    "deepseek": 129280,  # DeepSeek V3 / R1 / V3.1
    "kimi": 163840,  # Kimi K2
    "glm": 151552,  # GLM-4.5 / 4.6
}

# Greedy below this temperature (dividing by ~0 would overflow; vLLM uses the same cut-off).
_GREEDY_EPS = 1e-5


def tiny_config(*, family: str) -> Any:
    """The tiny Qwen3-architecture config with ``family``'s real vocabulary size."""
    from transformers import Qwen3Config

    try:
        vocab_size = TINY_VOCAB_SIZES[family]
    except KeyError:
        raise ValueError(f"unknown family {family!r}; known: {sorted(TINY_VOCAB_SIZES)}") from None
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    )


def tiny_model_build(*, family: str = "qwen3", seed: int = 0) -> Any:
    """Build the tiny random model. Seeded in a forked RNG so the caller's global torch RNG
    state is left untouched (and so two builds with the same seed are identical)."""
    from transformers import Qwen3ForCausalLM

    config = tiny_config(family=family)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model.eval()


def dir_digest(path: str | os.PathLike[str]) -> str:
    """sha256 over every regular file under ``path`` (relative path, size and bytes, in sorted
    order): the identity of a checkpoint or adapter directory, whatever it was named."""
    root = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = file.relative_to(root).as_posix().encode()
        digest.update(rel + b"\0" + str(file.stat().st_size).encode() + b"\0")
        with file.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def _with_adapter(model: Any, adapter_dir: str | os.PathLike[str]) -> tuple[Any, str]:
    """``model`` with the PEFT LoRA adapter in ``adapter_dir``, and the adapter's digest."""
    from peft import PeftModel

    adapter_path = Path(adapter_dir)
    if not (adapter_path / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{adapter_path} is not a PEFT adapter directory (no adapter_config.json)")
    # Kept unmerged: the logits are then computed exactly as the trainer computes them.
    return PeftModel.from_pretrained(model, adapter_path, is_trainable=False), dir_digest(adapter_path)


def _output_cache(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


class PromptCache:
    """The KV caches and last-position logits of recent prompts, least recently used first
    out, within a byte budget. Entries are copies: generation extends a cache in place."""

    def __init__(self, *, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], tuple[Any, torch.Tensor, int]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _size(cache: Any, logits: torch.Tensor) -> int:
        tensors = [logits]
        for layer in cache.layers:
            tensors += [t for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def get(self, prompt: tuple[int, ...]) -> tuple[Any, torch.Tensor] | None:
        entry = self._entries.get(prompt)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(prompt)
        self.hits += 1
        return copy.deepcopy(entry[0]), entry[1]

    def put(self, prompt: tuple[int, ...], cache: Any, logits: torch.Tensor) -> None:
        if not hasattr(cache, "layers"):
            return  # a cache this class cannot measure
        size = self._size(cache, logits)
        if size > self.max_bytes:
            return  # too large to keep
        if prompt in self._entries:
            self._bytes -= self._entries.pop(prompt)[2]
        self._entries[prompt] = (copy.deepcopy(cache), logits, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._bytes -= self._entries.popitem(last=False)[1][2]


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sampling_logprobs(
    logits: torch.Tensor, *, temperature: float, top_k: int | None, top_p: float | None
) -> torch.Tensor:
    """Log-probabilities (over the vocabulary, last dim) of the distribution the sampler draws
    from: ``logits / temperature``, then top-k, then top-p, renormalised. Filtered entries are
    ``-inf``. Not used for greedy (temperature <= 0)."""
    scaled = logits.float() / temperature
    vocab = scaled.shape[-1]
    if top_k is not None and 0 < top_k < vocab:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass
        # before it already does. The most likely token is always kept.
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop[..., 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
    return torch.log_softmax(scaled, dim=-1)


class LocalTorchSampler(Sampler):
    """A causal LM held in memory. Use :meth:`tiny` or :meth:`from_dir` to construct."""

    def __init__(
        self,
        *,
        model: Any,
        name: str,
        adapter: str | None = None,
        device: torch.device | str | None = None,
        extra_snapshot: dict[str, Any] | None = None,
        prompt_cache_bytes: int = 0,
    ) -> None:
        self.device = torch.device(device) if device is not None else _default_device()
        self.model = model.to(self.device).eval()
        self.name = name
        self.adapter = adapter
        self._extra_snapshot = dict(extra_snapshot or {})
        self._lock = threading.Lock()
        self.prompts = PromptCache(max_bytes=prompt_cache_bytes)  # used under the lock
        # One worker: queued requests wait in the executor's queue, not as threads parked
        # on the lock, and a request cancelled before it starts never runs.
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-sampler")
        self._closed = False
        # transformers 5.2x renamed `past_key_values` to `cache` (the old name warns, and
        # goes in 5.40); ask the architecture which one it takes.
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._cache_kw = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        config = getattr(model, "config", None)
        self.max_positions: int | None = getattr(config, "max_position_embeddings", None)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def tiny(
        cls,
        *,
        family: str = "qwen3",
        seed: int = 0,
        device: str | None = None,
        adapter_dir: str | os.PathLike[str] | None = None,
        prompt_cache_bytes: int = 0,
    ) -> LocalTorchSampler:
        """The tiny model, plus optionally a LoRA adapter trained on it (a local training
        run's checkpoint)."""
        model = tiny_model_build(family=family, seed=seed)
        name = f"tiny-random-{family}-v{model.config.vocab_size}-seed{seed}"
        extra: dict[str, Any] = {"family": family, "seed": seed}
        adapter = None
        if adapter_dir is not None:
            model, adapter = _with_adapter(model, adapter_dir)
            extra["adapter_dir"] = str(Path(adapter_dir).resolve())
        return cls(
            model=model,
            name=name,
            adapter=adapter,
            device=device,
            extra_snapshot=extra,
            prompt_cache_bytes=prompt_cache_bytes,
        )

    @classmethod
    def from_dir(
        cls,
        *,
        model_dir: str | os.PathLike[str],
        adapter_dir: str | os.PathLike[str] | None = None,
        device: str | None = None,
        dtype: str | None = None,
        prompt_cache_bytes: int = 0,
    ) -> LocalTorchSampler:
        """Load an HF checkpoint directory (``local_files_only``: no hub) and optionally a
        LoRA adapter directory. ``dtype`` defaults to float32 on CPU (bf16 matmuls are slow
        there) and to the checkpoint's own dtype on GPU."""
        from transformers import AutoModelForCausalLM

        model_path = Path(model_dir)
        if not (model_path / "config.json").is_file():
            raise FileNotFoundError(f"{model_path} is not a Hugging Face checkpoint directory (no config.json)")
        target = torch.device(device) if device is not None else _default_device()
        if dtype is None:
            torch_dtype: Any = torch.float32 if target.type == "cpu" else "auto"
        else:
            torch_dtype = getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype, local_files_only=True)
        adapter = None
        extra: dict[str, Any] = {"model_dir": str(model_path.resolve())}
        if adapter_dir is not None:
            model, adapter = _with_adapter(model, adapter_dir)
            extra["adapter_dir"] = str(Path(adapter_dir).resolve())
        return cls(
            model=model,
            name=dir_digest(model_path),
            adapter=adapter,
            device=target,
            extra_snapshot=extra,
            prompt_cache_bytes=prompt_cache_bytes,
        )

    # -- sampling -------------------------------------------------------------------------

    def snapshot(self, **extra: Any) -> dict[str, Any]:
        return {
            "backend": "local",
            "model": self.name,
            "adapter": self.adapter,
            "device": self.device.type,
            **self._extra_snapshot,
            **extra,
        }

    async def sample(self, request: SampleRequest) -> SampleResult:
        if self._closed:
            raise SamplerError("sampler is closed")
        cancel = threading.Event()
        future = asyncio.get_running_loop().run_in_executor(self._executor, self.sample_blocking, request, cancel)
        try:
            return await future
        except asyncio.CancelledError:
            # The caller went away (client disconnect): stop generating at the next token.
            cancel.set()
            raise

    def sample_in_turn(self, request: SampleRequest) -> SampleResult:
        """Synchronous sampling in arrival order, as the proxy's calls are served: on the
        sampler's one worker thread, after every call queued before it. (Threads calling
        ``sample_blocking`` at once take the model lock in no particular order: a call that
        came first may run last.)"""
        if self._closed:
            raise SamplerError("sampler is closed")
        return self._executor.submit(self.sample_blocking, request).result()

    def sample_blocking(self, request: SampleRequest, cancel: threading.Event | None = None) -> SampleResult:
        """Synchronous sampling (for threads and test servers). Holds the model lock."""
        if not request.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        seed = request.seed if request.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        max_tokens = request.max_tokens
        if self.max_positions:
            if len(request.prompt_ids) >= self.max_positions:
                raise SamplerError(
                    f"prompt of {len(request.prompt_ids)} tokens does not fit the model's {self.max_positions} positions"
                )
            # Do not run past the position table; the result is then a "length" finish.
            max_tokens = min(max_tokens, self.max_positions - len(request.prompt_ids))
        stop = set(request.stop_token_ids)
        tokens: list[int] = []
        logprobs: list[float] = []
        finish: str = "length"
        with self._lock, torch.inference_mode():
            if max_tokens > 0:
                generator = torch.Generator(device=self.device).manual_seed(seed)
                prompt = tuple(request.prompt_ids)
                hit = self.prompts.get(prompt)
                if hit is None:
                    input_ids = torch.tensor([request.prompt_ids], dtype=torch.long, device=self.device)
                    # logits_to_keep=1: the prompt's other positions would cost len x vocab floats.
                    out = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
                    cache, logits = _output_cache(out), out.logits[0, -1]
                    self.prompts.put(prompt, cache, logits)
                else:
                    cache, logits = hit
                for step in range(max_tokens):
                    token, logprob = self._draw(logits, request=request, generator=generator)
                    tokens.append(token)
                    logprobs.append(logprob)
                    if token in stop:
                        finish = "stop"
                        break
                    if step + 1 == max_tokens or (cancel is not None and cancel.is_set()):
                        break
                    out = self.model(
                        input_ids=torch.tensor([[token]], dtype=torch.long, device=self.device),
                        use_cache=True,
                        logits_to_keep=1,
                        **{self._cache_kw: cache},
                    )
                    cache, logits = _output_cache(out), out.logits[0, -1]
        return SampleResult(
            token_ids=tokens, logprobs=logprobs, finish=finish, snapshot=self.snapshot(sample_seed=seed)
        )

    @staticmethod
    def _draw(logits: torch.Tensor, *, request: SampleRequest, generator: torch.Generator) -> tuple[int, float]:
        if request.temperature <= _GREEDY_EPS:
            return int(torch.argmax(logits)), 0.0
        logp = sampling_logprobs(logits, temperature=request.temperature, top_k=request.top_k, top_p=request.top_p)
        # Inverse-CDF draw in float64: a quarter of torch.multinomial's time over a 150K
        # vocabulary. side="right" never lands on a filtered (zero-probability) token.
        cdf = torch.cumsum(logp.double().exp(), dim=-1)
        u = torch.rand((), generator=generator, dtype=torch.float64, device=cdf.device) * cdf[-1]
        token = min(int(torch.searchsorted(cdf, u, side="right")), cdf.numel() - 1)
        return token, float(logp[token])

    def completion_logprobs(
        self,
        *,
        prompt_ids: list[int],
        completion_ids: list[int],
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
    ) -> list[float]:
        """Recompute, in one forward pass without the cache, the logprob of each completion
        token under the same sampling distribution. This is what a trainer computes; tests
        compare it with what :meth:`sample` reported."""
        if temperature <= _GREEDY_EPS:
            raise ValueError("greedy sampling (temperature 0) has point-mass logprobs (0.0); nothing to recompute")
        if not completion_ids:
            return []
        ids = list(prompt_ids) + list(completion_ids[:-1])
        with self._lock, torch.inference_mode():
            out = self.model(
                input_ids=torch.tensor([ids], dtype=torch.long, device=self.device),
                logits_to_keep=len(completion_ids),
            )
            logp = sampling_logprobs(out.logits[0], temperature=temperature, top_k=top_k, top_p=top_p)
            target = torch.tensor(completion_ids, dtype=torch.long, device=self.device)
            return logp.gather(-1, target[:, None])[:, 0].tolist()

    async def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
