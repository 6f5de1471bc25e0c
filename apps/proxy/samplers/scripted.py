"""Test and benchmark doubles behind the Sampler interface.

* ``ScriptedSampler`` emits given token-id sequences, one per call in order or chosen by a
  callable of the prompt ids, each with logprob 0.0. The proxy's Claude Code harness test
  uses it to emit a family's native tool-call tokens without a model.
  A route names a chooser of the platform's by ``{"script": NAME}`` (:data:`SCRIPTS`): a
  route's config is JSON and the proxy is its own process, so the callable is looked up by
  name there; only the listed ones, never an arbitrary import path.
* ``InstantSampler`` returns the same short completion immediately, for load benchmarks of
  everything around the model.

Both honour the request like a real sampler would: the output is cut at the first stop token
(which is kept, finish "stop") and at ``max_tokens`` (finish "length").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from apps.proxy.samplers.base import Sampler, SampleRequest, SampleResult
from apps.proxy.samplers.factory import SamplerError

Chooser = Callable[[list[int]], Sequence[int]]

# Named choosers a scripted route may use: name -> "module:function".
SCRIPTS = {"harness-check": "apps.proxy.samplers.harness_script:choose"}


def script_chooser(*, name: str) -> Chooser:
    """The chooser registered as ``name`` (ValueError for any other)."""
    from django.utils.module_loading import import_string

    path = SCRIPTS.get(name) if isinstance(name, str) else None
    if path is None:
        raise ValueError(f"unknown scripted sampler script {name!r}; known: {sorted(SCRIPTS)}")
    return import_string(path.replace(":", "."))


def _truncate(token_ids: Sequence[int], request: SampleRequest) -> tuple[list[int], str]:
    stop = set(request.stop_token_ids)
    out: list[int] = []
    for token in token_ids:
        if len(out) >= request.max_tokens:
            return out, "length"
        out.append(int(token))
        if token in stop:
            return out, "stop"
    # A script that ends without a stop token reads as a cut-off turn, as from a real model.
    return out, "length"


class ScriptExhausted(SamplerError):
    """The script has no sequence left for this call (and ``cycle`` is off)."""


class ScriptedSampler(Sampler):
    def __init__(
        self, *, sequences: Sequence[Sequence[int]] | None = None, choose: Chooser | None = None, cycle: bool = False
    ) -> None:
        if (sequences is None) == (choose is None):
            raise ValueError("give exactly one of sequences= or choose=")
        self._sequences = [list(s) for s in sequences] if sequences is not None else None
        self._choose = choose
        self._cycle = cycle
        self._lock = threading.Lock()  # the proxy may call concurrently; calls are numbered
        self.calls = 0
        self.requests: list[SampleRequest] = []  # what was asked, for test assertions

    def _next(self, request: SampleRequest) -> tuple[int, Sequence[int]]:
        with self._lock:
            index = self.calls
            self.calls += 1
            self.requests.append(request)
        if self._choose is not None:
            return index, self._choose(list(request.prompt_ids))
        assert self._sequences is not None
        if index >= len(self._sequences):
            if not self._cycle or not self._sequences:
                raise ScriptExhausted(f"scripted sampler has {len(self._sequences)} sequences; call {index + 1}")
            return index, self._sequences[index % len(self._sequences)]
        return index, self._sequences[index]

    async def sample(self, request: SampleRequest) -> SampleResult:
        index, sequence = self._next(request)
        tokens, finish = _truncate(sequence, request)
        return SampleResult(
            token_ids=tokens,
            logprobs=[0.0] * len(tokens),
            finish=finish,  # type: ignore[arg-type]
            snapshot={"backend": "scripted", "model": "scripted", "adapter": None, "call": index},
        )


class InstantSampler(Sampler):
    """Returns ``token_ids`` followed by the request's first stop token, at once.

    With the default (no body tokens) every turn is an empty, cleanly ended assistant turn.
    """

    def __init__(self, *, token_ids: Sequence[int] = ()) -> None:
        self.token_ids = [int(t) for t in token_ids]

    async def sample(self, request: SampleRequest) -> SampleResult:
        body = self.token_ids + request.stop_token_ids[:1]
        tokens, finish = _truncate(body, request)
        return SampleResult(
            token_ids=tokens,
            logprobs=[0.0] * len(tokens),
            finish=finish,  # type: ignore[arg-type]
            snapshot={"backend": "instant", "model": "instant", "adapter": None},
        )
