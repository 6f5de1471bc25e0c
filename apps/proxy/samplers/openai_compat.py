"""OpenAICompatibleSampler: token ids in, token ids and logprobs out, over a vLLM-style
``/v1/completions`` endpoint (vLLM; SGLang and others through ``extra_body``).

Request (vLLM accepts a list of token ids as the prompt; the rest are vLLM extensions):

    POST {base_url}/v1/completions
    {"model", "prompt": [ids], "max_tokens", "temperature", "top_p"?, "top_k"?, "seed"?,
     "stop_token_ids": [ids], "ignore_eos": true, "logprobs": 1,
     "return_tokens_as_token_ids": true, "return_token_ids": true, "n": 1, "stream": false}

* ``ignore_eos`` makes the stop set exactly ``stop_token_ids`` (the adapter's end-of-turn
  ids, which normally include EOS), as with the other backends.
* ``logprobs: 1`` rather than 0: the sampled token's logprob comes back either way, and some
  servers test the value for truth, so 0 would turn logprobs off there.

Response: ``choices[0].token_ids`` when the server returns them (vLLM >= 0.10.2 with
``return_token_ids``), else ``choices[0].logprobs.tokens`` as ``"token_id:N"`` strings
(``return_tokens_as_token_ids``); ``choices[0].logprobs.token_logprobs``; ``finish_reason``.

Logprob semantics are the server's: vLLM's default (``--logprobs-mode raw_logprobs``)
reports the model's log-softmax before temperature/top-k/top-p. Run vLLM with
``--logprobs-mode processed_logprobs`` to get the logprobs of the distribution actually
sampled from, which is what LocalTorchSampler reports; the two agree at temperature 1
without top-k/top-p.

Errors: connection refused, timeouts and 408/429/502/503/504/529 raise SamplerUnavailable
(the proxy answers 529/503); a 404 raises ModelNotServed (the model name is unknown there);
other failures raise SamplerError.

Checkpoints are served as LoRA adapters loaded into the server at run time
(``lora_load``/``lora_unload`` here; the policy in apps.proxy.samplers.vllm_lora).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx

from apps.proxy.samplers.base import Sampler, SampleRequest, SampleResult
from apps.proxy.samplers.factory import AdapterLoadFailed, ModelNotServed, SamplerError, SamplerUnavailable
from apps.proxy.samplers.vllm_lora import ServerAdapters

_RETRYABLE_STATUS = {408, 429, 502, 503, 504, 529}
_TOKEN_ID_PREFIX = "token_id:"


def server_url(base_url: str, endpoint: str) -> str:
    base = base_url.rstrip("/")
    # Accept both "http://host:8000" and the OpenAI-client style "http://host:8000/v1".
    return f"{base}/{endpoint}" if base.endswith("/v1") else f"{base}/v1/{endpoint}"


def completions_url(base_url: str) -> str:
    return server_url(base_url, "completions")


def completions_body(request: SampleRequest, *, model: str, extra_body: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(request.prompt_ids),
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "stop_token_ids": list(request.stop_token_ids),
        "ignore_eos": True,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "n": 1,
        "stream": False,
    }
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.top_k is not None and request.top_k > 0:
        body["top_k"] = request.top_k
    if request.seed is not None:
        body["seed"] = request.seed
    body.update(extra_body or {})
    return body


def _token_id(token: Any) -> int:
    if isinstance(token, int):
        return token
    if isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX):
        return int(token[len(_TOKEN_ID_PREFIX) :])
    raise SamplerError(
        f"completion logprobs token {token!r} is not a token id: the server ignored "
        "return_tokens_as_token_ids (vLLM supports it; others may need extra_body)"
    )


def completions_result(data: Any, *, snapshot: dict[str, Any]) -> SampleResult:
    """Map a vLLM-shaped completions response to a SampleResult."""
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise SamplerError(f"completions response has no choices: {str(data)[:300]}") from None
    logprobs = choice.get("logprobs") or {}
    token_logprobs = logprobs.get("token_logprobs")
    if token_logprobs is None:
        raise SamplerError("completions response has no logprobs.token_logprobs")
    if choice.get("token_ids") is not None:
        tokens = [int(t) for t in choice["token_ids"]]
    else:
        tokens = [_token_id(t) for t in logprobs.get("tokens") or []]
    if len(tokens) != len(token_logprobs):
        raise SamplerError(f"completions response has {len(tokens)} tokens but {len(token_logprobs)} logprobs")
    if any(lp is None for lp in token_logprobs):
        raise SamplerError("completions response has a null logprob for a sampled token")
    finish = choice.get("finish_reason")
    if finish not in ("stop", "length"):
        raise SamplerError(f"completions finish_reason {finish!r} (expected stop or length)")
    return SampleResult(
        token_ids=tokens,
        logprobs=[float(lp) for lp in token_logprobs],
        finish=finish,
        snapshot={**snapshot, "model": data.get("model") or snapshot.get("model"), "response_id": data.get("id")},
    )


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


class OpenAICompatibleSampler(Sampler):
    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        api_key_env: str | None = None,
        timeout: float = 600.0,
        connect_timeout: float = 5.0,
        extra_body: dict[str, Any] | None = None,
        client: httpx.AsyncClient | None = None,
        adapter_idle_seconds: float = 600.0,
        adapter_max_loaded: int = 8,
    ) -> None:
        self.base_url = base_url
        self.url = completions_url(base_url)
        self.model = model
        self.api_key = api_key
        self.api_key_env = api_key_env
        self.extra_body = dict(extra_body or {})
        # A long read timeout (a sample can take minutes on a busy server) but a short connect
        # timeout, so a dead server is reported quickly.
        self.timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._client = client
        self._owns_client = client is None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        # The LoRA adapters this process loaded into the server (checkpoints it serves).
        self.adapters = ServerAdapters(server=self, idle_seconds=adapter_idle_seconds, max_loaded=adapter_max_loaded)

    def _http(self) -> httpx.AsyncClient:
        # An AsyncClient's pooled connections belong to the loop that opened them; make a new
        # client if we are called from another loop (tests, management commands).
        loop = asyncio.get_running_loop()
        if self._client is None or (self._owns_client and self._client_loop is not loop):
            self._client = httpx.AsyncClient(timeout=self.timeout)
            self._client_loop = loop
        return self._client

    def _headers(self) -> dict[str, str]:
        key = self.api_key
        if key is None and self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise SamplerUnavailable(f"the openai backend needs an API key: {self.api_key_env} is not set")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def snapshot(self) -> dict[str, Any]:
        # The served model name identifies the weights (vLLM serves LoRA adapters as names).
        return {"backend": "openai", "model": self.model, "adapter": None, "base_url": self.base_url}

    async def sample(self, request: SampleRequest) -> SampleResult:
        return await self.sample_model(request, model=self.model, snapshot=self.snapshot())

    async def sample_model(self, request: SampleRequest, *, model: str, snapshot: dict[str, Any]) -> SampleResult:
        """Sample the served model named ``model`` (the base model, or a loaded adapter)."""
        body = completions_body(request, model=model, extra_body=self.extra_body)
        headers = self._headers()
        try:
            # Streamed and closed on every exit: when the proxy's client goes away this task is
            # cancelled, and closing a response not read to its end closes its connection
            # instead of returning it to the pool. That disconnect is what makes vLLM and
            # SGLang abort the generation, rather than finish it for nobody.
            async with self._http().stream("POST", self.url, json=body, headers=headers) as response:
                await response.aread()
        except httpx.TimeoutException as exc:
            raise SamplerUnavailable(f"{self.url}: timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:  # connection refused / reset, DNS, protocol errors
            raise SamplerUnavailable(f"{self.url}: cannot connect ({type(exc).__name__}: {exc})") from exc
        if response.status_code in _RETRYABLE_STATUS:
            raise SamplerUnavailable(
                f"{self.url}: {response.status_code} {response.text[:300]}", retry_after=_retry_after(response)
            )
        if response.status_code == 404:
            raise ModelNotServed(f"{self.url}: 404 for model {model!r}: {response.text[:300]}")
        if response.status_code != 200:
            raise SamplerError(f"{self.url}: {response.status_code} {response.text[:500]}")
        try:
            data = response.json()
        except ValueError:
            raise SamplerError(f"{self.url}: response is not JSON: {response.text[:300]}") from None
        return completions_result(data, snapshot=snapshot)

    # -- LoRA adapters loaded at run time (vLLM) ------------------------------------------

    async def _admin(self, endpoint: str, body: dict[str, Any]) -> httpx.Response:
        url = server_url(self.base_url, endpoint)
        try:
            response = await self._http().post(url, json=body, headers=self._headers())
        except httpx.TimeoutException as exc:
            raise SamplerUnavailable(f"{url}: timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise SamplerUnavailable(f"{url}: cannot connect ({type(exc).__name__}: {exc})") from exc
        if response.status_code in _RETRYABLE_STATUS:
            raise SamplerUnavailable(
                f"{url}: {response.status_code} {response.text[:300]}", retry_after=_retry_after(response)
            )
        return response

    async def lora_load(self, *, name: str, path: str) -> None:
        """Register the adapter directory ``path`` (as the server sees it) as model ``name``.
        Idempotent: "already loaded" is success (the name is the package's digest, so the
        same name always means the same weights)."""
        response = await self._admin("load_lora_adapter", {"lora_name": name, "lora_path": path})
        if response.status_code == 200:
            return
        text = response.text[:500]
        if response.status_code == 400 and "already" in text.lower():
            return
        hint = ""
        if response.status_code in (404, 405) and "adapter" not in text.lower():
            hint = " (the server has no runtime adapter loading: run vLLM with --enable-lora and "
            hint += "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
        raise AdapterLoadFailed(
            f"{self.base_url} could not load LoRA adapter from {path}: {response.status_code} {text}{hint}"
        )

    async def lora_unload(self, *, name: str) -> None:
        response = await self._admin("unload_lora_adapter", {"lora_name": name})
        if response.status_code not in (200, 404):  # 404: already gone, as wanted
            raise SamplerError(
                f"{self.base_url} could not unload LoRA adapter {name}: {response.status_code} {response.text[:300]}"
            )

    async def close(self) -> None:
        await self.adapters.close()  # best effort: unload failures are logged
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
