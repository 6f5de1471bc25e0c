"""Smoke test of the proxy benches: each runs with tiny parameters and prints its figure
lines. No timing is asserted (figures depend on the machine); only that the benches still
run end to end against the current proxy code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = "/tmp/synth-test-tokenizers"  # shared with tests/proxy (built once per machine)

pytestmark = pytest.mark.slow


def run_bench(name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    full_env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "synth_project.settings",
        "SYNTH_TOKENIZER_DIR": TOKENIZER_DIR,
        **(env or {}),
    }
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / name), *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_claude_code_request_shape() -> None:
    sys.path.insert(0, str(ROOT))
    from bench.claude_code_request import Conversation, body_bytes

    conv = Conversation(seed=0)
    first = conv.request()
    assert len(first["system"]) == 3 and len(first["tools"]) == 24
    conv.advance()
    conv.advance()
    body = conv.request()
    assert body_bytes(body) > body_bytes(first)
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    calls = [b["id"] for b in body["messages"][1]["content"] if b["type"] == "tool_use"]
    results = [b["tool_use_id"] for b in body["messages"][2]["content"]]
    assert calls and calls == results
    assert Conversation(seed=0).request() == first  # deterministic per seed


def test_proxy_overhead_prints_figures() -> None:
    out = run_bench("proxy_overhead.py", "--conversations", "1", "--repeat", "1", "--max-tokens", "21000")
    assert "prepare: hit" in out and "cold/hit" in out
    assert "prompt tokens: first call" in out
    assert "per call, prepare + parse, all sizes: with prefix cache p50" in out
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["tools"] == 24 and figures["tools_json_ms"] > 0 and figures["tools_memo_ms"] > 0


@pytest.mark.parametrize("client", ["httpx", "aiohttp"])
def test_proxy_load_prints_figures(client: str) -> None:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.skip("proxy_load needs PostgreSQL (DATABASE_URL)")
    database = url.rsplit("/", 1)[0] + "/synth_bench_proxy"
    out = run_bench(
        "proxy_load.py",
        *("--sessions", "4", "--turns", "2", "--max-seconds", "60", "--long-tokens", "24000"),
        *("--database-url", database, "--workers", "2", "--client", client),
    )
    for line in ("completed calls:", "TTFB (first SSE byte", "done (message_stop):", "proxy event-loop lag"):
        assert line in out, out
    figures = json.loads(out.strip().splitlines()[-1])
    # Two proxy processes, each serving the floor's recorded answer whole, to the client asked for.
    assert figures["proxy_processes"] == 2 and figures["errors"] == 0, out
    assert figures["client"] == client and figures["client_cpu_ms_per_call"] > 0, out
    # TTFB split between the sessions' opening calls and the later ones (2 turns: both kinds).
    assert "of the sessions' opening calls" in out, out
    assert all(figures[k] > 0 for k in ("ttfb_opening_p99_ms", "ttfb_later_p99_ms", "floor_ttfb_later_p99_ms")), out
    assert "2 uvicorn processes" in out and "errors: none; proxy/floor" in out, out
    # The proxy's processes were measured working (their CPU summed over both).
    assert figures["proxy_cpu_ms_per_call"] > 0, out
    # The long conversation grew past its target, and its warm calls were timed on both sides.
    assert figures["warm_long_tokens"] >= 24000, out
    assert isinstance(figures["warm_long_added_ms"], float), out


@pytest.mark.parametrize("client", ["httpx", "aiohttp"])
def test_control_plane_prints_figures(client: str) -> None:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.skip("control_plane needs PostgreSQL (DATABASE_URL)")
    import redis

    # A Redis database of its own: the gateway's schedule messages wait there unconsumed.
    broker = "redis://127.0.0.1:6379/10"
    try:
        out = run_bench(
            "control_plane.py",
            *("--submissions", "40", "--events", "40", "--writers", "2", "--client", client),
            *("--push-tasks", "0", "--cancel-trials", "0"),
            env={"DATABASE_URL": url.rsplit("/", 1)[0] + "/synth_bench_control", "CELERY_BROKER_URL": broker},
        )
    finally:
        redis.Redis.from_url(broker).flushdb()
    assert f"8 {client} clients, gunicorn 2x8" in out and "the floor, GET /healthz" in out, out
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["client"] == client, out
    # Both phases were measured, the gateway's CPU and the clients' alike.
    for key in ("submissions_per_s", "submission_floor_per_s", "event_appends_per_s", "event_appends_batched_per_s"):
        assert figures[key] > 0, (key, out)
    for key in ("gateway_cpu_ms_per_submission", "client_cpu_ms_per_submission", "floor_client_cpu_ms_per_request"):
        assert figures[key] > 0, (key, out)
    assert figures["push_10k_s"] is None and figures["cancel_10k_s"] is None, out


def test_training_bench_prints_figures() -> None:
    out = run_bench(
        "training.py",
        *("--attempts", "2", "--turns", "3", "--start-tokens", "300", "--repeat", "1"),
        *("--train-attempts", "2", "--train-turns", "2", "--train-start-tokens", "100", "--learn-steps", "2"),
    )
    assert "packing: 6 calls -> 2 datums" in out, out
    assert "losses agree: True" in out, out
    for line in ("update  chunked:", "update ratio full/chunked", "save r=32: sampler weights", "reward by step"):
        assert line in out, out


def test_cancel_bench_prints_figures() -> None:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.skip("the cancel bench needs PostgreSQL (DATABASE_URL)")
    database = url.rsplit("/", 1)[0] + "/synth_bench_cancel"
    out = run_bench(
        "cancel.py",
        *("--tasks", "40", "--attempts", "5", "--running", "3", "--stop", "0.5"),
        env={"DATABASE_URL": database},
    )
    for line in ("time to cancelled:", "longest run-row lock hold:", "heartbeats:"):
        assert line in out, out
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["trials"] == 200 and figures["status"] == "cancelled"
    assert figures["heartbeat_failures"] == 0 and figures["leases_lost"] == 0


def test_training_pipeline_bench_prints_figures() -> None:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.skip("the training pipeline bench needs PostgreSQL (DATABASE_URL)")
    database = url.rsplit("/", 1)[0] + "/synth_bench_pipeline"
    out = run_bench(
        "training_pipeline.py",
        *("--groups", "2", "--group-size", "2", "--prompt-tokens", "40", "--max-tokens", "4", "--slow-seconds", "1"),
        *("--pairs", "2", "--database-url", database),
        timeout=600,
    )
    for line in ("warm-up: lockstep batch", "sequential:", "pipelined:", "pipelined / sequential:"):
        assert line in out, out
    figures = json.loads(out.strip().splitlines()[-1])
    assert {"sequential_s", "pipelined_s", "max_abs_kl", "staleness_steps"} <= set(figures)
    assert figures["sequential_s"] > 0 and figures["pipelined_s"] > 0
    assert figures["prepare"] is True  # groups prepared where they settled, as the evidence worker does
    # Two pairs measured, the figures of one of them (the median's).
    assert len(figures["ratios"]) == 2 and figures["ratio"] in figures["ratios"]
    # Staleness 0: the sampler served exactly the trainer's weights, and the pipelined update
    # equals the lockstep one.
    assert figures["staleness_steps"] == 0 and figures["max_abs_kl"] <= 1e-3
    assert figures["weights_max_abs_diff"] < 1e-6
    # The training worker ran on a CPU of its own (the last this process may use).
    cpus = sorted(os.sched_getaffinity(0))
    assert figures["trainer_cpu"] == (cpus[-1] if len(cpus) > 1 else None)
