"""TinkerSampler against the real tinker SDK's types, wire decoding and futures; no service.

What runs for real: the SDK request types (ModelInput, SamplingParams, SampleRequest, and the
JSON body the SDK's sampling resource would post), the SDK's protobuf response decoder
(``deserialize_sample_response``) and sequence-id stamping, the future type that
``SamplingClient.sample`` returns, an autospec of ``SamplingClient`` (so the call must match
the real signature), and ``ServiceClient``/``create_sampling_client`` up to the network.
What does not: the service itself (sessions, queueing, the sampler, its logprob semantics).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
from typing import Any
from unittest import mock

import httpx
import numpy as np
import pytest
import tinker
from tinker import types
from tinker._compat import model_dump
from tinker.lib.backcompat_concurrent_future import _AwaitableFutureCompatWrapper
from tinker.lib.public_interfaces.sampling_client import _attach_sequence_ids
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.response_conv import deserialize_sample_response

from apps.proxy.samplers.base import SampleRequest
from apps.proxy.samplers.factory import SamplerError, SamplerUnavailable
from apps.proxy.samplers.local import LocalTorchSampler
from apps.proxy.samplers.tinker_sampler import TinkerSampler, tinker_sampling_inputs
from tests.proxy_samplers.conftest import PROMPT


def req(**kw: object) -> SampleRequest:
    base: dict[str, object] = {"prompt_ids": PROMPT, "max_tokens": 8, "stop_token_ids": [151645, 151643], "seed": 5}
    base.update(kw)
    return SampleRequest(**base)  # type: ignore[arg-type]


def wire_response(tokens: list[int], logprobs: list[float] | None, stop_reason: str) -> bytes:
    """A SampleResponse as the service sends it: protobuf, int32/float32 packed bytes."""
    sequence = pb.SampledSequence(
        stop_reason=pb.STOP_REASON_STOP if stop_reason == "stop" else pb.STOP_REASON_LENGTH,
        tokens=np.asarray(tokens, dtype=np.int32).tobytes(),
    )
    if logprobs is not None:
        sequence.logprobs = np.asarray(logprobs, dtype=np.float32).tobytes()
    return pb.SampleResponse(sequences=[sequence]).SerializeToString()


def sdk_future(value: Any = None, *, error: BaseException | None = None, pending: bool = False) -> Any:
    """The future type SamplingClient.sample returns, resolved the way the SDK resolves it."""
    inner: concurrent.futures.Future[Any] = concurrent.futures.Future()
    if error is not None:
        inner.set_exception(error)
    elif not pending:
        inner.set_result(value)
    return _AwaitableFutureCompatWrapper(inner)


def decoded(tokens: list[int], logprobs: list[float] | None, stop_reason: str, seq_id: str = "seq-1"):
    response = deserialize_sample_response(wire_response(tokens, logprobs, stop_reason))
    return _attach_sequence_ids(response, [seq_id])


def fake_client(**sample_kw: Any) -> Any:
    client = mock.create_autospec(tinker.SamplingClient, instance=True)
    client.get_base_model.return_value = "Qwen/Qwen3-8B"
    client.sample.configure_mock(**sample_kw)
    return client


def test_request_maps_to_the_sdk_types() -> None:
    prompt, params = tinker_sampling_inputs(req(temperature=0.7, top_p=0.95, top_k=20))
    assert isinstance(prompt, types.ModelInput) and prompt.to_ints() == PROMPT
    assert params == types.SamplingParams(
        max_tokens=8, temperature=0.7, top_p=0.95, top_k=20, stop=[151645, 151643], seed=5
    )
    # Unset top-p/top-k become the SDK's "off" values, and an empty stop list stays a list
    # (None would re-enable implicit EOS stopping).
    _, defaults = tinker_sampling_inputs(req(stop_token_ids=[], seed=None))
    assert (defaults.top_p, defaults.top_k, defaults.stop, defaults.seed) == (1.0, -1, [], None)
    # The JSON body the SDK's sampling resource posts to /api/v1/asample, built by the SDK.
    body = model_dump(
        types.SampleRequest(num_samples=1, prompt=prompt, sampling_params=params),
        exclude_unset=False,
        exclude_none=True,
        mode="json",
    )
    assert body["prompt"]["chunks"][0]["tokens"] == PROMPT
    assert body["sampling_params"] == {
        "max_tokens": 8,
        "seed": 5,
        "stop": [151645, 151643],
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.95,
    }


def test_response_maps_from_the_sdk_wire_format() -> None:
    response = decoded([11, 22, 151645], [-0.5, -1.25, -0.1], "stop")
    client = fake_client(return_value=sdk_future(response))
    sampler = TinkerSampler(model_path="tinker://run-1/sampler_weights/000010", client=client)
    result = asyncio.run(sampler.sample(req()))
    assert result.token_ids == [11, 22, 151645]
    assert result.logprobs == [float(np.float32(x)) for x in (-0.5, -1.25, -0.1)]
    assert result.finish == "stop"
    assert result.snapshot == {
        "backend": "tinker",
        "model": "Qwen/Qwen3-8B",
        "adapter": "tinker://run-1/sampler_weights/000010",
        "sequence_id": "seq-1",
    }
    (call,) = client.sample.call_args_list
    assert call.kwargs["num_samples"] == 1
    assert call.kwargs["prompt"].to_ints() == PROMPT
    assert call.kwargs["sampling_params"].stop == [151645, 151643]

    length = decoded([1, 2], [-1.0, -2.0], "length")
    result = asyncio.run(
        TinkerSampler(base_model="Qwen/Qwen3-8B", client=fake_client(return_value=sdk_future(length))).sample(
            req(max_tokens=2)
        )
    )
    assert (result.finish, result.snapshot["adapter"], result.snapshot["model"]) == ("length", None, "Qwen/Qwen3-8B")


def test_a_local_model_behind_the_sdk_wire_format(tiny: LocalTorchSampler) -> None:
    """A fake service that really samples: the tiny model's result, encoded as the service
    encodes it, comes out of TinkerSampler as it went in (up to float32)."""

    def serve(*, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams) -> Any:
        local = tiny.sample_blocking(
            SampleRequest(
                prompt_ids=prompt.to_ints(),
                max_tokens=sampling_params.max_tokens,
                stop_token_ids=list(sampling_params.stop),
                temperature=sampling_params.temperature,
                seed=sampling_params.seed,
            )
        )
        return sdk_future(decoded(local.token_ids, local.logprobs, local.finish))

    result = asyncio.run(TinkerSampler(base_model="tiny", client=fake_client(side_effect=serve)).sample(req()))
    direct = tiny.sample_blocking(req())
    assert result.token_ids == direct.token_ids and result.finish == direct.finish
    assert result.logprobs == pytest.approx(direct.logprobs, abs=1e-5)


def test_missing_logprobs_and_sequences_are_errors() -> None:
    no_lp = decoded([1, 2], None, "length")
    with pytest.raises(SamplerError, match="no logprobs"):
        asyncio.run(TinkerSampler(base_model="m", client=fake_client(return_value=sdk_future(no_lp))).sample(req()))
    empty = types.SampleResponse(sequences=[])
    with pytest.raises(SamplerError, match="no sequences"):
        asyncio.run(TinkerSampler(base_model="m", client=fake_client(return_value=sdk_future(empty))).sample(req()))


def test_sdk_errors_map_to_unavailable_or_error() -> None:
    request = httpx.Request("POST", "https://tinker.invalid/api/v1/asample")

    def status_error(cls: type[tinker.APIStatusError], code: int) -> tinker.APIStatusError:
        return cls(f"status {code}", response=httpx.Response(code, request=request), body=None)

    cases: list[tuple[BaseException, type[Exception]]] = [
        (tinker.APIConnectionError(request=request), SamplerUnavailable),
        (tinker.APITimeoutError(request=request), SamplerUnavailable),
        (status_error(tinker.RateLimitError, 429), SamplerUnavailable),
        (status_error(tinker.InternalServerError, 503), SamplerUnavailable),
        (status_error(tinker.BadRequestError, 400), SamplerError),
    ]
    for error, expected in cases:
        sampler = TinkerSampler(base_model="m", client=fake_client(return_value=sdk_future(error=error)))
        with pytest.raises(expected) as info:
            asyncio.run(sampler.sample(req()))
        assert (expected is SamplerError) == (not isinstance(info.value, SamplerUnavailable))


def test_sample_timeout_is_unavailable() -> None:
    sampler = TinkerSampler(base_model="m", client=fake_client(return_value=sdk_future(pending=True)), timeout=0.2)
    with pytest.raises(SamplerUnavailable, match="no response after 0.2s"):
        asyncio.run(sampler.sample(req()))


def test_without_an_api_key_it_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(SamplerUnavailable, match="TINKER_API_KEY is not set"):
        asyncio.run(TinkerSampler(base_model="Qwen/Qwen3-8B").sample(req()))
    with pytest.raises(ValueError):
        TinkerSampler()


def test_real_service_client_against_an_unreachable_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ServiceClient.create_sampling_client, pointed at a closed local port: the
    sampler gives up after its timeout instead of hanging the request."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    monkeypatch.setenv("TINKER_API_KEY", "tml-not-a-real-key")
    sampler = TinkerSampler(base_model="Qwen/Qwen3-8B", base_url=f"http://127.0.0.1:{port}", timeout=1.5)
    with pytest.raises(SamplerUnavailable, match="no sampling client after 1.5s"):
        asyncio.run(sampler.sample(req()))


def test_a_cancelled_sample_cancels_the_sdk_request() -> None:
    """The SDK runs each request as a coroutine on its own loop thread and hands back a future
    of it (``run_coroutine_threadsafe``, wrapped as SamplingClient.sample wraps it). When the
    proxy's client goes away the sample is cancelled, and so is that coroutine."""
    sdk_loop = asyncio.new_event_loop()
    thread = threading.Thread(target=sdk_loop.run_forever, daemon=True)
    thread.start()
    started, cancelled = threading.Event(), threading.Event()

    async def request_in_flight() -> Any:
        started.set()
        try:
            await asyncio.Event().wait()  # the service has not answered yet
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def sample(**_: Any) -> Any:
        return _AwaitableFutureCompatWrapper(asyncio.run_coroutine_threadsafe(request_in_flight(), sdk_loop))

    sampler = TinkerSampler(base_model="m", client=fake_client(side_effect=sample))

    async def run() -> None:
        task = asyncio.create_task(sampler.sample(req()))
        assert await asyncio.to_thread(started.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(run())
        assert cancelled.wait(30), "the SDK's request kept running"
    finally:
        sdk_loop.call_soon_threadsafe(sdk_loop.stop)
        thread.join(timeout=10)
