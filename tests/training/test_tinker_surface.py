"""The learner calls the Tinker SDK's own surface: every call our training code makes on a
backend's clients binds to the real ``tinker`` signatures, and the local backend mirrors them.
(The service itself is not reachable here; without an API key the SDK refuses, and the run
says so.)

The calls are not listed by hand: they are read from the training modules' source (AST), by
following the values. A name bound to ``backend_service(...)`` is a service client; a name bound
to ``<service>.<method>(...).result()``, or to a call of a function that returns such a name, is
a training client. A name bound to ``LiveClient(...)`` (or to a call of a function that returns
one, or a parameter annotated ``LiveClient``) holds a training client as ``.client``. Every method called on either, with its number of positional arguments and
its keyword names, must bind to the SDK's signature and to the local backend's.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from pathlib import Path

import pytest
import tinker

from apps.training.backends.local import LocalServiceClient, LocalTrainingClient

ROOT = Path(__file__).resolve().parents[2]
# The modules that drive the backends (the backends themselves implement the surface).
TRAINING_MODULES = sorted((ROOT / "apps" / "training").glob("*.py"))
SURFACES = {
    "service": (tinker.ServiceClient, LocalServiceClient),
    "trainer": (tinker.TrainingClient, LocalTrainingClient),
}


@dataclass(frozen=True)
class ClientCall:
    kind: str  # "service" | "trainer"
    method: str
    positional: int
    keywords: tuple[str, ...]
    where: str
    checkable: bool  # False with *args or **kwargs: the arguments cannot be counted


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _kind(value: ast.expr, names: dict[str, str], factories: dict[str, str]) -> str | None:
    """What kind of client an expression evaluates to, if any ("holder": a LiveClient)."""
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    if isinstance(func, ast.Name):
        if func.id == "backend_service":
            return "service"
        if func.id == "LiveClient":
            return "holder"
        if func.id in factories:
            return factories[func.id]
    if (
        isinstance(func, ast.Attribute)
        and func.attr == "result"
        and isinstance(func.value, ast.Call)
        and isinstance(func.value.func, ast.Attribute)
        and isinstance(func.value.func.value, ast.Name)
        and names.get(func.value.func.value.id) == "service"
    ):
        return "trainer"  # service.create_...(...).result()
    return None


def _bound_names(fn: ast.AST, factories: dict[str, str]) -> dict[str, str]:
    """Names bound to clients in one function (in any branch), to a fixed point; a parameter
    annotated ``LiveClient`` is a holder."""
    names: dict[str, str] = {}
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for arg in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
            if isinstance(arg.annotation, ast.Name) and arg.annotation.id == "LiveClient":
                names[arg.arg] = "holder"
    while True:
        before = dict(names)
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                kind = _kind(node.value, names, factories)
                for target in node.targets:
                    if kind and isinstance(target, ast.Name):
                        names[target.id] = kind
        if names == before:
            return names


def client_calls() -> list[ClientCall]:
    trees = {path: ast.parse(path.read_text(), filename=str(path)) for path in TRAINING_MODULES}
    # Functions that return a training client (training_client) or its holder (live_client),
    # across modules, to a fixed point.
    factories: dict[str, str] = {}
    while True:
        before = dict(factories)
        for tree in trees.values():
            for fn in _functions(tree):
                names = _bound_names(fn, factories)
                for node in ast.walk(fn):
                    if isinstance(node, ast.Return) and isinstance(node.value, ast.Name):
                        if names.get(node.value.id) in ("trainer", "holder"):
                            factories[fn.name] = names[node.value.id]
        if factories == before:
            break
    calls: list[ClientCall] = []
    for path, tree in trees.items():
        for fn in _functions(tree):
            names = _bound_names(fn, factories)
            for node in ast.walk(fn):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                target = node.func.value
                if isinstance(target, ast.Name) and names.get(target.id) in ("service", "trainer"):
                    kind = names[target.id]
                elif (
                    isinstance(target, ast.Attribute)
                    and target.attr == "client"
                    and isinstance(target.value, ast.Name)
                    and names.get(target.value.id) == "holder"
                ):
                    kind = "trainer"  # live.client.<method>(...)
                else:
                    continue
                calls.append(
                    ClientCall(
                        kind=kind,
                        method=node.func.attr,
                        positional=len(node.args),
                        keywords=tuple(k.arg for k in node.keywords if k.arg is not None),
                        where=f"{path.relative_to(ROOT)}:{node.lineno}",
                        checkable=not any(isinstance(a, ast.Starred) for a in node.args)
                        and all(k.arg is not None for k in node.keywords),
                    )
                )
    return sorted(set(calls), key=lambda c: c.where)


CALLS = client_calls()


def test_the_calls_are_found():
    """The derivation sees the learner's use of both clients (not an empty, vacuous list)."""
    assert {c.kind for c in CALLS} == {"service", "trainer"}, CALLS


@pytest.mark.parametrize("call", CALLS, ids=lambda c: f"{c.where}:{c.method}")
def test_each_call_binds_to_the_sdk_and_the_local_backend(call: ClientCall):
    assert call.checkable, f"{call.where}: {call.method}(*args/**kwargs) cannot be checked against the SDK"
    args = [object()] * call.positional
    kwargs = {name: object() for name in call.keywords}
    for surface in SURFACES[call.kind]:
        method = getattr(surface, call.method, None)
        assert method is not None, f"{call.where}: {surface.__qualname__} has no {call.method}"
        try:
            inspect.signature(method).bind(None, *args, **kwargs)
        except TypeError as exc:
            raise AssertionError(
                f"{call.where}: {call.method}({call.positional} positional, keywords {call.keywords}) "
                f"does not bind to {surface.__module__}.{surface.__qualname__}: {exc}"
            ) from None


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
