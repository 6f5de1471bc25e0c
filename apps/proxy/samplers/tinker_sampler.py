"""TinkerSampler: sampling through the tinker SDK's SamplingClient (Thinking Machines' service).

    TinkerSampler(base_model="Qwen/Qwen3-8B")                     # the base model
    TinkerSampler(model_path="tinker://<run>/sampler_weights/000100")  # LoRA weights of a run
    TinkerSampler(client=<anything with SamplingClient.sample>)    # the test seam

Without an injected ``client`` the SamplingClient is created on first use from
``tinker.ServiceClient(api_key=$TINKER_API_KEY).create_sampling_client(...)``. That call
blocks while the SDK opens its session (and retries while the service is unreachable), so
it runs on a daemon thread, shared by concurrent first requests, bounded by ``timeout``.

Request mapping: ``ModelInput.from_ints(prompt_ids)`` and ``SamplingParams(max_tokens,
temperature, top_p (1.0 = off), top_k (-1 = off), stop=stop_token_ids, seed)``, one sample.
``stop`` is always a list of ids: an empty list disables every stop, EOS included (SDK
semantics), which is this interface's meaning too (stop only on the given ids).

Response mapping: ``sequences[0].tokens`` (the stop token included, as the service returns
it), ``.logprobs`` (the per-token logprobs of the sampled tokens; what distribution the
service reports them under at temperature != 1 is not documented by the SDK) and
``.stop_reason`` ("stop" | "length"), plus ``sequence_id`` into the snapshot.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Any

import tinker
from tinker import types

from apps.proxy.samplers.base import Sampler, SampleRequest, SampleResult
from apps.proxy.samplers.factory import SamplerError, SamplerUnavailable

# Status codes that mean "try again later" rather than "this request is wrong".
_RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504, 529}


def tinker_sampling_inputs(request: SampleRequest) -> tuple[types.ModelInput, types.SamplingParams]:
    """The SDK request types for one SampleRequest."""
    prompt = types.ModelInput.from_ints(list(request.prompt_ids))
    params = types.SamplingParams(
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p if request.top_p is not None else 1.0,
        top_k=request.top_k if request.top_k and request.top_k > 0 else -1,
        stop=list(request.stop_token_ids),
        seed=request.seed,
    )
    return prompt, params


def tinker_result(response: types.SampleResponse, *, snapshot: dict[str, Any]) -> SampleResult:
    """Map the first sequence of a SampleResponse to a SampleResult."""
    if not response.sequences:
        raise SamplerError("tinker returned no sequences")
    sequence = response.sequences[0]
    tokens = [int(t) for t in sequence.tokens]
    logprobs = sequence.logprobs
    if logprobs is None:
        raise SamplerError("tinker returned no logprobs for the sampled tokens")
    if len(logprobs) != len(tokens):
        raise SamplerError(f"tinker returned {len(tokens)} tokens but {len(logprobs)} logprobs")
    if sequence.stop_reason not in ("stop", "length"):
        raise SamplerError(f"unknown tinker stop_reason {sequence.stop_reason!r}")
    return SampleResult(
        token_ids=tokens,
        logprobs=[float(x) for x in logprobs],
        finish=sequence.stop_reason,
        snapshot={**snapshot, "sequence_id": sequence.sequence_id},
    )


def _tinker_error(exc: BaseException, *, what: str) -> SamplerError:
    if isinstance(exc, tinker.APIConnectionError):  # includes APITimeoutError
        return SamplerUnavailable(f"tinker {what}: cannot reach the service ({exc})")
    if isinstance(exc, tinker.APIStatusError) and exc.status_code in _RETRYABLE_STATUS:
        return SamplerUnavailable(f"tinker {what}: service answered {exc.status_code} ({exc.message})")
    return SamplerError(f"tinker {what} failed: {type(exc).__name__}: {exc}")


class TinkerSampler(Sampler):
    def __init__(
        self,
        *,
        base_model: str | None = None,
        model_path: str | None = None,
        client: Any | None = None,
        api_key_env: str = "TINKER_API_KEY",
        base_url: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        if client is None and not (base_model or model_path):
            raise ValueError("TinkerSampler needs base_model or model_path (or an injected client)")
        self.base_model = base_model
        self.model_path = model_path
        self.api_key_env = api_key_env
        self.base_url = base_url
        self.timeout = timeout
        self._client = client
        self._client_future: concurrent.futures.Future[Any] | None = None
        self._client_lock = threading.Lock()

    # -- client ---------------------------------------------------------------------------

    def _create_client(self, api_key: str, result: concurrent.futures.Future[Any]) -> None:
        try:
            service = tinker.ServiceClient(api_key=api_key, base_url=self.base_url)
            client = service.create_sampling_client(model_path=self.model_path, base_model=self.base_model).result()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request
            result.set_exception(exc)
        else:
            result.set_result(client)

    async def _client_get(self) -> Any:
        if self._client is not None:
            return self._client
        api_key = os.environ.get(self.api_key_env)
        if not api_key:
            raise SamplerUnavailable(f"the tinker backend needs an API key: {self.api_key_env} is not set")
        with self._client_lock:
            if self._client_future is None:
                self._client_future = concurrent.futures.Future()
                # A daemon thread, not an executor: if the service never answers, the SDK keeps
                # retrying there and must not keep the process from exiting.
                threading.Thread(
                    target=self._create_client,
                    args=(api_key, self._client_future),
                    daemon=True,
                    name="tinker-sampling-client",
                ).start()
            pending = self._client_future
        try:
            # shield: one request timing out must not cancel the creation others wait for.
            client = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(pending)), self.timeout)
        except TimeoutError:
            raise SamplerUnavailable(
                f"tinker: no sampling client after {self.timeout:g}s (service unreachable or slow)"
            ) from None
        except Exception as exc:
            with self._client_lock:
                if self._client_future is pending:
                    self._client_future = None  # let the next request try again
            raise _tinker_error(exc, what="create_sampling_client") from exc
        self._client = client
        return client

    def snapshot(self, client: Any) -> dict[str, Any]:
        base_model = self.base_model
        if base_model is None and hasattr(client, "get_base_model"):
            try:
                base_model = client.get_base_model()
            except Exception:  # noqa: BLE001 - provenance only
                base_model = None
        return {
            "backend": "tinker",
            "model": base_model,
            # A tinker:// sampler path names the run's LoRA weights: that is the adapter.
            "adapter": self.model_path,
        }

    # -- sampling -------------------------------------------------------------------------

    async def sample(self, request: SampleRequest) -> SampleResult:
        client = await self._client_get()
        prompt, params = tinker_sampling_inputs(request)
        future = None
        try:
            future = client.sample(prompt=prompt, num_samples=1, sampling_params=params)
            # The SDK returns an APIFuture: awaitable, resolved on the SDK's own loop thread.
            response = await asyncio.wait_for(_awaited(future), self.timeout)
        except asyncio.CancelledError:
            # The caller went away (client disconnect): cancel the request on the SDK's loop
            # too, whatever awaiting its future did, so it stops polling for a result nobody
            # reads.
            if future is not None:
                _cancel(future)
            raise
        except TimeoutError:
            if future is not None:
                _cancel(future)
            raise SamplerUnavailable(f"tinker sample: no response after {self.timeout:g}s") from None
        except tinker.TinkerError as exc:
            raise _tinker_error(exc, what="sample") from exc
        return tinker_result(response, snapshot=self.snapshot(client))


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _cancel(future: Any) -> None:
    """Cancel an SDK future: an APIFuture's standard future (cancelling it cancels the
    operation, per the SDK), or an older SDK's concurrent.futures.Future itself."""
    standard = future.future() if hasattr(future, "future") else future
    if isinstance(standard, concurrent.futures.Future | asyncio.Future):
        standard.cancel()
