"""Checkpoints as model bindings: pinned at admission (per organization), issued to
interactive sessions, and served by the proxy from the object store package."""

from __future__ import annotations

import hashlib

import pytest

from apps.core.errors import NotFound
from apps.objects.contract import ObjectCorrupt
from apps.objects.packages import dir_pack, snapshot_ref
from apps.objects.services import object_put
from apps.objects.store import store_get
from apps.proxy.calls import sampler_config
from apps.proxy.errors import ApiError
from apps.proxy.models import ModelRoute
from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
from apps.runs.services import run_submit
from apps.training.backends.local import LocalServiceClient, path_dir
from apps.training.models import Checkpoint
from tests.factories import make_dataset_version, make_profile_version

pytestmark = pytest.mark.django_db


@pytest.fixture
def adapter_package(tmp_path) -> bytes:
    client = (
        LocalServiceClient(spec={"tiny": True, "family": "qwen3", "seed": 0}, root=tmp_path)
        .create_lora_training_client("tiny", rank=2)
        .result()
    )
    return dir_pack(path=path_dir(client.save_weights_for_sampler("000001").result().path))


@pytest.fixture
def checkpoint(alice, adapter_package) -> Checkpoint:
    route_upsert(**DEFAULT_ROUTE)
    producer = _submit(alice, model={"route": "qwen3-8b"}, key="producer")
    obj = object_put(org=alice.org, data=adapter_package)
    return Checkpoint.objects.create(
        org=alice.org, run=producer, step=1, backend="local", route="qwen3-8b", base_model="qwen3-8b",
        lora_rank=2, snapshot=snapshot_ref(obj.sha256), sha256=obj.sha256, size=obj.size,
    )  # fmt: skip


def _submit(member, *, model: dict, key: str):
    recipe = {"model": model, "engine": {"name": "synth-mini", "version": "1"}, "limits": {"timeout_sec": 60}}
    profile = make_profile_version(org=member.org, name=f"mini-{key}", recipe=recipe)
    dataset = make_dataset_version(org=member.org, name=f"ds-{key}")
    body = {
        "kind": "evaluate",
        "dataset": dataset.reference,
        "actor": {"profile": profile.profile.name, "version": profile.version},
        "plan": {},
    }
    run, _ = run_submit(org=member.org, user=None, idempotency_key=key, body=body)
    return run


def test_a_checkpoint_binding_is_pinned_to_its_route_and_weights(alice, checkpoint):
    run = _submit(alice, model={"checkpoint": checkpoint.id}, key="uses-ckpt")
    assert run.spec.model_binding == {"checkpoint": checkpoint.id, "route": "qwen3-8b", "snapshot": checkpoint.snapshot}


def test_another_organizations_checkpoint_is_not_found(bob, checkpoint):
    with pytest.raises(NotFound) as err:
        _submit(bob, model={"checkpoint": checkpoint.id}, key="steal")
    assert err.value.field == "actor.model.checkpoint"


def test_an_interactive_session_on_a_checkpoint_gets_its_route_and_snapshot(alice, bob, checkpoint):
    issued = alice.client.post("/api/model-credentials", {"model": checkpoint.id}, format="json")
    assert issued.status_code == 201, issued.json()
    assert issued.json()["route"] == "qwen3-8b" and issued.json()["checkpoint"] == checkpoint.id
    from apps.accounts.models import ModelCredential

    assert ModelCredential.objects.get(org=alice.org).snapshot == checkpoint.snapshot
    refused = bob.client.post("/api/model-credentials", {"model": checkpoint.id}, format="json")
    assert refused.status_code == 404 and refused.json()["error"]["field"] == "model"


def test_the_proxy_unpacks_a_checkpoint_package_once_and_checks_its_digest(checkpoint, settings, tmp_path):
    settings.SYNTH_WEIGHTS_CACHE_DIR = tmp_path / "weights"
    route = ModelRoute.objects.get(name="qwen3-8b")
    config = sampler_config(route=route, snapshot=checkpoint.snapshot)
    adapter = tmp_path / "weights" / checkpoint.sha256
    assert config == {**route.sampler_config, "adapter_dir": str(adapter)}
    assert (adapter / "adapter_config.json").is_file()
    assert sampler_config(route=route, snapshot=checkpoint.snapshot) == config  # cached by digest

    # Bytes in the store that do not match their name are refused, never unpacked.
    forged = hashlib.sha256(b"other").hexdigest()
    store = store_get()
    store.path(forged).parent.mkdir(parents=True, exist_ok=True)
    store.path(forged).write_bytes(b"not the package")
    with pytest.raises(ObjectCorrupt):
        sampler_config(route=route, snapshot=snapshot_ref(forged))
    assert not (tmp_path / "weights" / forged).exists()
    with pytest.raises(ApiError, match="malformed"):
        sampler_config(route=route, snapshot="object:sha256:xyz")
    with pytest.raises(ApiError, match="cannot serve snapshot"):
        sampler_config(route=route, snapshot="tinker://run/sampler_weights/1")


def test_the_unpacked_weights_cache_keeps_the_most_recently_used(tmp_path, adapter_package, alice):
    import os
    import time

    from apps.objects.packages import cache_prune, package_materialize

    digests = []
    for i in range(3):  # three different packages (the same files, a different tar member)
        extra = tmp_path / f"pkg{i}"
        extra.mkdir()
        (extra / "n.txt").write_text(str(i))
        digests.append(object_put(org=alice.org, data=dir_pack(path=extra)).sha256)
    cache = tmp_path / "cache"
    for i, digest in enumerate(digests):
        path = package_materialize(sha256=digest, cache_dir=cache)
        os.utime(path / ".complete", (time.time() - 3600 + i, time.time() - 3600 + i))  # all idle, oldest first
    package_materialize(sha256=digests[0], cache_dir=cache)  # used again: now the newest
    assert cache_prune(cache_dir=cache, keep=2) == [digests[1]]
    assert sorted(p.name for p in cache.iterdir()) == sorted([digests[0], digests[2]])
    # Recently used entries survive even beyond `keep`: a loader may still be reading them.
    assert cache_prune(cache_dir=cache, keep=0) == [digests[2]]
    assert [p.name for p in cache.iterdir()] == [digests[0]]
