"""The learner calls the Tinker SDK's own surface: every call it makes binds to the real
``tinker`` 0.38 signatures, and the local backend mirrors them. (The service itself is
not reachable here; without an API key the SDK refuses, and the run says so.)"""

from __future__ import annotations

import inspect

import pytest
import tinker
from tinker import types

from apps.training.backends.local import LocalServiceClient, LocalTrainingClient

# (method, args, kwargs) exactly as apps.training.services calls them.
SERVICE_CALLS = [
    ("create_lora_training_client", ("Qwen/Qwen3-8B",), {"rank": 32, "seed": 0}),
    ("create_training_client_from_state_with_optimizer", ("tinker://run/weights/000001",), {}),
]
TRAINER_CALLS = [
    ("forward_backward", ([], "importance_sampling"), {}),
    ("optim_step", (types.AdamParams(learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-8),), {}),
    ("save_weights_for_sampler", ("000001",), {}),
    ("save_state", ("000001",), {}),
]


@pytest.mark.parametrize(("method", "args", "kwargs"), SERVICE_CALLS)
def test_service_calls_bind_to_the_sdk_and_the_local_backend(method, args, kwargs):
    inspect.signature(getattr(tinker.ServiceClient, method)).bind(None, *args, **kwargs)
    inspect.signature(getattr(LocalServiceClient, method)).bind(None, *args, **kwargs)


@pytest.mark.parametrize(("method", "args", "kwargs"), TRAINER_CALLS)
def test_trainer_calls_bind_to_the_sdk_and_the_local_backend(method, args, kwargs):
    inspect.signature(getattr(tinker.TrainingClient, method)).bind(None, *args, **kwargs)
    inspect.signature(getattr(LocalTrainingClient, method)).bind(None, *args, **kwargs)


def test_the_sdk_refuses_without_a_key_as_the_learner_expects(monkeypatch):
    from apps.proxy.models import ModelRoute
    from apps.training.backends import BackendUnavailable, backend_service

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    route = ModelRoute(name="q", sampler_backend="tinker", sampler_config={"base_model": "Qwen/Qwen3-8B"})
    with pytest.raises(BackendUnavailable, match=r"\$TINKER_API_KEY"):
        backend_service(backend="tinker", route=route, root=None)
    monkeypatch.setenv("TINKER_API_KEY", "tml-not-a-real-key")
    service = backend_service(backend="tinker", route=route, root=None)
    assert isinstance(service, tinker.ServiceClient)  # constructed lazily: no network yet


def test_an_update_ends_before_the_broker_would_deliver_it_again(settings):
    from apps.training.tasks import update_apply_task

    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    assert update_apply_task.time_limit < visibility
