"""Training clients of the backends (apps.training.backends) and the weights they save:
local weights are packed into the object store, tinker:// paths are kept as they are."""

from __future__ import annotations

import logging
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.objects.packages import dir_pack, package_materialize, snapshot_ref, snapshot_sha256
from apps.objects.services import object_put
from apps.proxy.models import ModelRoute
from apps.runs.models import Run
from apps.training.backends import backend_service
from apps.training.backends.local import LOCAL_SCHEME, path_dir
from apps.training.models import Trainer, TrainerStatus

logger = logging.getLogger(__name__)


@dataclass
class LiveClient:
    """A train run's training client in this process and what it holds: its weights are
    those of ``state_path`` after ``step`` updates, and it has accumulated the gradients of
    the contributions ``keys`` (of the update of ``step``) since its last optimizer step.
    Use it only under the run's ``client_lock``."""

    client: Any
    state_path: str
    step: int
    keys: set[str] = field(default_factory=set)


# One live training client per train run in this process: the next group's or step's work
# reuses it instead of reloading, if nothing else trained the run meanwhile.
_clients: dict[str, LiveClient] = {}
_clients_lock = threading.Lock()
_run_locks: dict[str, threading.RLock] = {}


def client_lock(run_id: str) -> threading.RLock:
    """Held while a thread of this process uses (or replaces) the run's live client."""
    with _clients_lock:
        return _run_locks.setdefault(run_id, threading.RLock())


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


def live_client(*, trainer: Trainer, plan: dict[str, Any]) -> LiveClient:
    """The run's live client holding the trainer's saved weights (``trainer.state_path``,
    ``trainer.sampler_step`` updates in), made from that state if this process has none."""
    with _clients_lock:
        cached = _clients.get(trainer.run_id)
    if cached is not None and cached.state_path == trainer.state_path and cached.step == trainer.sampler_step:
        return cached
    client_forget(trainer.run_id)
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
    live = LiveClient(client=client, state_path=trainer.state_path, step=trainer.sampler_step)
    with _clients_lock:
        _clients[trainer.run_id] = live
    return live


def client_warm(*, run_id: str) -> bool:
    """Make the run's live client in this process while its first batch samples, so the
    first settled group's forward/backward does not wait for it (a Tinker client is a remote
    allocation; a local one builds a model). Best effort: the first group or the update makes
    it otherwise, and reports what fails. True if one was made here."""
    trainer = Trainer.objects.select_related("run__spec").filter(run_id=run_id).first()
    if trainer is None or trainer.status != TrainerStatus.SAMPLING or trainer.run.is_terminal:
        return False
    with client_lock(run_id):
        with _clients_lock:
            if run_id in _clients:
                return False
        try:
            live_client(trainer=trainer, plan=trainer.run.spec.plan)
        except Exception:  # noqa: BLE001 - made (and its error reported) again where it is needed
            logger.warning("warming the training client of %s failed", run_id, exc_info=True)
            return False
    return True


def training_client(*, trainer: Trainer, plan: dict[str, Any]) -> Any:
    return live_client(trainer=trainer, plan=plan).client


def client_state_note(*, run_id: str, state_path: str, step: int | None = None) -> None:
    """The run's live client now holds this saved state (after ``step`` updates): the next
    step may reuse it. Its accumulated gradients were spent by the optimizer step."""
    with _clients_lock:
        live = _clients.get(run_id)
    if live is not None:
        live.state_path = state_path
        if step is not None:
            live.step = step
            live.keys.clear()


def client_skip(*, run_id: str, step: int) -> None:
    """The update before ``step`` was skipped: the live client's weights are those of ``step``."""
    with _clients_lock:
        live = _clients.get(run_id)
    if live is not None and not live.keys:
        live.step = step


def client_forget(run_id: str) -> None:
    with _clients_lock:
        cached = _clients.pop(run_id, None)
    close = getattr(cached.client, "close", None) if cached else None
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
