"""Training clients of the backends (apps.training.backends) and the weights they save:
local weights are packed into the object store, tinker:// paths are kept as they are."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.objects.packages import dir_pack, package_materialize, snapshot_ref, snapshot_sha256
from apps.objects.services import object_put
from apps.proxy.models import ModelRoute
from apps.runs.models import Run
from apps.training.backends import backend_service
from apps.training.backends.local import LOCAL_SCHEME, path_dir
from apps.training.models import Trainer

# One live training client per train run in this process, with the state path it holds:
# the next step reuses it instead of reloading, if nothing else trained the run meanwhile.
_clients: dict[str, tuple[str, Any]] = {}
_clients_lock = threading.Lock()


def _local_root() -> Path:
    return Path(settings.SYNTH_TRAINING_DIR)


def _state_to_backend(*, trainer: Trainer) -> str:
    """The backend path of the trainer's saved state (unpacking a local package)."""
    digest = snapshot_sha256(trainer.state_path)
    if digest is not None:
        # Only the newest states are ever resumed from; keep a few.
        directory = package_materialize(sha256=digest, cache_dir=_local_root() / "states", keep=4)
        return f"{LOCAL_SCHEME}{directory}"
    return trainer.state_path


def training_client(*, trainer: Trainer, plan: dict[str, Any]) -> Any:
    with _clients_lock:
        cached = _clients.get(trainer.run_id)
    if cached is not None and cached[0] == trainer.state_path:
        return cached[1]
    route = ModelRoute.objects.get(name=trainer.route)
    service = backend_service(backend=trainer.backend, route=route, root=_local_root())
    if trainer.state_path and trainer.state_path == trainer.weights_only_state:
        # A weights-only continuation's start: its weights, a fresh optimizer.
        client = service.create_training_client_from_state(_state_to_backend(trainer=trainer)).result()
    elif trainer.state_path:
        client = service.create_training_client_from_state_with_optimizer(_state_to_backend(trainer=trainer)).result()
    else:
        client = service.create_lora_training_client(
            trainer.base_model, rank=int(plan.get("lora_rank", 32)), seed=int(plan.get("seed", 0))
        ).result()
    with _clients_lock:
        _clients[trainer.run_id] = (trainer.state_path, client)
    return client


def client_state_note(*, run_id: str, state_path: str) -> None:
    """The run's live client now holds this saved state: the next step may reuse it."""
    with _clients_lock:
        if run_id in _clients:
            _clients[run_id] = (state_path, _clients[run_id][1])


def client_forget(run_id: str) -> None:
    with _clients_lock:
        cached = _clients.pop(run_id, None)
    close = getattr(cached[1], "close", None) if cached else None
    if close is not None:
        close()  # the local backend's ordered worker thread and model


def weights_persist(*, run: Run, path: str) -> tuple[str, str, int | None]:
    """(reference, sha256, size) of saved weights: a local directory is packed into the
    object store (create-only, by digest) and removed; a tinker:// path is kept as is."""
    if not path.startswith(LOCAL_SCHEME):
        return path, "", None
    directory = path_dir(path)
    obj = object_put(org=run.org, data=dir_pack(path=directory), content_type="application/x-tar")
    shutil.rmtree(directory, ignore_errors=True)
    return snapshot_ref(obj.sha256), obj.sha256, obj.size
