"""OpenAICompatibleSampler against a real model behind a vLLM-shaped /v1/completions server."""

from __future__ import annotations

import asyncio
import socket

import pytest

from apps.proxy.samplers.base import SampleRequest
from apps.proxy.samplers.factory import SamplerError, SamplerUnavailable
from apps.proxy.samplers.local import LocalTorchSampler
from apps.proxy.samplers.openai_compat import (
    OpenAICompatibleSampler,
    completions_body,
    completions_result,
    completions_url,
)
from tests.proxy_samplers.conftest import PROMPT
from tests.proxy_samplers.vllm_like_server import CompletionsApp, ServerThread


def req(**kw: object) -> SampleRequest:
    base: dict[str, object] = {"prompt_ids": PROMPT, "max_tokens": 10, "stop_token_ids": [151645], "seed": 11}
    base.update(kw)
    return SampleRequest(**base)  # type: ignore[arg-type]


def sample(sampler: OpenAICompatibleSampler, request: SampleRequest):
    async def run():
        try:
            return await sampler.sample(request)
        finally:
            await sampler.close()

    return asyncio.run(run())


def test_request_body_is_vllm_shaped() -> None:
    body = completions_body(req(top_p=0.9, top_k=20, temperature=0.6), model="m", extra_body={"priority": 1})
    assert body == {
        "model": "m",
        "prompt": PROMPT,
        "max_tokens": 10,
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": 20,
        "seed": 11,
        "stop_token_ids": [151645],
        "ignore_eos": True,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "n": 1,
        "stream": False,
        "priority": 1,
    }
    minimal = completions_body(req(seed=None), model="m")
    assert "top_p" not in minimal and "top_k" not in minimal and "seed" not in minimal
    assert completions_url("http://h:8000/") == completions_url("http://h:8000/v1") == "http://h:8000/v1/completions"


def test_same_ids_and_logprobs_as_the_local_sampler(tiny: LocalTorchSampler, completions_server: ServerThread) -> None:
    client = OpenAICompatibleSampler(base_url=completions_server.base_url, model="tiny")
    for request in (req(), req(temperature=0.8, top_k=50, seed=3), req(top_p=0.5, seed=4)):
        direct = tiny.sample_blocking(request)
        remote = sample(client, request)
        assert remote.token_ids == direct.token_ids
        assert remote.logprobs == direct.logprobs  # JSON floats round-trip exactly
        assert remote.finish == direct.finish
    assert remote.snapshot == {
        "backend": "openai",
        "model": "tiny",
        "adapter": None,
        "base_url": completions_server.base_url,
        "response_id": remote.snapshot["response_id"],
    }
    seen = completions_server.app.requests[-1]["body"]
    assert seen["prompt"] == PROMPT and seen["stop_token_ids"] == [151645] and seen["seed"] == 4


def test_token_id_strings_when_the_server_returns_no_token_ids(
    tiny: LocalTorchSampler, completions_server: ServerThread
) -> None:
    # Older vLLM: no choices[0].token_ids, only logprobs.tokens as "token_id:N".
    client = OpenAICompatibleSampler(
        base_url=completions_server.base_url, model="tiny", extra_body={"return_token_ids": False}
    )
    remote = sample(client, req())
    assert remote.token_ids == tiny.sample_blocking(req()).token_ids


def test_stop_tokens_and_max_tokens_through_the_server(
    tiny: LocalTorchSampler, completions_server: ServerThread
) -> None:
    client = OpenAICompatibleSampler(base_url=completions_server.base_url + "/v1", model="tiny")
    free = tiny.sample_blocking(req(stop_token_ids=[]))
    stopped = sample(client, req(stop_token_ids=[free.token_ids[2]]))
    assert (stopped.token_ids, stopped.finish) == (free.token_ids[:3], "stop")
    limited = sample(client, req(max_tokens=4))
    assert (len(limited.token_ids), limited.finish) == (4, "length")


def test_api_key_from_the_environment(completions_server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_VLLM_KEY", "sekret")
    sample(
        OpenAICompatibleSampler(base_url=completions_server.base_url, model="tiny", api_key_env="TEST_VLLM_KEY"),
        req(max_tokens=1),
    )
    assert completions_server.app.requests[-1]["headers"]["authorization"] == "Bearer sekret"
    monkeypatch.delenv("TEST_VLLM_KEY")
    with pytest.raises(SamplerUnavailable, match="TEST_VLLM_KEY is not set"):
        sample(
            OpenAICompatibleSampler(base_url=completions_server.base_url, model="tiny", api_key_env="TEST_VLLM_KEY"),
            req(),
        )


def test_connection_refused_is_unavailable() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(SamplerUnavailable, match="cannot connect"):
        sample(OpenAICompatibleSampler(base_url=f"http://127.0.0.1:{port}", model="tiny"), req())


def test_timeout_is_unavailable(completions_server: ServerThread) -> None:
    client = OpenAICompatibleSampler(base_url=completions_server.base_url, model="slow", timeout=0.5)
    with pytest.raises(SamplerUnavailable, match="timed out"):
        sample(client, req())


def test_overloaded_server_is_unavailable_with_retry_after(completions_server: ServerThread) -> None:
    with pytest.raises(SamplerUnavailable) as info:
        sample(OpenAICompatibleSampler(base_url=completions_server.base_url, model="overloaded"), req())
    assert info.value.retry_after == 7.0 and "503" in str(info.value)


def test_bad_requests_and_malformed_responses_are_sampler_errors(completions_server: ServerThread) -> None:
    client = OpenAICompatibleSampler(
        base_url=completions_server.base_url, model="tiny", extra_body={"prompt": "text, not ids"}
    )
    with pytest.raises(SamplerError, match="400") as info:
        sample(client, req())
    assert not isinstance(info.value, SamplerUnavailable)
    with pytest.raises(SamplerError, match="no logprobs"):
        sample(OpenAICompatibleSampler(base_url=completions_server.base_url, model="no-logprobs"), req())
    with pytest.raises(SamplerError, match="not a token id"):
        completions_result(
            {"choices": [{"finish_reason": "stop", "logprobs": {"tokens": ["hello"], "token_logprobs": [-1.0]}}]},
            snapshot={},
        )
    with pytest.raises(SamplerError, match="finish_reason 'abort'"):
        completions_result(
            {"choices": [{"finish_reason": "abort", "token_ids": [1], "logprobs": {"token_logprobs": [-1.0]}}]},
            snapshot={},
        )


def test_concurrent_requests_through_the_server(tiny: LocalTorchSampler, completions_server: ServerThread) -> None:
    client = OpenAICompatibleSampler(base_url=completions_server.base_url, model="tiny")
    requests = [req(seed=s, max_tokens=6) for s in range(4)]

    async def run():
        try:
            return await asyncio.gather(*(client.sample(r) for r in requests))
        finally:
            await client.close()

    remote = asyncio.run(run())
    assert [r.token_ids for r in remote] == [tiny.sample_blocking(r).token_ids for r in requests]


def test_a_cancelled_sample_closes_its_upstream_request(tiny: LocalTorchSampler) -> None:
    """The proxy cancels the sample when its client goes away; the sampler then closes its
    connection to the backend, which is how vLLM learns to abort the generation."""
    with ServerThread(CompletionsApp(tiny)) as server:
        sampler = OpenAICompatibleSampler(base_url=server.base_url, model="hold")

        async def run() -> None:
            task = asyncio.create_task(sampler.sample(req()))
            await asyncio.to_thread(server.app.held.wait, 30)
            assert server.app.held.is_set()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The sampler (and its connection pool) lives on, as it does in the proxy.
            seen = await asyncio.to_thread(server.app.disconnected.wait, 30)
            await sampler.close()
            assert seen, "the backend never saw the request go away"

        asyncio.run(run())
