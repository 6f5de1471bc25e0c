"""Training backends: the Tinker service, or PyTorch + PEFT in this process.

Both are reached through the subset of the ``tinker`` SDK surface the training service
uses, with the SDK's own names and wire types (``tinker.types``):

    service = backend_service(backend="local"|"tinker", route=..., root=...)
    trainer = service.create_lora_training_client(base_model, rank=.., seed=..).result()
    trainer = service.create_training_client_from_state_with_optimizer(path).result()
    trainer.forward_backward(datums, "importance_sampling").result()
    trainer.optim_step(types.AdamParams(...)).result()
    trainer.save_weights_for_sampler(name).result().path   # what the proxy samples from
    trainer.save_state(name).result().path                 # weights + optimizer, to resume

``tinker.ServiceClient`` is that surface already; ``local.LocalServiceClient`` mirrors it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

BACKENDS = ("local", "tinker")


class BackendUnavailable(RuntimeError):
    """The backend cannot be used here (no API key, wrong route kind); retrying will not help."""


def base_model_name(*, backend: str, route: Any) -> str:
    """The name the backend knows the route's base model by."""
    config = route.sampler_config or {}
    if backend == "tinker":
        name = config.get("base_model")
        if not name:
            raise BackendUnavailable(
                f"model route {route.name!r} has no tinker base_model; train on a route whose sampler is tinker"
            )
        return name
    return route.name


_LOCAL_BASE_KEYS = ("tiny", "family", "seed", "model_dir")


def local_base_spec(*, route: Any) -> dict[str, Any]:
    """The base weights the local backend trains for ``route``: a local route's own model,
    or, for an openai route (a vLLM server), its ``train_base``, the same weights as the
    server serves (``{"model_dir": ...}``, or the tiny model's spec). Checkpoints trained so
    are then served by that server, their adapters loaded at run time."""
    config = route.sampler_config or {}
    if route.sampler_backend == "local":
        return {k: v for k, v in config.items() if k in _LOCAL_BASE_KEYS}
    if route.sampler_backend == "openai" and isinstance(config.get("train_base"), dict):
        return {k: v for k, v in config["train_base"].items() if k in _LOCAL_BASE_KEYS}
    raise BackendUnavailable(
        f"the local backend trains routes served by the local sampler, or openai routes whose sampler_config "
        f"names the served weights as train_base; {route.name!r} is served by {route.sampler_backend!r}"
        + (" without train_base" if route.sampler_backend == "openai" else "")
    )


def backend_service(*, backend: str, route: Any, root: Path) -> Any:
    """A ServiceClient-shaped object for ``backend`` and the route being trained."""
    if backend == "local":
        from apps.training.backends.local import LocalServiceClient

        return LocalServiceClient(spec=local_base_spec(route=route), root=root)
    if backend == "tinker":
        if route.sampler_backend != "tinker":
            raise BackendUnavailable(
                f"the tinker backend trains routes served by the tinker sampler; {route.name!r} is served by "
                f"{route.sampler_backend!r}"
            )
        env = (route.sampler_config or {}).get("api_key_env", "TINKER_API_KEY")
        key = os.environ.get(env)
        if not key:
            raise BackendUnavailable(f"the tinker backend needs an API key in ${env}; it is not set")
        import tinker

        return tinker.ServiceClient(api_key=key)
    raise BackendUnavailable(f"unknown training backend {backend!r}; known: {', '.join(BACKENDS)}")
