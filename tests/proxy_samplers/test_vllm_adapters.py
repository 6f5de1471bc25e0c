"""Checkpoints served by a vLLM-shaped server: LoRA adapters loaded into it at run time
(POST /v1/load_lora_adapter, with PEFT onto the same tiny model), sampled by name, unloaded
when idle or beyond the loaded maximum, reloaded after the server lost them."""

from __future__ import annotations

import asyncio
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.objects.packages import dir_pack, snapshot_ref
from apps.objects.services import object_put
from apps.proxy.calls import sampler_config
from apps.proxy.errors import ApiError
from apps.proxy.models import ModelRoute
from apps.proxy.samplers.base import SampleRequest
from apps.proxy.samplers.factory import (
    AdapterLoadFailed,
    ModelNotServed,
    SamplerUnavailable,
    sampler_build,
    sampler_cache_clear,
)
from apps.proxy.samplers.local import LocalTorchSampler
from apps.proxy.samplers.openai_compat import OpenAICompatibleSampler
from apps.proxy.samplers.vllm_lora import AdapterSampler, lora_name_for
from tests.proxy_samplers.checkpoints import SPEC, trained_adapter_save, with_adapter
from tests.proxy_samplers.conftest import PROMPT
from tests.proxy_samplers.vllm_like_server import CompletionsApp, ServerThread


def req(**kw: object) -> SampleRequest:
    base: dict[str, object] = {"prompt_ids": PROMPT, "max_tokens": 8, "stop_token_ids": [151645], "seed": 5}
    base.update(kw)
    return SampleRequest(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def trained_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained_adapter_save(root=tmp_path_factory.mktemp("training"), prompt=PROMPT)


@pytest.fixture
def server(tiny: LocalTorchSampler) -> Iterator[ServerThread]:
    with ServerThread(CompletionsApp(tiny, adapter_loader=with_adapter)) as running:
        yield running


@pytest.fixture
def adapter_root(tmp_path: Path, trained_adapter: Path) -> Callable[[str], str]:
    """An adapter directory the server reads, under a name (as sampler_config lays it out)."""

    def place(name: str) -> str:
        target = tmp_path / "adapters" / name
        if not target.exists():
            shutil.copytree(trained_adapter, target)
        return str(target)

    return place


def run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(coro_fn())


def sample_once(sampler: AdapterSampler | OpenAICompatibleSampler, request: SampleRequest) -> Any:
    """One sample on a fresh loop, then the server sampler's connections closed."""
    client = sampler.server if isinstance(sampler, AdapterSampler) else sampler

    async def go() -> Any:
        try:
            return await sampler.sample(request)
        finally:
            await client.close()

    return asyncio.run(go())


async def until(condition: Callable[[], bool], what: str) -> None:
    """A bounded wait for a condition (the sweeper runs on the loop)."""
    for _ in range(3000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def open_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    return port


# SERVED LIKE THE LOCAL SAMPLER
# ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_trained_checkpoint_on_an_openai_route_samples_as_the_local_sampler_does(
    alice, server: ServerThread, trained_adapter: Path, tmp_path: Path, settings
) -> None:
    settings.SYNTH_WEIGHTS_CACHE_DIR = tmp_path / "weights"
    sha256 = object_put(org=alice.org, data=dir_pack(path=trained_adapter)).sha256
    snapshot = snapshot_ref(sha256)
    local = ModelRoute(name="tiny-local", sampler_backend="local", sampler_config=SPEC)
    remote = ModelRoute(
        name="tiny-vllm",
        sampler_backend="openai",
        sampler_config={"base_url": server.base_url, "model": "tiny", "adapter_root": str(tmp_path / "adapters")},
    )
    config = sampler_config(route=remote, snapshot=snapshot)
    name = lora_name_for(sha256=sha256)
    assert (config["lora_name"], config["lora_path"]) == (name, str(tmp_path / "adapters" / sha256))
    assert (Path(config["lora_path"]) / "adapter_config.json").is_file()  # unpacked by digest
    assert not list((tmp_path / "adapters").glob(".*"))  # no staging directory left behind
    served = sampler_build(backend="openai", config=config)
    assert isinstance(served, AdapterSampler)
    direct = sampler_build(backend="local", config=sampler_config(route=local, snapshot=snapshot))
    base = sampler_build(backend="local", config=SPEC)
    try:
        for request in (req(temperature=0.0, seed=None), req(temperature=1.0, seed=5), req(temperature=0.7, top_k=40)):
            remote_result = run(lambda r=request: served.sample(r))
            local_result = direct.sample_blocking(request)  # type: ignore[attr-defined]
            assert remote_result.token_ids == local_result.token_ids
            assert remote_result.logprobs == pytest.approx(local_result.logprobs, abs=1e-5)
            assert remote_result.finish == local_result.finish
        # The adapter is what samples: the base model gives these ids other logprobs.
        on_base = base.completion_logprobs(prompt_ids=PROMPT, completion_ids=remote_result.token_ids)  # type: ignore[attr-defined]
        assert max(abs(a - b) for a, b in zip(on_base, remote_result.logprobs, strict=True)) > 1e-3
        assert remote_result.snapshot["model"] == remote_result.snapshot["adapter"] == name
        assert remote_result.snapshot["backend"] == "openai"
        # Loaded once for the three samples, and sampled by its name.
        assert server.app.loads == [name] and server.app.unloads == []
        assert {r["body"]["model"] for r in server.app.requests} == {name}
        # The same checkpoint again: the same sampler config, nothing loaded anew.
        assert sampler_config(route=remote, snapshot=snapshot) == config
        run(lambda: sampler_build(backend="openai", config=config).sample(req(max_tokens=2)))
        assert server.app.loads == [name]
    finally:
        for sampler in sampler_cache_clear():
            run(sampler.close)
    assert server.app.unloads == [name]  # closing the server's sampler unloads what is idle


def test_a_snapshot_an_openai_route_cannot_serve_is_a_clear_error(tmp_path: Path) -> None:
    route = ModelRoute(name="vllm", sampler_backend="openai", sampler_config={"base_url": "http://h", "model": "m"})
    with pytest.raises(ApiError, match=r"'vllm' \(openai\) cannot serve snapshot .*needs adapter_root"):
        sampler_config(route=route, snapshot=snapshot_ref("ab" * 32))
    route.sampler_config = {**route.sampler_config, "adapter_root": str(tmp_path)}
    with pytest.raises(ApiError, match="malformed"):
        sampler_config(route=route, snapshot="object:sha256:xyz")
    with pytest.raises(ApiError, match="cannot serve snapshot"):
        sampler_config(route=route, snapshot="object:elsewhere")
    with pytest.raises(ValueError, match="go together"):
        sampler_build(backend="openai", config={"base_url": "http://h", "model": "m", "lora_name": "x"})


def test_the_server_can_see_the_adapter_root_under_another_path(tmp_path: Path) -> None:
    sha256 = "cd" * 32
    (tmp_path / "adapters" / sha256).mkdir(parents=True)
    (tmp_path / "adapters" / sha256 / ".complete").write_text("")  # already unpacked
    route = ModelRoute(
        name="vllm",
        sampler_backend="openai",
        sampler_config={
            "base_url": "http://h",
            "model": "m",
            "adapter_root": str(tmp_path / "adapters"),
            "adapter_server_root": "/mnt/adapters/",
        },
    )
    assert sampler_config(route=route, snapshot=snapshot_ref(sha256))["lora_path"] == f"/mnt/adapters/{sha256}"


# LOADING ONCE, UNLOADING
# ------------------------------------------------------------------------------


def test_concurrent_first_calls_load_the_adapter_once(server: ServerThread, adapter_root, tiny) -> None:
    path = adapter_root("synth-a")
    client = OpenAICompatibleSampler(base_url=server.base_url, model="tiny")
    served = AdapterSampler(server=client, name="synth-a", path=path)
    server.app.load_gate = gate = threading.Event()
    requests = [req(seed=s, max_tokens=4) for s in range(4)]

    async def go() -> list[Any]:
        tasks = [asyncio.create_task(served.sample(r)) for r in requests]
        # The first load is held at the server; the other three calls are waiting by then
        # (had they not waited on it, their loads would have arrived too).
        await until(lambda: server.app.loads == ["synth-a"], "the first load arrives")
        gate.set()
        try:
            return await asyncio.gather(*tasks)
        finally:
            await client.close()

    results = run(go)
    assert server.app.loads == ["synth-a"]
    assert [r.token_ids for r in results] == [with_adapter(path).sample_blocking(r).token_ids for r in requests]
    assert tiny.sample_blocking(requests[0]).logprobs != pytest.approx(results[0].logprobs, abs=1e-3)


def test_an_idle_adapter_is_unloaded_and_loaded_again_when_used(server: ServerThread, adapter_root) -> None:
    client = OpenAICompatibleSampler(base_url=server.base_url, model="tiny", adapter_idle_seconds=0.0)
    served = AdapterSampler(server=client, name="synth-a", path=adapter_root("synth-a"))

    async def go() -> None:
        await served.sample(req(max_tokens=2))
        await until(lambda: server.app.unloads == ["synth-a"], "the idle adapter is unloaded")
        assert client.adapters.loaded() == [] and "synth-a" not in server.app.adapters
        await served.sample(req(max_tokens=2))
        assert server.app.loads == ["synth-a", "synth-a"]
        await client.close()

    run(go)


def test_beyond_the_maximum_the_least_recently_used_idle_adapter_is_unloaded(
    server: ServerThread, adapter_root
) -> None:
    client = OpenAICompatibleSampler(base_url=server.base_url, model="tiny", adapter_max_loaded=2)
    a, b, c = (AdapterSampler(server=client, name=f"synth-{n}", path=adapter_root(f"synth-{n}")) for n in "abc")

    async def go() -> None:
        for sampler in (a, b, a, c):
            await sampler.sample(req(max_tokens=1))
        assert server.app.unloads == ["synth-b"]  # a was used after b
        assert client.adapters.loaded() == ["synth-a", "synth-c"]
        assert sorted(server.app.adapters) == ["synth-a", "synth-c"]
        await client.close()

    run(go)


def test_an_adapter_in_use_is_not_unloaded_until_its_sample_ends(server: ServerThread, adapter_root) -> None:
    client = OpenAICompatibleSampler(base_url=server.base_url, model="tiny", adapter_max_loaded=1)
    a, b = (AdapterSampler(server=client, name=f"synth-{n}", path=adapter_root(f"synth-{n}")) for n in "ab")
    server.app.hold_models.add("synth-a")

    async def go() -> None:
        held = asyncio.create_task(a.sample(req()))
        await until(server.app.held.is_set, "the sample on a is at the server")
        await b.sample(req(max_tokens=1))
        # One over the maximum: the least recently used idle one goes, and a is busy.
        await until(lambda: server.app.unloads == ["synth-b"], "b is unloaded")
        assert client.adapters.loaded() == ["synth-a"] and "synth-a" in server.app.adapters
        held.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await held
        assert client.adapters.in_use(name="synth-a") == 0
        assert await client.adapters.sweep() == []  # within the maximum now, and not idle long
        assert client.adapters.loaded() == ["synth-a"]
        await client.close()

    run(go)
    # Set by the server thread once it sees the closed request: waited for, not sampled.
    assert server.app.disconnected.wait(timeout=30)  # the cancelled generation's request was closed


def test_a_server_that_lost_the_adapter_gets_it_again_once(server: ServerThread, adapter_root) -> None:
    client = OpenAICompatibleSampler(base_url=server.base_url, model="tiny")
    served = AdapterSampler(server=client, name="synth-a", path=adapter_root("synth-a"))

    async def go() -> list[Any]:
        first = await served.sample(req(max_tokens=3))
        server.app.adapters.clear()  # restarted: it knows no adapters now
        again = await asyncio.gather(*(served.sample(req(max_tokens=3)) for _ in range(3)))
        await client.close()
        return [first, *again]

    results = run(go)
    assert server.app.loads == ["synth-a", "synth-a"]  # reloaded once for the three samples
    assert len({tuple(r.token_ids) for r in results}) == 1
    # A server that does not know a model answers 404; the base model's sampler says so.
    plain = OpenAICompatibleSampler(base_url=server.base_url, model="synth-unknown")
    with pytest.raises(ModelNotServed, match="does not exist"):
        sample_once(plain, req())


# ERRORS
# ------------------------------------------------------------------------------


def test_load_failures_are_clear_errors_and_leave_nothing_in_use(server: ServerThread, tmp_path: Path, tiny) -> None:
    client = OpenAICompatibleSampler(base_url=server.base_url, model="tiny")
    missing = AdapterSampler(server=client, name="synth-x", path=str(tmp_path / "nothing-here"))
    with pytest.raises(AdapterLoadFailed, match=r"could not load LoRA adapter from .*nothing-here: 404 .*No adapter"):
        sample_once(missing, req())
    assert client.adapters.loaded() == [] and server.app.requests == []
    # A server without runtime adapter loading says what to turn on.
    with ServerThread(CompletionsApp(tiny)) as plain_server:
        plain = OpenAICompatibleSampler(base_url=plain_server.base_url, model="tiny")
        with pytest.raises(AdapterLoadFailed, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
            sample_once(AdapterSampler(server=plain, name="synth-x", path=str(tmp_path)), req())
    # A server that is down is unavailable (the proxy answers overloaded), not a failure.
    down = OpenAICompatibleSampler(base_url=f"http://127.0.0.1:{open_port()}", model="tiny")
    with pytest.raises(SamplerUnavailable, match="cannot connect"):
        sample_once(AdapterSampler(server=down, name="synth-x", path=str(tmp_path)), req())
    assert down.adapters.loaded() == []


def test_an_adapter_another_process_loaded_counts_as_loaded(server: ServerThread, adapter_root) -> None:
    path = adapter_root("synth-a")
    one = OpenAICompatibleSampler(base_url=server.base_url, model="tiny")
    other = OpenAICompatibleSampler(base_url=server.base_url, model="tiny")

    async def go() -> None:
        await AdapterSampler(server=one, name="synth-a", path=path).sample(req(max_tokens=1))
        await AdapterSampler(server=other, name="synth-a", path=path).sample(req(max_tokens=1))
        assert other.adapters.loaded() == ["synth-a"]
        await one.close()  # unloads what it loaded; the other process gets it back once on 404
        await AdapterSampler(server=other, name="synth-a", path=path).sample(req(max_tokens=1))
        await other.close()

    run(go)
    assert server.app.loads == ["synth-a", "synth-a", "synth-a"]
    assert server.app.unloads == ["synth-a", "synth-a"] and server.app.adapters == {}
