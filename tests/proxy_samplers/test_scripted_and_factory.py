"""ScriptedSampler / InstantSampler, and sampler_build with its process-level cache."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.proxy.samplers.base import SampleRequest
from apps.proxy.samplers.factory import sampler_build, sampler_build_async, sampler_cache_clear, sampler_cached
from apps.proxy.samplers.local import LocalTorchSampler
from apps.proxy.samplers.openai_compat import OpenAICompatibleSampler
from apps.proxy.samplers.scripted import InstantSampler, ScriptedSampler, ScriptExhausted
from apps.proxy.samplers.tinker_sampler import TinkerSampler

# Qwen3: "<tool_call>" 151657, "</tool_call>" 151658, "<|im_end|>" 151645.
TOOL_CALL = [151657, 198, 4913, 606, 788, 151658, 151645]


def req(prompt: list[int] | None = None, **kw: object) -> SampleRequest:
    base: dict[str, object] = {"prompt_ids": prompt or [1, 2, 3], "max_tokens": 50, "stop_token_ids": [151645]}
    base.update(kw)
    return SampleRequest(**base)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def clean_cache() -> Iterator[None]:
    sampler_cache_clear()
    yield
    sampler_cache_clear()


def test_scripted_sequences_in_order() -> None:
    sampler = ScriptedSampler(sequences=[TOOL_CALL, [9, 9, 151645]])
    first = asyncio.run(sampler.sample(req()))
    assert (first.token_ids, first.logprobs, first.finish) == (TOOL_CALL, [0.0] * 7, "stop")
    second = asyncio.run(sampler.sample(req([4])))
    assert second.token_ids == [9, 9, 151645] and second.snapshot["call"] == 1
    assert [r.prompt_ids for r in sampler.requests] == [[1, 2, 3], [4]]
    with pytest.raises(ScriptExhausted):
        asyncio.run(sampler.sample(req()))


def test_scripted_truncates_like_a_real_sampler() -> None:
    sampler = ScriptedSampler(sequences=[[5, 6, 7, 8]], cycle=True)
    assert asyncio.run(sampler.sample(req(max_tokens=2))).token_ids == [5, 6]
    cut = asyncio.run(sampler.sample(req(stop_token_ids=[6])))
    assert (cut.token_ids, cut.finish) == ([5, 6], "stop")
    no_stop = asyncio.run(sampler.sample(req()))  # cycles; ends without a stop token
    assert (no_stop.token_ids, no_stop.finish) == ([5, 6, 7, 8], "length")


def test_scripted_chooser_sees_the_prompt() -> None:
    sampler = ScriptedSampler(choose=lambda prompt: TOOL_CALL if prompt[-1] == 3 else [151645])
    assert asyncio.run(sampler.sample(req([1, 2, 3]))).token_ids == TOOL_CALL
    assert asyncio.run(sampler.sample(req([7]))).token_ids == [151645]
    with pytest.raises(ValueError):
        ScriptedSampler()


def test_instant_sampler() -> None:
    assert asyncio.run(InstantSampler().sample(req())).token_ids == [151645]
    result = asyncio.run(InstantSampler(token_ids=[10, 11]).sample(req()))
    assert (result.token_ids, result.finish, result.logprobs) == ([10, 11, 151645], "stop", [0.0] * 3)
    assert asyncio.run(InstantSampler(token_ids=[10, 11]).sample(req(max_tokens=1))).finish == "length"


def test_factory_builds_each_backend_once() -> None:
    # Before its build, the event loop's cache read finds nothing (and builds nothing).
    assert sampler_cached(backend="local", config={"family": "qwen3", "tiny": True, "seed": 0}) is None
    tiny = sampler_build(backend="local", config={"family": "qwen3", "tiny": True, "seed": 0})
    assert isinstance(tiny, LocalTorchSampler)
    assert sampler_cached(backend="local", config={"seed": 0, "tiny": True, "family": "qwen3"}) is tiny
    assert sampler_build(backend="local", config={"seed": 0, "tiny": True, "family": "qwen3"}) is tiny
    assert sampler_build(backend="local", config={"family": "kimi", "tiny": True, "seed": 0}) is not tiny

    openai = sampler_build(backend="openai", config={"base_url": "http://127.0.0.1:1", "model": "m"})
    assert isinstance(openai, OpenAICompatibleSampler) and openai.url == "http://127.0.0.1:1/v1/completions"
    tinker = sampler_build(backend="tinker", config={"model_path": "tinker://r/sampler_weights/1"})
    assert isinstance(tinker, TinkerSampler) and tinker.model_path == "tinker://r/sampler_weights/1"
    assert isinstance(sampler_build(backend="instant", config={}), InstantSampler)

    # A cached scripted sampler keeps its place in the script across builds (requests).
    script = {"sequences": [[1, 151645], [2, 151645]]}
    assert asyncio.run(sampler_build(backend="scripted", config=script).sample(req())).token_ids == [1, 151645]
    assert asyncio.run(sampler_build(backend="scripted", config=script).sample(req())).token_ids == [2, 151645]


def test_factory_local_dir_config(tiny_dir: Path) -> None:
    sampler = asyncio.run(sampler_build_async(backend="local", config={"model_dir": str(tiny_dir)}))
    assert isinstance(sampler, LocalTorchSampler) and sampler.snapshot()["model"].startswith("sha256:")


def test_factory_loads_once_under_concurrent_first_use() -> None:
    built: list[object] = []
    config = {"family": "glm", "tiny": True, "seed": 3}

    def build() -> None:
        built.append(sampler_build(backend="local", config=config))

    threads = [threading.Thread(target=build) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 4 and all(s is built[0] for s in built)
    assert built[0].model.config.vocab_size == 151552  # type: ignore[attr-defined]


def test_factory_rejects_bad_configs() -> None:
    with pytest.raises(ValueError, match="unknown sampler backend"):
        sampler_build(backend="bogus", config={})
    with pytest.raises(ValueError, match="unknown local sampler config keys"):
        sampler_build(backend="local", config={"tiny": True, "famly": "qwen3"})
    with pytest.raises(ValueError, match="model_dir"):
        sampler_build(backend="local", config={"family": "qwen3"})
    with pytest.raises(ValueError, match="unknown family"):
        sampler_build(backend="local", config={"tiny": True, "family": "llama"})
    with pytest.raises(ValueError, match="base_url and model"):
        sampler_build(backend="openai", config={"base_url": "http://x"})
    with pytest.raises(ValueError):
        sampler_build(backend="tinker", config={})


def test_a_route_names_a_registered_script_only() -> None:
    from apps.proxy.samplers import harness_script

    sampler = sampler_build(backend="scripted", config={"script": "harness-check"})
    assert isinstance(sampler, ScriptedSampler) and sampler._choose is harness_script.choose
    with pytest.raises(ValueError, match="unknown scripted sampler script 'os:system'"):
        sampler_build(backend="scripted", config={"script": "os:system"})
    with pytest.raises(ValueError, match="script or choose, not both"):
        sampler_build(backend="scripted", config={"script": "harness-check", "choose": harness_script.choose})


def test_the_harness_check_script_calls_whichever_shell_tool_is_offered() -> None:
    from apps.proxy.samplers import harness_script as script

    task = script.instruction()
    claude = script.reply(f'<tools>\n{{"name": "Bash"}}\n</tools>{task}')
    assert '"name": "Bash"' in claude and '"description"' in claude and claude.endswith(script.END)
    mini = script.reply(f'<tools>\n{{"name": "bash"}}\n</tools>{task}')
    assert '{"name": "bash", "arguments": {"command": "echo conformant > harness-check.txt"}}' in mini
    assert script.reply(f"{task}<tool_response>\nok\n</tool_response>").endswith(script.FINAL_TEXT + script.END)
    assert script.reply("a title request") == script.OTHER_TEXT + script.END
