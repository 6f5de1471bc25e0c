"""Family name -> adapter class, and cached adapters with their provisioned tokenizers.

Each family module's adapter class is listed in ADAPTERS. Aliases (deepseek-r1, deepseek-v3.1, glm-4.6)
resolve to the tokenizer family in apps.proxy.tokenizers but may map to their own adapter class here.
"""

from __future__ import annotations

import threading

from apps.proxy.adapters.deepseek import DeepSeekAdapter
from apps.proxy.adapters.deepseek_v31 import DeepSeekV31Adapter
from apps.proxy.adapters.glm import GlmAdapter
from apps.proxy.adapters.kimi import KimiK2Adapter
from apps.proxy.adapters.qwen import Qwen3Adapter, Qwen25Adapter
from apps.proxy.adapters.template_base import TemplateAdapter
from apps.proxy.tokenizers import tokenizer_load

ADAPTERS: dict[str, type[TemplateAdapter]] = {
    "qwen3": Qwen3Adapter,
    "qwen2.5": Qwen25Adapter,
    "deepseek-v3": DeepSeekAdapter,
    "deepseek-r1": DeepSeekAdapter,
    "deepseek-v3.1": DeepSeekV31Adapter,
    "kimi-k2": KimiK2Adapter,
    "glm-4.5": GlmAdapter,
    "glm-4.6": GlmAdapter,
}

_adapters: dict[str, TemplateAdapter] = {}
_lock = threading.Lock()


def adapter_loaded(family: str) -> TemplateAdapter | None:
    """The family's adapter if this process has built it; a dictionary read (no tokenizer
    load), so the event loop may call it."""
    return _adapters.get(family)


def adapter_for(family: str) -> TemplateAdapter:
    """The process-wide adapter for `family`, built once with the family's provisioned tokenizer
    (raises TokenizerNotProvisioned, naming the command to run, if it is missing). One instance
    per family also keeps the adapter's caches (tokenized prompt chunks, sampled-turn memo)."""
    adapter = _adapters.get(family)
    if adapter is not None:
        return adapter
    try:
        cls = ADAPTERS[family]
    except KeyError:
        raise KeyError(f"no chat adapter for family {family!r} (known: {', '.join(sorted(ADAPTERS))})") from None
    with _lock:
        if family not in _adapters:
            _adapters[family] = cls(tokenizer=tokenizer_load(family))
        return _adapters[family]
