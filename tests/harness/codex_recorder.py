"""Record what the real Codex CLI sends to a Responses provider, and answer it minimally.

    python -m tests.harness.codex_recorder --port 18301 --out tests/fixtures/codex/fallback
    python -m tests.harness.codex_recorder --port 18301 --out tests/fixtures/codex/catalog --catalog

starts a recording HTTP server on 127.0.0.1:PORT, runs ``codex exec`` (the pinned npm
package, node_modules/.bin/codex) against it through a temporary CODEX_HOME whose
config.toml names the server as a ``wire_api = "responses"`` provider, and writes every
request it received (method, path, headers with secrets replaced, the JSON body) to
``OUT/NN-<method>-<path>.json``, plus Codex's ``--json`` transcript and stderr.

What the server answers to ``POST .../responses`` (a minimal valid Responses SSE stream):

1. no tool output in the input yet: a shell-like function call (whichever of
   ``exec_command``, ``shell_command``, ``shell`` the request offers) that writes a file;
2. one tool output: a ``apply_patch`` custom (freeform) tool call adding a file, when the
   request offers it, else the final message;
3. otherwise: a final assistant message.

Anything else (``GET .../models`` and the like) is recorded and answered 404 in OpenAI's
error shape, so the README says what Codex does without it. Used to write
tests/fixtures/codex/README.md; run it again after changing the pinned version.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CODEX = ROOT / "node_modules/.bin/codex"
CREDENTIAL_ENV = "SYNTH_RECORDER_KEY"
CREDENTIAL = "recorder-secret-0000"
MODEL = "synth-recorded"
SHELL_COMMAND = "echo recorded > out.txt && cat out.txt"
PATCH = "*** Begin Patch\n*** Add File: patched.txt\n+patched by apply_patch\n*** End Patch"
FINAL_TEXT = "Done: out.txt and patched.txt are written."
# Header values kept verbatim; any other header's value is recorded as "<redacted>".
_SAFE_HEADERS = {
    "accept",
    "accept-encoding",
    "content-type",
    "content-encoding",
    "content-length",
    "connection",
    "host",
    "originator",
    "user-agent",
    "openai-beta",
    "version",
    "session_id",
    "session-id",
    "conversation_id",
    "x-client-request-id",
    "x-codex-turn-metadata",
    "x-codex-beta-features",
    "x-openai-subagent",
    "x-codex-window-id",
    "x-codex-installation-id",
    "x-synth-trial",
}


def _decode(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    if encoding == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    return body


def _tool_outputs(body: dict[str, Any]) -> int:
    return sum(
        1
        for item in body.get("input") or []
        if isinstance(item, dict) and item.get("type") in ("function_call_output", "custom_tool_call_output")
    )


def _tool_names(body: dict[str, Any]) -> dict[str, str]:
    names = {}
    for tool in body.get("tools") or []:
        name = tool.get("name")
        if name:
            names[name] = tool.get("type", "")
    return names


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def response_events(*, body: dict[str, Any], number: int) -> list[dict[str, Any]]:
    """The SSE events answering request ``body`` (the ``number``-th /responses call)."""
    response_id = f"resp_rec_{number}"
    done = _tool_outputs(body)
    tools = _tool_names(body)
    item: dict[str, Any]
    if done == 0:
        shell = next((n for n in ("exec_command", "shell_command", "shell") if n in tools), None)
        if shell == "exec_command":
            arguments = {"cmd": SHELL_COMMAND}
        elif shell == "shell_command":
            arguments = {"command": SHELL_COMMAND}
        else:
            arguments = {"command": ["bash", "-lc", SHELL_COMMAND]}
        item = {
            "type": "function_call",
            "id": f"fc_rec_{number}",
            "call_id": f"call_rec_{number}",
            "name": shell or "shell",
            "arguments": json.dumps(arguments),
            "status": "completed",
        }
    elif done == 1 and tools.get("apply_patch") == "custom":
        item = {
            "type": "custom_tool_call",
            "id": f"ctc_rec_{number}",
            "call_id": f"call_rec_{number}",
            "name": "apply_patch",
            "input": PATCH,
            "status": "completed",
        }
    else:
        item = {
            "type": "message",
            "id": f"msg_rec_{number}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": FINAL_TEXT, "annotations": []}],
        }
    reasoning = {
        "type": "reasoning",
        "id": f"rs_rec_{number}",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "Recorded reasoning."}],
    }
    response = {"id": response_id, "object": "response", "status": "in_progress", "model": MODEL, "output": []}
    usage = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 10,
        "output_tokens_details": {"reasoning_tokens": 3},
        "total_tokens": 110,
    }
    return [
        {"type": "response.created", "sequence_number": 0, "response": response},
        {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": reasoning},
        {"type": "response.output_item.done", "sequence_number": 2, "output_index": 0, "item": reasoning},
        {"type": "response.output_item.added", "sequence_number": 3, "output_index": 1, "item": item},
        {"type": "response.output_item.done", "sequence_number": 4, "output_index": 1, "item": item},
        {
            "type": "response.completed",
            "sequence_number": 5,
            "response": {**response, "status": "completed", "output": [reasoning, item], "usage": usage},
        },
    ]


class Recorder:
    def __init__(self, *, out: Path, credential: str = CREDENTIAL) -> None:
        self.out = out
        self.credential = credential
        self.lock = threading.Lock()
        self.count = 0
        self.responses = 0

    def record(self, *, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        with self.lock:
            self.count += 1
            number = self.count
        encoding = headers.get("content-encoding", "")
        raw = _decode(body, encoding) if body else b""
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode("utf-8", "replace")
        kept = {
            name: (value if name in _SAFE_HEADERS else "<redacted>")
            for name, value in sorted(headers.items())
            if name != "authorization"
        }
        if "authorization" in headers:
            scheme, _, token = headers["authorization"].partition(" ")
            kept["authorization"] = f"{scheme} <{'the env_key credential' if token == self.credential else 'other'}>"
        safe = path.replace("/", "_").strip("_") or "root"
        record = {"number": number, "method": method, "path": path, "headers": kept, "body": parsed}
        (self.out / f"{number:02d}-{method}-{safe}.json").write_text(json.dumps(record, indent=2) + "\n")
        return number, parsed


class _UnixHTTPServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


def serve(*, port: int = 0, recorder: Recorder, uds: Path | None = None) -> socketserver.BaseServer:
    """The recording server on 127.0.0.1:``port`` (0: any free port), or on the Unix socket
    ``uds`` (where a sandbox's model bridge forwards to), in a background thread."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _read(self) -> bytes:
            length = int(self.headers.get("content-length") or 0)
            return self.rfile.read(length) if length else b""

        def _handle(self) -> None:
            body = self._read()
            headers = {k.lower(): v for k, v in self.headers.items()}
            _, parsed = recorder.record(method=self.command, path=self.path, headers=headers, body=body)
            if self.command == "POST" and self.path.split("?")[0].endswith("/responses"):
                with recorder.lock:
                    recorder.responses += 1
                    n = recorder.responses
                payload = _sse(response_events(body=parsed if isinstance(parsed, dict) else {}, number=n))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            error = {"error": {"message": f"no {self.path} here", "type": "invalid_request_error", "code": None}}
            data = json.dumps(error).encode()
            self.send_response(404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _handle

        def log_message(self, format: str, *args: Any) -> None:
            return

    server: socketserver.BaseServer
    if uds is not None:
        server = _UnixHTTPServer(str(uds), Handler)
    else:
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# A model catalog entry for MODEL (config ``model_catalog_json``): without one Codex
# uses "fallback metadata" (no apply_patch tool, a default context window); with it the
# route is described like a model of Codex's own catalog, freeform apply_patch included.
CATALOG_ENTRY: dict[str, Any] = {
    "slug": MODEL,
    "base_instructions": "You are a coding agent working in a sandbox (recorder instructions).",
    "display_name": MODEL,
    "description": "a Synth model route",
    "context_window": 131072,
    "max_context_window": 131072,
    "apply_patch_tool_type": "freeform",
    "shell_type": "shell_command",
    "supports_parallel_tool_calls": False,
    "supports_reasoning_summaries": False,
    "default_reasoning_summary": "none",
    "visibility": "list",
    "supported_in_api": True,
    "priority": 1,
    "input_modalities": ["text"],
    "truncation_policy": {"mode": "tokens", "limit": 10000},
    "supported_reasoning_levels": [],
    "experimental_supported_tools": [],
    "support_verbosity": True,
}


def config_toml(*, port: int, catalog: Path | None = None) -> str:
    extra = f'model_catalog_json = "{catalog}"\nweb_search = "disabled"\n' if catalog else ""
    return extra + (
        f'model = "{MODEL}"\n'
        'model_provider = "synth"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "check_for_update_on_startup = false\n"
        "\n[model_providers.synth]\n"
        'name = "Synth"\n'
        f'base_url = "http://127.0.0.1:{port}/v1"\n'
        'wire_api = "responses"\n'
        f'env_key = "{CREDENTIAL_ENV}"\n'
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=18301)
    parser.add_argument("--out", type=Path, default=ROOT / "tests/fixtures/codex/fallback")
    parser.add_argument("--codex", type=Path, default=CODEX)
    parser.add_argument("--catalog", action="store_true", help="describe the model in a model_catalog_json")
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    recorder = Recorder(out=args.out)
    server = serve(port=args.port, recorder=recorder)
    with tempfile.TemporaryDirectory(prefix="codex-rec-") as tmp:
        home, work = Path(tmp) / "codex-home", Path(tmp) / "work"
        home.mkdir()
        work.mkdir()
        catalog = None
        if args.catalog:
            catalog = home / "models.json"
            catalog.write_text(json.dumps({"models": [CATALOG_ENTRY]}))
        config = config_toml(port=args.port, catalog=catalog)
        (home / "config.toml").write_text(config)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": tmp,
            "CODEX_HOME": str(home),
            CREDENTIAL_ENV: CREDENTIAL,
            "LANG": "C.UTF-8",
        }
        argv = [str(args.codex), "exec", "--json", "--skip-git-repo-check", "--ephemeral", "--color", "never"]
        argv += ["write out.txt, then patched.txt"]
        proc = subprocess.run(
            argv, cwd=work, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
        )
        server.shutdown()
        home_files = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
        for record in args.out.glob("*.json"):  # the temporary paths differ on every run
            record.write_text(record.read_text().replace(tmp, "<tmp>"))
        (args.out / "transcript.jsonl").write_text(proc.stdout)
        (args.out / "stderr.txt").write_text(proc.stderr.replace(tmp, "<tmp>"))
        files = sorted(p.name for p in work.iterdir())
        (args.out / "result.json").write_text(
            json.dumps(
                {
                    "argv": ["codex", *argv[1:]],
                    "exit_code": proc.returncode,
                    "workdir_files": files,
                    "codex_home_files": home_files,
                    "out.txt": (work / "out.txt").read_text() if (work / "out.txt").exists() else None,
                    "patched.txt": (work / "patched.txt").read_text() if (work / "patched.txt").exists() else None,
                    "config.toml": config.replace(tmp, "<tmp>"),
                    "catalog": CATALOG_ENTRY if catalog else None,
                },
                indent=2,
            )
            + "\n"
        )
    print(f"codex exited {proc.returncode}; {recorder.count} requests recorded in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
