"""The deployment files agree with the code: every queue has a consumer, the training
queue exactly one, each variable a process is given is one the code reads, the trials pod
shares the proxy's socket with its worker, and the image copies what exists."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from synth_project.queues import Queue

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
# Read by libraries or by our own deploy files rather than by settings.py.
EXTERNAL_ENV = {"WEB_CONCURRENCY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "TINKER_API_KEY"}


def _documents() -> list[dict]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    docs = []
    for name in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all((K8S / name).read_text()) if d)
    return docs


def _containers(docs: list[dict]) -> dict[str, list[dict]]:
    out = {}
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            out[doc["metadata"]["name"]] = doc["spec"]["template"]["spec"]["containers"]
    return out


def _code_env_names() -> set[str]:
    text = "\n".join(
        p.read_text() for p in [ROOT / "synth_project" / "settings.py", ROOT / "deploy" / "gunicorn.conf.py"]
    )
    text += "\n".join(p.read_text() for p in (ROOT / "apps").rglob("*.py"))
    return set(re.findall(r"[\"']([A-Z][A-Z0-9_]+)[\"']", text))


def test_every_queue_has_workers_and_training_has_one_consumer():
    consumers: dict[str, list[tuple[str, list[str]]]] = {}
    for name, containers in _containers(_documents()).items():
        for container in containers:
            command = container["command"]
            if command[:4] == ["celery", "-A", "synth_project", "worker"]:
                for queue in command[command.index("-Q") + 1].split(","):
                    consumers.setdefault(queue, []).append((name, command))
    assert set(consumers) == {q.value for q in Queue}
    ((_, training),) = consumers["training"]
    assert training[training.index("-c") + 1] == "1"
    # A trials worker runs one process more than its slots: the next trial is made ready meanwhile.
    for _, command in consumers["trials"]:
        container = next(c for cs in _containers(_documents()).values() for c in cs if c["command"] == command)
        slots = next(int(e["value"]) for e in container["env"] if e["name"] == "SYNTH_WORKER_SLOTS")
        assert int(command[command.index("-c") + 1]) == slots + 1
    workers = {d["metadata"]["name"]: d for d in _documents() if d["kind"] == "Deployment"}
    assert workers["synth-worker-training"]["spec"]["replicas"] == 1
    assert workers["synth-scheduler"]["spec"]["replicas"] == 1  # one beat: one reaper schedule


def test_every_variable_given_is_one_the_code_reads():
    docs = _documents()
    given = set()
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            given |= set(doc["data"])
    for containers in _containers(docs).values():
        for container in containers:
            given |= {e["name"] for e in container.get("env", [])}
    unknown = given - _code_env_names() - EXTERNAL_ENV
    assert not unknown, f"variables nothing reads: {sorted(unknown)}"


def test_the_trials_pod_shares_the_proxy_socket_and_commands_name_real_files():
    pods = _containers(_documents())
    worker, proxy = pods["synth-worker-trials"]
    socket = next(e["value"] for e in worker["env"] if e["name"] == "SYNTH_PROXY_SOCKET")
    assert proxy["command"][proxy["command"].index("--uds") + 1] == socket
    mounts = [{m["mountPath"] for m in c["volumeMounts"]} for c in (worker, proxy)]
    assert str(Path(socket).parent) in mounts[0] & mounts[1]
    assert worker["securityContext"]["privileged"] is True  # bubblewrap namespaces and cgroups
    for containers in pods.values():
        for container in containers:
            for part in container["command"]:
                if part.startswith("deploy/") or part == "manage.py":
                    assert (ROOT / part).is_file(), part
                if ":application" in part or part.endswith(".wsgi"):
                    module = part.split(":")[0].replace(".", "/")
                    assert (ROOT / f"{module}.py").is_file(), part


def test_every_proxy_runs_one_process_per_core_it_requests():
    """A Python process uses one core at most: a proxy container given more runs as many
    uvicorn workers (one when it names none)."""
    pods = _containers(_documents())
    proxies = [c for containers in pods.values() for c in containers if c["command"][:2] == ["uvicorn", PROXY_APP]]
    assert len(proxies) == 2
    for proxy in proxies:
        command = proxy["command"]
        workers = int(command[command.index("--workers") + 1]) if "--workers" in command else 1
        assert workers == int(proxy["resources"]["requests"]["cpu"]), command


def test_every_proxy_runs_its_startup_before_it_serves():
    """Each proxy process loads its routes' tokenizers at ASGI lifespan startup
    (apps.proxy.warmup), which uvicorn runs only with the lifespan on: deployed and
    embedded, every proxy command asks for it."""
    pods = _containers(_documents())
    commands = [
        c["command"] for containers in pods.values() for c in containers if c["command"][:2] == ["uvicorn", PROXY_APP]
    ]
    assert commands and all(command[command.index("--lifespan") + 1] == "on" for command in commands), commands
    embedded = (ROOT / "deploy" / "embedded.sh").read_text()
    starts = re.findall(r"bin/uvicorn\" synth_project\.proxy_asgi:application[^\n]*\n[^\n]*", embedded)
    assert len(starts) == 2 and all("--lifespan on" in start for start in starts), starts


def test_the_image_copies_what_exists_and_runs_the_gateway_config():
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    for line in dockerfile.splitlines():
        if line.startswith("COPY ") and not line.startswith("COPY . "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    assert '"-c", "deploy/gunicorn.conf.py"' in dockerfile
    namespace: dict = {}
    exec(compile((ROOT / "deploy" / "gunicorn.conf.py").read_text(), "gunicorn.conf.py", "exec"), namespace)
    assert namespace["worker_class"] == "gthread" and namespace["timeout"] == 0


PROXY_APP = "synth_project.proxy_asgi:application"


def test_every_proxy_serves_the_model_only_application():
    """Wherever the proxy's socket or port is served (Kubernetes, the embedded job, the README,
    the operator's hint, the harness tests' proxy), it is the model-only application, and its
    probes ask a path that application answers."""
    from synth_project.proxy_asgi import path_is_model_api

    served = 0
    for name, containers in _containers(_documents()).items():
        for container in containers:
            if "uvicorn" in container["command"]:
                assert container["command"][1] == PROXY_APP, (name, container["command"])
                served += 1
                probe = (container.get("readinessProbe") or {}).get("httpGet")
                assert probe is None or path_is_model_api(path=probe["path"]), probe
    assert served == 2  # the trials pod's proxy (socket) and the interactive one (port)
    embedded = [line for line in (ROOT / "deploy" / "embedded.sh").read_text().splitlines() if "bin/uvicorn" in line]
    assert embedded and all(PROXY_APP in line for line in embedded), embedded
    assert "http://proxy/healthz" in (ROOT / "deploy" / "embedded.sh").read_text() and path_is_model_api(
        path="/healthz"
    )
    (row,) = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| model proxy")]
    assert f"`uvicorn {PROXY_APP} --uds $SYNTH_PROXY_SOCKET`" in row
    assert f"`uvicorn {PROXY_APP} --uds" in (ROOT / "apps" / "trials" / "model_access.py").read_text()
    assert "from synth_project.proxy_asgi import application" in (ROOT / "tests/harness/proxy_server.py").read_text()
