"""A checkpoint bound to a vLLM (openai) route, through POST /v1/messages: its adapter is
loaded into the vLLM-shaped server and sampled there, as the local route samples it; a
refused load is an api_error naming the route and the snapshot."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from apps.accounts.services import model_credential_issue
from apps.objects.packages import dir_pack, snapshot_ref
from apps.objects.services import object_put
from apps.proxy import capture
from apps.proxy.models import Interaction
from apps.proxy.samplers.local import LocalTorchSampler
from apps.proxy.samplers.vllm_lora import lora_name_for
from tests.conftest import make_member
from tests.proxy.conftest import assert_error, call, make_route
from tests.proxy_samplers.checkpoints import SPEC, trained_adapter_save, with_adapter
from tests.proxy_samplers.vllm_like_server import CompletionsApp, ServerThread

pytestmark = pytest.mark.django_db

MESSAGE = {"max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def alice():
    return make_member("team", "alice")


@pytest.fixture(scope="module")
def tiny() -> LocalTorchSampler:
    return LocalTorchSampler.tiny(family="qwen3", seed=0)


@pytest.fixture(scope="module")
def trained_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained_adapter_save(root=tmp_path_factory.mktemp("training"), prompt=list(range(9707, 9731)))


@pytest.fixture
def vllm(tiny: LocalTorchSampler) -> Iterator[ServerThread]:
    with ServerThread(CompletionsApp(tiny, adapter_loader=with_adapter)) as server:
        yield server


def secret_for(org, *, route: str, snapshot: str) -> str:
    _, secret = model_credential_issue(
        org=org, run_id="run_v", trial_id="trl_v", route=route, snapshot=snapshot, ttl=timedelta(hours=1)
    )
    return secret


def test_a_checkpoint_on_a_vllm_route_samples_what_the_local_route_samples(
    alice, vllm: ServerThread, trained_adapter: Path, tmp_path: Path, settings
) -> None:
    settings.SYNTH_WEIGHTS_CACHE_DIR = tmp_path / "weights"
    sha256 = object_put(org=alice.org, data=dir_pack(path=trained_adapter)).sha256
    snapshot = snapshot_ref(sha256)
    make_route("qwen3-vllm", backend="openai", aliases=[], config={
        "base_url": vllm.base_url, "model": "tiny", "adapter_root": str(tmp_path / "adapters"),
    })  # fmt: skip
    make_route("qwen3-local", backend="local", aliases=[], config=SPEC)
    payloads = {}
    for route in ("qwen3-vllm", "qwen3-local", "qwen3-vllm"):
        reply = call(
            "/v1/messages",
            secret=secret_for(alice.org, route=route, snapshot=snapshot),
            body={"model": route, **MESSAGE},
        )
        assert reply.status == 200, reply.body
        interaction = Interaction.objects.latest("created_at")
        payloads.setdefault(route, []).append(capture.staged_payload(interaction=interaction))
    remote, local = payloads["qwen3-vllm"][0], payloads["qwen3-local"][0]
    assert remote["prompt_ids"] == local["prompt_ids"]
    assert remote["output_ids"] == local["output_ids"] and len(remote["output_ids"]) > 0
    name = lora_name_for(sha256=sha256)
    assert remote["snapshot"]["adapter"] == name and remote["snapshot"]["backend"] == "openai"
    assert local["snapshot"]["adapter_dir"].endswith(sha256)
    # Loaded once for both calls, and sampled by its name.
    assert vllm.app.loads == [name]
    assert [r["body"]["model"] for r in vllm.app.requests] == [name, name]
    assert payloads["qwen3-vllm"][1]["output_ids"] == remote["output_ids"]


def test_a_refused_load_is_an_api_error_naming_the_route_and_the_snapshot(
    alice, tiny: LocalTorchSampler, trained_adapter: Path, tmp_path: Path
) -> None:
    sha256 = object_put(org=alice.org, data=dir_pack(path=trained_adapter)).sha256
    snapshot = snapshot_ref(sha256)
    with ServerThread(CompletionsApp(tiny)) as no_runtime_loading:
        make_route("qwen3-vllm", backend="openai", aliases=[], config={
            "base_url": no_runtime_loading.base_url, "model": "tiny", "adapter_root": str(tmp_path / "adapters"),
        })  # fmt: skip
        reply = call(
            "/v1/messages",
            secret=secret_for(alice.org, route="qwen3-vllm", snapshot=snapshot),
            body={"model": "qwen3-vllm", **MESSAGE},
        )
    message = assert_error(reply, 500, "api_error")["error"]["message"]
    assert f"model route 'qwen3-vllm' cannot load snapshot '{snapshot}'" in message
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in message
    assert no_runtime_loading.app.requests == []  # nothing sampled on the base model instead


def test_a_vllm_route_without_an_adapter_root_says_so(alice, vllm: ServerThread) -> None:
    make_route("qwen3-vllm", backend="openai", aliases=[], config={"base_url": vllm.base_url, "model": "tiny"})
    snapshot = snapshot_ref("ef" * 32)
    reply = call(
        "/v1/messages",
        secret=secret_for(alice.org, route="qwen3-vllm", snapshot=snapshot),
        body={"model": "qwen3-vllm", **MESSAGE},
    )
    message = assert_error(reply, 500, "api_error")["error"]["message"]
    assert "'qwen3-vllm' (openai) cannot serve snapshot" in message and "adapter_root" in message
