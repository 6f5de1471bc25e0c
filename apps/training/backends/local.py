"""The local training backend: PyTorch + PEFT LoRA in this process (CPU, or a GPU if present).

It has the call shapes of ``tinker.ServiceClient`` / ``TrainingClient`` for the calls the
training service makes, returns ``tinker.types`` objects wrapped in tinker's own
``AwaitableConcurrentFuture``, and keeps Tinker's semantics where they matter:

* a training client runs its operations on ONE thread, in submission order;
* gradients accumulate across ``forward_backward`` calls until ``optim_step``;
* losses are sums over tokens, not means; ``metrics["loss:sum"]`` carries the total;
* AdamW with Tinker's defaults (beta2 0.95, no weight decay);
* ``importance_sampling``: ratio = exp(trainer logprob - sampler logprob), loss = -sum(ratio *
  advantage); ``ppo`` clips the ratio; ``cross_entropy`` uses ``weights``.

The base model is built exactly as the proxy's local sampler builds it for the same route
(the tiny real-vocabulary model, or a checkpoint directory), so a LoRA adapter saved here
loads there unchanged and the sampler's logprobs are the trainer's.

Paths are ``local://<absolute directory>``; the training service packs a saved directory
into the object store and unpacks it again to resume.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import inspect
import json
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from django.conf import settings
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

LOCAL_SCHEME = "local://"
META_FILE = "synth-trainer.json"
OPTIMIZER_FILE = "optimizer.pt"
ADAPTER_FILE = "adapter_model.safetensors"
# Adapted projection names of the decoder architectures the local backend trains (Qwen3,
# Llama-like). The unembedding is tied to the embedding in the tiny model; leave it frozen.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def path_dir(path: str) -> Path:
    if not path.startswith(LOCAL_SCHEME):
        raise ValueError(f"not a local trainer path: {path!r}")
    return Path(path[len(LOCAL_SCHEME) :])


# The tiny models' pristine weights, built once per process: each training client gets a
# copy (LoRA wraps its modules in place). Initialising one draws ~10M random numbers, which
# costs a new client (the first group of every batch) several times what the copy does.
_tiny_templates: dict[tuple[str, int], Any] = {}
_tiny_lock = threading.Lock()


def base_model_build(*, spec: dict[str, Any]) -> Any:
    """The frozen base model for a local route's sampler config (``tiny`` or ``model_dir``)."""
    from apps.proxy.samplers.local import tiny_model_build

    if spec.get("tiny"):
        key = (str(spec.get("family", "qwen3")), int(spec.get("seed", 0)))
        with _tiny_lock:
            if key not in _tiny_templates:
                _tiny_templates[key] = tiny_model_build(family=key[0], seed=key[1])
            return copy.deepcopy(_tiny_templates[key])  # tied weights stay tied in the copy
    if spec.get("model_dir"):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32, local_files_only=True)
    raise ValueError('a local base model needs {"tiny": true, ...} or {"model_dir": ...}')


def _future(fn: Any, executor: cf.Executor, *args: Any) -> AwaitableConcurrentFuture:
    return AwaitableConcurrentFuture(executor.submit(fn, *args))


def _done(value: Any) -> AwaitableConcurrentFuture:
    future: cf.Future = cf.Future()
    future.set_result(value)
    return AwaitableConcurrentFuture(future)


def adapter_write(*, model: Any, directory: Path) -> None:
    """Write the model's LoRA adapter as PEFT's ``save_pretrained`` does (adapter_model.safetensors
    and adapter_config.json, loadable by PEFT and vLLM) without its README model card: the card
    is a hub artefact no checkpoint uses, and rendering it compiled a Jinja template on every
    save, 25 of a save's 33 ms on the tiny model.

    The unembedding is adapted by LoRA only; its (tied) base weights are the base model's, so
    the adapter needs no copy of the embedding matrix."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    state = get_peft_model_state_dict(model, adapter_name="default", save_embedding_layers=False)
    # safetensors takes neither aliased nor non-contiguous tensors; LoRA matrices are small.
    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().clone().contiguous() for k, v in state.items()}, str(directory / ADAPTER_FILE), {"format": "pt"}
    )
    base = model.get_base_model()
    config = copy.copy(model.peft_config["default"])
    config.inference_mode = True
    if config.base_model_name_or_path is None:
        config.base_model_name_or_path = getattr(base, "name_or_path", None) or None
    # What PEFT records for a config without a task type (AutoPeftModel reads it).
    mapping = None
    if config.task_type is None:
        mapping = {"base_model_class": type(base).__name__, "parent_library": type(base).__module__}
    config.save_pretrained(str(directory), auto_mapping_dict=mapping)


@dataclass
class _Scored:
    """What one datum's loss needs besides its hidden states."""

    input_ids: list[int]
    targets: torch.Tensor
    keep: torch.Tensor
    token_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _chunked_losses(
    *, base: Any, scored: list[tuple[_Scored, torch.Tensor]], backward: bool
) -> list[tuple[float, torch.Tensor]]:
    """(summed loss, logprobs of the kept targets) of each (datum, the final hidden states of
    its kept positions, in order); with ``backward`` the gradients are accumulated into the
    LoRA parameters.

    Only kept positions (non-zero advantage or weight) go through the unembedding, in chunks:
    full logits of a long prompt over a 150K-token vocabulary would cost gigabytes, and
    observation positions carry no gradient. The kept positions of all the datums given go
    through together: with few of them per datum (a short answer) the unembedding's time is
    that of reading its matrix, once per chunk rather than once per datum. Each chunk's loss
    is back-propagated to the (detached) hidden states only, and their summed gradient goes
    back through the decoder once at the end (the chunked cross-entropy technique). A datum's
    ``token_loss(logprobs, index)`` gives the summed loss of its kept positions ``index``.
    """
    if not scored:
        return []
    detached = [rows.detach().requires_grad_(backward) for _, rows in scored]
    hidden = torch.cat(detached)
    device = hidden.device
    chosen = torch.cat([item.targets[item.keep] for item, _ in scored]).to(device)
    # Each kept position's datum and its index among that datum's kept positions.
    owner = torch.cat([torch.full((len(rows),), j, dtype=torch.long) for j, (_, rows) in enumerate(scored)])
    local = torch.cat([torch.arange(len(rows)) for _, rows in scored])
    totals = [0.0] * len(scored)
    logprobs: list[list[torch.Tensor]] = [[] for _ in scored]
    # Positions unembedded at once (SYNTH_TRAIN_UNEMBED_CHUNK): bounds the logits' memory.
    for chunk in torch.arange(len(owner)).split(settings.SYNTH_TRAIN_UNEMBED_CHUNK):
        logits = base.lm_head(hidden[chunk.to(device)]).float()
        lp = torch.log_softmax(logits, dim=-1).gather(-1, chosen[chunk.to(device)][:, None])[:, 0]
        loss: torch.Tensor | None = None
        for j in owner[chunk].unique().tolist():  # a datum's positions are consecutive
            mine = owner[chunk] == j
            part = scored[j][0].token_loss(lp[mine.to(device)], local[chunk][mine].to(device))
            totals[j] += float(part.detach())
            logprobs[j].append(lp[mine.to(device)].detach())
            loss = part if loss is None else loss + part
        if backward and loss is not None:
            loss.backward()  # into the detached hidden states' grad only
    if backward:
        pairs = [(rows, d.grad) for (_, rows), d in zip(scored, detached, strict=True) if d.grad is not None]
        if pairs:  # accumulates until optim_step, as Tinker does
            torch.autograd.backward([rows for rows, _ in pairs], [grad for _, grad in pairs])
    return [(totals[j], torch.cat(logprobs[j]) if logprobs[j] else torch.zeros(0)) for j in range(len(scored))]


def _prefix_shared(sequences: list[list[int]]) -> int:
    """Tokens every sequence starts with, short of the shortest one (each keeps a tail)."""
    first, shared = sequences[0], min(len(s) for s in sequences) - 1
    for other in sequences[1:]:
        n = 0
        while n < shared and other[n] == first[n]:
            n += 1
        shared = n
    return max(0, shared)


def _prefix_groups(items: list[_Scored], *, minimum: int) -> list[tuple[list[_Scored], int]]:
    """Consecutive datums that share at least ``minimum`` leading tokens, with the tokens
    they share (0 for a datum alone): a group's attempts all begin with its task's prompt."""
    groups: list[tuple[list[_Scored], int]] = []
    for item in items:
        if minimum and groups:
            members, _ = groups[-1]
            shared = _prefix_shared([m.input_ids for m in members] + [item.input_ids])
            if shared >= minimum:
                groups[-1] = (members + [item], shared)
                continue
        groups.append(([item], 0))
    return groups


def _scored_losses(*, base: Any, items: list[_Scored], shared: int, backward: bool) -> list[tuple[float, torch.Tensor]]:
    """(summed loss, kept logprobs) of each datum. Datums that share their first ``shared``
    tokens run the decoder over them once: their tails attend to its key/value cache, and the
    gradients the tails send back into that cache and into the shared positions' hidden states
    are summed and sent through the shared forward once, at the end. Exact, less float
    summation order; a group of n attempts of one prompt costs about one prompt, not n."""
    from transformers.cache_utils import DynamicLayer

    device = base.device
    if shared:
        ids = torch.tensor([items[0].input_ids[:shared]], dtype=torch.long, device=device)
        out = base.model(input_ids=ids, use_cache=True)  # LoRA layers are active inside
        cache = getattr(out, "cache", None)
        if cache is None:  # the name before transformers 5.x's deprecation
            cache = out.past_key_values
        layers = getattr(cache, "layers", None) or []
        if not layers or any(type(layer) is not DynamicLayer for layer in layers):
            shared = 0  # a cache this cannot rewind (sliding windows, states): one at a time
    results: list[tuple[float, torch.Tensor]] = []
    if not shared:
        for item in items:
            ids = torch.tensor([item.input_ids], dtype=torch.long, device=device)
            hidden = base.model(input_ids=ids).last_hidden_state[0]
            kept = hidden.index_select(0, item.keep.nonzero(as_tuple=True)[0].to(device))
            results += _chunked_losses(base=base, scored=[(item, kept)], backward=backward)
        return results
    head = out.last_hidden_state[0]
    roots = [(layer.keys, layer.values) for layer in layers]
    # Leaves standing in for the shared forward's outputs: each tail's backward stops at them
    # (its graph freed at once), their gradients add up across the tails.
    leaves = [(k.detach().requires_grad_(backward), v.detach().requires_grad_(backward)) for k, v in roots]
    head_leaf = head.detach().requires_grad_(backward)
    keyword = "cache" if "cache" in inspect.signature(base.model.forward).parameters else "past_key_values"
    held: list[tuple[_Scored, torch.Tensor]] = []
    for number, item in enumerate(items):
        for layer, (keys, values) in zip(layers, leaves, strict=True):
            layer.keys, layer.values = keys, values  # rewound to the shared tokens
        ids = torch.tensor([item.input_ids[shared:]], dtype=torch.long, device=device)
        tail = base.model(input_ids=ids, use_cache=True, **{keyword: cache}).last_hidden_state[0]
        # The kept positions' hidden states: of the shared part's (the last of them predicts
        # the tail's first token) and of the tail's.
        positions = item.keep.nonzero(as_tuple=True)[0].to(device)
        in_head = positions < shared
        kept = torch.cat(
            [head_leaf.index_select(0, positions[in_head]), tail.index_select(0, positions[~in_head] - shared)]
        )
        held.append((item, kept))
        # The tails' graphs are held until their unembedding: no longer, together, than the
        # shared part (a datum alone held its whole sequence's).
        if number == len(items) - 1 or sum(len(i.input_ids) - shared for i, _ in held) >= shared:
            results += _chunked_losses(base=base, scored=held, backward=backward)
            held = []
    if backward:
        pairs = [(head, head_leaf.grad)] + [
            (root, leaf.grad)
            for root_pair, leaf_pair in zip(roots, leaves, strict=True)
            for root, leaf in zip(root_pair, leaf_pair, strict=True)
        ]
        pairs = [(t, g) for t, g in pairs if g is not None]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
    return results


class LocalTrainingClient:
    """Duck-types ``tinker.TrainingClient`` for forward_backward / optim_step / saves."""

    def __init__(self, *, model: Any, spec: dict[str, Any], rank: int, root: Path, optimizer_state: Any = None):
        self.model_id = f"local-{uuid.uuid4().hex[:12]}"
        self._model = model
        self._spec = dict(spec)
        self._rank = rank
        self._root = root
        self._executor = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"trainer-{self.model_id}")
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._optimizer = torch.optim.AdamW(self._params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        if optimizer_state is not None:
            self._optimizer.load_state_dict(optimizer_state)
        self._lock = threading.Lock()

    def get_info(self) -> types.GetInfoResponse:
        return types.GetInfoResponse(
            model_id=self.model_id,
            is_lora=True,
            lora_rank=self._rank,
            model_data=types.ModelData(arch="local", model_name=json.dumps(self._spec, sort_keys=True)),
        )

    # -- training -------------------------------------------------------------------------

    def forward_backward(
        self, data: list[types.Datum], loss_fn: str, loss_fn_config: Mapping[str, float | str] | None = None
    ) -> AwaitableConcurrentFuture:
        return _future(self._run, self._executor, data, loss_fn, dict(loss_fn_config or {}), True)

    def forward(
        self, data: list[types.Datum], loss_fn: str, loss_fn_config: Mapping[str, float | str] | None = None
    ) -> AwaitableConcurrentFuture:
        """The loss and logprobs without gradients (nothing accumulates)."""
        return _future(self._run, self._executor, data, loss_fn, dict(loss_fn_config or {}), False)

    def _run(self, data: list[types.Datum], loss_fn: str, config: dict[str, Any], backward: bool):
        self._model.train(backward)
        items: list[_Scored] = []
        for datum in data:
            inputs = datum.loss_fn_inputs
            targets = inputs["target_tokens"].to_torch().long()
            if loss_fn == "cross_entropy":
                weights = inputs["weights"].to_torch().float()
                keep = weights != 0
                kept_weights = weights[keep]

                def token_loss(lp: torch.Tensor, index: torch.Tensor, w: torch.Tensor = kept_weights):
                    return -(lp * w[index]).sum()

            elif loss_fn in ("importance_sampling", "ppo"):
                advantages = inputs["advantages"].to_torch().float()
                keep = advantages != 0
                kept_adv = advantages[keep]
                kept_sampler = inputs["logprobs"].to_torch().float()[keep]
                low = float(config.get("clip_low_threshold", 0.8))
                high = float(config.get("clip_high_threshold", 1.2))

                def token_loss(
                    lp: torch.Tensor,
                    index: torch.Tensor,
                    adv: torch.Tensor = kept_adv,
                    sampler: torch.Tensor = kept_sampler,
                    low: float = low,
                    high: float = high,
                ):
                    ratio = torch.exp(lp - sampler[index])
                    objective = ratio * adv[index]
                    if loss_fn == "ppo":
                        objective = torch.minimum(objective, torch.clamp(ratio, low, high) * adv[index])
                    return -objective.sum()

            else:
                raise ValueError(f"loss_fn {loss_fn!r} is not available in the local backend")
            items.append(
                _Scored(input_ids=datum.model_input.to_ints(), targets=targets, keep=keep, token_loss=token_loss)
            )
        # Datums with nothing to score (no kept position) need no forward at all.
        scored: dict[int, tuple[float, torch.Tensor]] = {}
        live = [item for item in items if bool(item.keep.any())]
        base = self._model.get_base_model() if hasattr(self._model, "get_base_model") else self._model
        with self._lock, torch.set_grad_enabled(backward):
            for members, shared in _prefix_groups(live, minimum=settings.SYNTH_TRAIN_SHARED_PREFIX_MIN):
                for item, result in zip(
                    members, _scored_losses(base=base, items=members, shared=shared, backward=backward), strict=True
                ):
                    scored[id(item)] = result
        outputs: list[dict[str, types.TensorData]] = []
        total = 0.0
        for item in items:
            full = torch.zeros(len(item.targets))
            if id(item) in scored:
                loss, lp = scored[id(item)]
                total += loss
                full[item.keep] = lp.float().cpu()
            outputs.append({"logprobs": types.TensorData.from_torch(full)})
        return types.ForwardBackwardOutput(
            loss_fn_output_type="TorchLossReturn", loss_fn_outputs=outputs, metrics={"loss:sum": total}
        )

    def optim_step(self, optim_params: types.AdamParams) -> AwaitableConcurrentFuture:
        return _future(self._optim_step, self._executor, optim_params)

    def _optim_step(self, params: types.AdamParams) -> types.OptimStepResponse:
        with self._lock:
            for group in self._optimizer.param_groups:
                group.update(
                    lr=params.learning_rate,
                    betas=(params.beta1, params.beta2),
                    eps=params.eps,
                    weight_decay=params.weight_decay,
                )
            limit = params.grad_clip_norm if params.grad_clip_norm > 0 else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(self._params, limit)
            self._optimizer.step()
            self._optimizer.zero_grad(set_to_none=True)
        return types.OptimStepResponse(metrics={"optim/grad_norm": float(norm)})

    # -- saves (tinker://<run>/weights|sampler_weights/<name> becomes local://<dir>) ----------

    def _save(self, kind: str, name: str, with_optimizer: bool) -> str:
        directory = self._root / self.model_id / kind / name
        with self._lock:
            adapter_write(model=self._model, directory=directory)
            if with_optimizer:
                torch.save(self._optimizer.state_dict(), directory / OPTIMIZER_FILE)
            (directory / META_FILE).write_text(json.dumps({"base": self._spec, "rank": self._rank}, sort_keys=True))
        return f"{LOCAL_SCHEME}{directory}"

    def save_state(self, name: str, ttl_seconds: int | None = None) -> AwaitableConcurrentFuture:
        return _future(lambda: types.SaveWeightsResponse(path=self._save("weights", name, True)), self._executor)

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None = None) -> AwaitableConcurrentFuture:
        return _future(
            lambda: types.SaveWeightsForSamplerResponse(path=self._save("sampler_weights", name, False)),
            self._executor,
        )

    def close(self) -> None:
        self._executor.shutdown(wait=True)


class LocalServiceClient:
    """Duck-types ``tinker.ServiceClient`` for creating and resuming training clients."""

    def __init__(self, *, spec: dict[str, Any], root: Path, targets: tuple[str, ...] = DEFAULT_TARGETS) -> None:
        self._spec = dict(spec)
        self._root = Path(root)
        self._targets = targets

    def create_lora_training_client(
        self, base_model: str, rank: int = 32, seed: int | None = None, **_: Any
    ) -> AwaitableConcurrentFuture:
        from peft import LoraConfig, get_peft_model

        base = base_model_build(spec=self._spec)
        # LoRA's B matrices start at zero, so step 0 samples exactly the base model; the seed
        # fixes the A matrices (and thus the first update) for a reproducible run.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed if seed is not None else 0)
            model = get_peft_model(
                base, LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=list(self._targets))
            )
        return _done(LocalTrainingClient(model=model, spec=self._spec, rank=rank, root=self._root))

    def create_training_client_from_state_with_optimizer(self, path: str, **_: Any) -> AwaitableConcurrentFuture:
        return self._from_state(path, with_optimizer=True)

    def create_training_client_from_state(self, path: str, **_: Any) -> AwaitableConcurrentFuture:
        return self._from_state(path, with_optimizer=False)

    def _from_state(self, path: str, *, with_optimizer: bool) -> AwaitableConcurrentFuture:
        from peft import PeftModel

        directory = path_dir(path)
        meta = json.loads((directory / META_FILE).read_text())
        if meta["base"] != self._spec:
            raise ValueError(f"the state at {path} was trained on {meta['base']}, not on {self._spec}")
        model = PeftModel.from_pretrained(base_model_build(spec=self._spec), directory, is_trainable=True)
        state = None
        if with_optimizer:
            state = torch.load(directory / OPTIMIZER_FILE, weights_only=True)
        return _done(
            LocalTrainingClient(
                model=model, spec=self._spec, rank=int(meta["rank"]), root=self._root, optimizer_state=state
            )
        )
