"""Build samplers from a backend name and a config dict, once per process.

    sampler_build(backend="local", config={"family": "qwen3", "tiny": True, "seed": 0})
    sampler_build(backend="local", config={"model_dir": "/ckpt", "adapter_dir": "/run/adapter"})
    sampler_build(backend="tinker", config={"base_model": "Qwen/Qwen3-8B"})      # or model_path
    sampler_build(backend="openai", config={"base_url": "http://vllm:8000", "model": "m",
                                            "api_key_env": "VLLM_API_KEY"})
    sampler_build(backend="openai", config={..., "lora_name": "synth-<sha256>", "lora_path": "/a/<sha256>"})
    sampler_build(backend="scripted", config={"sequences": [[1, 2, 3]]})
    sampler_build(backend="scripted", config={"script": "harness-check"})   # a named chooser
    sampler_build(backend="instant", config={"token_ids": [1, 2]})

The same (backend, config) returns the same instance for the life of the process, so a model
loads once, and a scripted sampler keeps its call counter across requests. Loading a model
blocks: from async code use ``await sampler_build_async(...)``.

Errors the proxy maps to HTTP statuses live here too (the backends import them):
``SamplerUnavailable`` -> 529 overloaded / 503, any other ``SamplerError`` -> 502.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from typing import Any

from django.conf import settings

from apps.proxy.samplers.base import Sampler


class SamplerError(RuntimeError):
    """The backend answered, but not with a usable sample (bad request, malformed response)."""


class SamplerUnavailable(SamplerError):
    """The backend cannot take the request now: connection refused, timeout, overloaded (429,
    503, 529), or not configured (no API key). Retrying later may succeed."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelNotServed(SamplerError):
    """The server does not know the model name sampled (404): for a LoRA adapter loaded at
    run time, the server lost it (a restart, another process unloaded it)."""


class AdapterLoadFailed(SamplerError):
    """The server refused to load a checkpoint's LoRA adapter (a bad path, a rank beyond
    its --max-lora-rank, runtime loading disabled)."""


BACKENDS = ("local", "tinker", "openai", "scripted", "instant")

_ALLOWED_KEYS: dict[str, set[str]] = {
    "local": {"family", "tiny", "seed", "model_dir", "adapter_dir", "device", "dtype"},
    "tinker": {"base_model", "model_path", "api_key_env", "timeout"},
    "openai": {
        "base_url",
        "model",
        "api_key_env",
        "timeout",
        "connect_timeout",
        "extra_body",
        # Checkpoints served as LoRA adapters loaded at run time (apps.proxy.samplers.vllm_lora):
        # where the proxy unpacks them, where the server sees that directory, the unload policy,
        # and (set by apps.proxy.calls.sampler_config, not by operators) the adapter sampled.
        "adapter_root",
        "adapter_server_root",
        "adapter_idle_seconds",
        "adapter_max_loaded",
        "lora_name",
        "lora_path",
        # The same weights for the local training backend (apps.training.backends.local_base_spec).
        "train_base",
    },
    "scripted": {"sequences", "choose", "script", "cycle"},
    "instant": {"token_ids"},
}

_cache: OrderedDict[tuple[str, Any], Sampler] = OrderedDict()
# Samplers with a LoRA adapter (one per checkpoint a training run produced) are many and
# short-lived in use: keep the most recently used few (SYNTH_PROXY_MAX_ADAPTER_SAMPLERS). An
# evicted sampler is only dropped from the cache, never closed, so a request still holding
# it finishes normally.
_key_locks: dict[tuple[str, Any], threading.Lock] = {}
_cache_lock = threading.Lock()


def _freeze(value: Any) -> Any:
    """A hashable, order-insensitive key for a JSON-like config (callables by identity)."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _create(backend: str, config: dict[str, Any]) -> Sampler:
    unknown = set(config) - _ALLOWED_KEYS[backend]
    if unknown:
        raise ValueError(f"unknown {backend} sampler config keys: {sorted(unknown)}")
    if backend == "local":
        from apps.proxy.samplers.local import LocalTorchSampler

        if config.get("tiny"):
            if "model_dir" in config:
                raise ValueError("local config: tiny=true excludes model_dir")
            return LocalTorchSampler.tiny(
                family=config.get("family", "qwen3"),
                seed=int(config.get("seed", 0)),
                device=config.get("device"),
                adapter_dir=config.get("adapter_dir"),
                prompt_cache_bytes=settings.SYNTH_LOCAL_SAMPLER_PROMPT_CACHE_BYTES,
            )
        if not config.get("model_dir"):
            raise ValueError('local config needs {"tiny": true, "family": ...} or {"model_dir": ...}')
        return LocalTorchSampler.from_dir(
            model_dir=config["model_dir"],
            adapter_dir=config.get("adapter_dir"),
            device=config.get("device"),
            dtype=config.get("dtype"),
            prompt_cache_bytes=settings.SYNTH_LOCAL_SAMPLER_PROMPT_CACHE_BYTES,
        )
    if backend == "tinker":
        from apps.proxy.samplers.tinker_sampler import TinkerSampler

        return TinkerSampler(
            base_model=config.get("base_model"),
            model_path=config.get("model_path"),
            api_key_env=config.get("api_key_env", "TINKER_API_KEY"),
            timeout=float(config.get("timeout", 600.0)),
        )
    if backend == "openai":
        from apps.proxy.samplers.openai_compat import OpenAICompatibleSampler

        if not config.get("base_url") or not config.get("model"):
            raise ValueError("openai config needs base_url and model")
        if "lora_name" in config or "lora_path" in config:
            from apps.proxy.samplers.vllm_lora import AdapterSampler

            if not config.get("lora_name") or not config.get("lora_path"):
                raise ValueError("openai config: lora_name and lora_path go together")
            # The adapter rides on the server's own sampler (one per route configuration):
            # its connections and its record of what is loaded there are shared by every
            # checkpoint served by that server.
            server = sampler_build(
                backend="openai", config={k: v for k, v in config.items() if k not in ("lora_name", "lora_path")}
            )
            assert isinstance(server, OpenAICompatibleSampler)
            return AdapterSampler(server=server, name=config["lora_name"], path=config["lora_path"])
        return OpenAICompatibleSampler(
            base_url=config["base_url"],
            model=config["model"],
            api_key_env=config.get("api_key_env"),
            timeout=float(config.get("timeout", 600.0)),
            connect_timeout=float(config.get("connect_timeout", 5.0)),
            extra_body=config.get("extra_body"),
            adapter_idle_seconds=float(config.get("adapter_idle_seconds", settings.SYNTH_PROXY_LORA_IDLE_SECONDS)),
            adapter_max_loaded=int(config.get("adapter_max_loaded", settings.SYNTH_PROXY_LORA_MAX_LOADED)),
        )
    if backend == "scripted":
        from apps.proxy.samplers.scripted import ScriptedSampler, script_chooser

        choose = config.get("choose")
        if "script" in config:
            if choose is not None:
                raise ValueError("scripted config: give script or choose, not both")
            choose = script_chooser(name=config["script"])
        return ScriptedSampler(sequences=config.get("sequences"), choose=choose, cycle=bool(config.get("cycle", False)))
    from apps.proxy.samplers.scripted import InstantSampler

    return InstantSampler(token_ids=config.get("token_ids", ()))


def sampler_cached(*, backend: str, config: dict[str, Any]) -> Sampler | None:
    """The process-wide sampler for (backend, config) if it is built; never builds (the
    event loop may call it)."""
    key = (backend, _freeze(config))
    with _cache_lock:
        sampler = _cache.get(key)
        if sampler is not None:
            _cache.move_to_end(key)
        return sampler


def sampler_build(*, backend: str, config: dict[str, Any]) -> Sampler:
    """The process-wide sampler for (backend, config); built on first use."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown sampler backend {backend!r}; known: {list(BACKENDS)}")
    sampler = sampler_cached(backend=backend, config=config)
    if sampler is not None:
        return sampler
    key = (backend, _freeze(config))
    with _cache_lock:
        key_lock = _key_locks.setdefault(key, threading.Lock())
    # Build outside the global lock (a model load takes seconds) but once per key: a second
    # caller for the same key waits here and then finds it cached.
    with key_lock:
        with _cache_lock:
            sampler = _cache.get(key)
        if sampler is None:
            sampler = _create(backend, dict(config))
            with _cache_lock:
                _cache[key] = sampler
                _adapters_evict()
    return sampler


def _adapters_evict() -> None:
    with_adapter = [k for k in _cache if any(item[0] in ("adapter_dir", "lora_name") for item in k[1])]
    for key in with_adapter[: max(0, len(with_adapter) - settings.SYNTH_PROXY_MAX_ADAPTER_SAMPLERS)]:
        del _cache[key]
        _key_locks.pop(key, None)


async def sampler_build_async(*, backend: str, config: dict[str, Any]) -> Sampler:
    """``sampler_build`` off the event loop (the first call for a key may load a model)."""
    return await asyncio.to_thread(sampler_build, backend=backend, config=config)


def sampler_cache_clear() -> list[Sampler]:
    """Forget every cached sampler (tests). Returns them so the caller can ``close()`` them."""
    with _cache_lock:
        samplers = list(_cache.values())
        _cache.clear()
        _key_locks.clear()
    return samplers
