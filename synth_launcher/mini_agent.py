#!/usr/bin/env python3
"""synth-mini: the platform's built-in minimal agent, for machines without Node.

An Anthropic Messages tool loop with three tools (bash, read_file, write_file). ONE
self-contained file, standard library only, Python 3.9+: it runs on whatever python3 a
sandbox has (the launch plan runs it as ``python3 -I /installed-agent/synth_mini.py``);
it imports nothing from the project.

Configuration, as for Claude Code::

    ANTHROPIC_BASE_URL        the API (``/v1/messages`` is appended), required
    ANTHROPIC_API_KEY         sent as x-api-key; or ANTHROPIC_AUTH_TOKEN, sent as Bearer
    ANTHROPIC_MODEL           the model name, required
    ANTHROPIC_CUSTOM_HEADERS  extra headers, one "Name: value" per line

Usage::

    synth_mini.py [options] [--] [INSTRUCTION]

The instruction is the argument, else the file of ``--instruction-file``, else stdin.
Each turn is one non-streaming POST; 429, 529, 5xx, timeouts and dropped connections are
retried (``--max-retries``, honouring retry-after). Every tool_use block of a response is
executed in order (commands and relative paths in the working directory) and answered
with a tool_result (``is_error`` on failure). The loop ends when the model ends its turn
without a tool call, or after ``--max-turns`` model calls.

Output: a JSONL transcript (``--transcript``; one line per request, response and retry,
plus a start and an end line), a short summary on stdout, diagnostics on stderr.
Exit status: 0 the model ended its turn, 1 an error, 2 the turn limit was reached.
"""

from __future__ import annotations

import argparse
import email.utils
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

VERSION = "1"
DEFAULT_TRANSCRIPT = "/logs/agent/synth-mini.jsonl"
ANTHROPIC_VERSION = "2023-06-01"
EXIT_OK, EXIT_ERROR, EXIT_MAX_TURNS = 0, 1, 2
RETRY_STATUSES = (408, 409, 429, 500, 502, 503, 504, 529)
MAX_RETRY_WAIT_SEC = 60.0
MAX_BASH_TIMEOUT_SEC = 3600.0
READ_DEFAULT_LINES = 2000

DEFAULT_SYSTEM = """\
You are an autonomous software agent working in a Linux sandbox. Complete the user's \
task by using the tools: bash runs shell commands, read_file reads a text file, \
write_file creates or replaces a file. The working directory is {cwd}; relative paths \
are resolved against it. No one will answer questions: make reasonable assumptions and \
keep going until the task is done, checking your work where you can. When the task is \
complete, reply with a short summary and no tool call."""

TOOLS = [
    {
        "name": "bash",
        "description": (
            "Run a command with bash in the working directory and return its combined stdout and "
            "stderr (long output is truncated in the middle) and its exit code. Each call is a new "
            "shell: use absolute paths or `cd dir && ...`. stdin is empty; do not start interactive "
            "programs. Background processes (`cmd > log 2>&1 &`) keep running."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "the bash command to run"},
                "timeout": {"type": "number", "description": "seconds before the command is killed"},
            },
            "required": ["command"],
        },
    },
    {
        "name": "read_file",
        "description": (
            "Read a text file. Returns up to `limit` lines (default 2000) starting at line "
            "`offset` (1-based, default 1); says so when there is more."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "absolute, or relative to the working directory"},
                "offset": {"type": "integer", "description": "first line to read, 1-based"},
                "limit": {"type": "integer", "description": "number of lines to read"},
            },
            "required": ["path"],
        },
    },
    {
        "name": "write_file",
        "description": "Create or overwrite a file with the given content (parent directories are created).",
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "absolute, or relative to the working directory"},
                "content": {"type": "string", "description": "the complete new content of the file"},
            },
            "required": ["path", "content"],
        },
    },
]


class AgentError(Exception):
    """The run cannot continue (configuration, a refused or failed model call)."""


class ToolError(Exception):
    """A tool call failed; its message goes back to the model as an is_error tool_result."""


def log(message: str) -> None:
    sys.stderr.write("synth-mini: " + message + "\n")
    sys.stderr.flush()


def truncate(text: str, limit: int) -> str:
    """``text`` cut in the middle to about ``limit`` characters, saying how much was left out."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    omitted = len(text) - head - tail
    return text[:head] + f"\n\n[... {omitted} characters omitted ...]\n\n" + text[-tail:]


# ---------------------------------------------------------------- transcript


class Transcript:
    """One JSON object per line, flushed at once (a killed agent leaves a readable file)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = None
        if path:
            parent = os.path.dirname(os.path.abspath(path))
            os.makedirs(parent, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the run

    def write(self, kind: str, **fields: object) -> None:
        if self._file is None:
            return
        record = {"type": kind, "time": round(time.time(), 3)}
        record.update(fields)
        self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# ---------------------------------------------------------------- the model


def custom_headers(text: str) -> dict[str, str]:
    """ANTHROPIC_CUSTOM_HEADERS: "Name: value" lines; anything else is ignored."""
    headers = {}
    for line in (text or "").splitlines():
        name, sep, value = line.partition(":")
        name = name.strip()
        if sep and name and all(33 <= ord(c) <= 126 for c in name):
            headers[name] = value.strip()
    return headers


def retry_after(headers: object) -> float | None:
    """Seconds to wait from retry-after-ms / retry-after (seconds or an HTTP date), if any."""
    if headers is None:
        return None
    get = headers.get  # type: ignore[attr-defined]
    value = get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


class Client:
    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        auth_token: str,
        headers: dict[str, str],
        timeout: float,
        max_retries: int,
        transcript: Transcript,
    ) -> None:
        self.url = base_url.rstrip("/") + "/v1/messages"
        self.headers = dict(headers)
        self.headers.update(
            {
                "content-type": "application/json",
                "accept": "application/json",
                "anthropic-version": ANTHROPIC_VERSION,
                "user-agent": "synth-mini/" + VERSION,
            }
        )
        if api_key:
            self.headers["x-api-key"] = api_key
        elif auth_token:
            self.headers["authorization"] = "Bearer " + auth_token
        self.timeout = timeout
        self.max_retries = max_retries
        self.transcript = transcript

    def create(self, body: dict, *, turn: int) -> dict:
        """POST one request; the response message. Retries what is worth retrying."""
        data = json.dumps(body).encode("utf-8")
        attempt = 0
        while True:
            attempt += 1
            status, reply_headers, detail = None, None, ""
            try:
                request = urllib.request.Request(self.url, data=data, headers=self.headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                    request_id = response.headers.get("request-id")
                try:
                    message = json.loads(raw.decode("utf-8"))
                except ValueError as exc:
                    raise AgentError(f"the model's response is not JSON: {exc}") from None
                if not isinstance(message, dict) or not isinstance(message.get("content"), list):
                    raise AgentError(f"the model's response is not a message: {truncate(str(message), 500)}")
                self.transcript.write("response", turn=turn, attempt=attempt, request_id=request_id, body=message)
                return message
            except urllib.error.HTTPError as exc:
                status, reply_headers = exc.code, exc.headers
                try:
                    detail = exc.read().decode("utf-8", "replace")
                except Exception:  # noqa: BLE001 - the status says enough
                    detail = ""
                retryable = status in RETRY_STATUSES or status >= 500
            except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out
                detail = str(getattr(exc, "reason", None) or exc) or type(exc).__name__
                retryable = True
            error = f"HTTP {status}: {truncate(detail, 2000)}" if status else detail
            will_retry = retryable and attempt <= self.max_retries
            wait = None
            if will_retry:
                wait = retry_after(reply_headers)
                if wait is None:
                    wait = min(2.0 ** (attempt - 1), 30.0) * (0.75 + random.random() / 2)
                wait = min(wait, MAX_RETRY_WAIT_SEC)
            self.transcript.write("error", turn=turn, attempt=attempt, status=status, error=error, retry_in=wait)
            if not will_retry:
                if retryable:
                    raise AgentError(f"model call failed after {attempt} attempts: {error}")
                raise AgentError(f"model call refused: {error}")
            log(f"turn {turn} attempt {attempt}: {error}; retrying in {wait:.1f}s")
            time.sleep(wait)


# ---------------------------------------------------------------- the tools


class Tools:
    def __init__(self, *, cwd: str, bash_timeout: float, output_limit: int) -> None:
        self.cwd = cwd
        self.bash_timeout = bash_timeout
        self.output_limit = output_limit
        self.shell = next((s for s in ("/bin/bash", "/usr/bin/bash") if os.path.exists(s)), "/bin/sh")

    def path(self, value: object) -> str:
        if not isinstance(value, str) or not value or "\x00" in value:
            raise ToolError("path must be a non-empty string")
        return os.path.normpath(os.path.join(self.cwd, os.path.expanduser(value)))

    def run(self, name: str, arguments: object) -> tuple[str, bool]:
        """(result text, is_error) of one tool call."""
        if not isinstance(arguments, dict):
            return "the tool input must be a JSON object", True
        handler = {"bash": self.bash, "read_file": self.read_file, "write_file": self.write_file}.get(name)
        if handler is None:
            return f"unknown tool {name!r} (available: bash, read_file, write_file)", True
        try:
            return handler(arguments)
        except ToolError as exc:
            return str(exc), True
        except (OSError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}", True

    def bash(self, args: dict) -> tuple[str, bool]:
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("bash: 'command' must be a non-empty string")
        timeout = args.get("timeout")
        if timeout is None:
            timeout = self.bash_timeout
        elif isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ToolError("bash: 'timeout' must be a positive number of seconds")
        timeout = min(float(timeout), MAX_BASH_TIMEOUT_SEC)
        # Output goes to a file, not a pipe: a background process that inherits it must
        # not keep the call waiting for an end of file that never comes.
        with tempfile.TemporaryFile() as out:
            process = subprocess.Popen(
                [self.shell, "-c", command],
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a timeout kills all of it
            )
            timed_out = False
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except OSError:
                    pass
                code = process.wait()
            out.seek(0)
            text = out.read().decode("utf-8", "replace")
        text = truncate(text, self.output_limit)
        sep = "\n" if text and not text.endswith("\n") else ""
        if timed_out:
            return f"{text}{sep}[timed out after {timeout:g}s; the command was killed]", True
        if code != 0:
            return f"{text}{sep}[exit code {code}]", True
        return text if text else "[no output]", False

    def read_file(self, args: dict) -> tuple[str, bool]:
        path = self.path(args.get("path"))
        offset, limit = args.get("offset", 1), args.get("limit", READ_DEFAULT_LINES)
        for name, value in (("offset", offset), ("limit", limit)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ToolError(f"read_file: {name!r} must be a positive integer")
        if os.path.isdir(path):
            raise ToolError(f"read_file: {path} is a directory (use bash to list it)")
        with open(path, "rb") as handle:
            lines = handle.read().decode("utf-8", "replace").splitlines(keepends=True)
        if not lines:
            return f"[{path} is empty]", False
        if offset > len(lines):
            raise ToolError(f"read_file: offset {offset} is past the end of {path} ({len(lines)} lines)")
        chunk = lines[offset - 1 : offset - 1 + limit]
        text = truncate("".join(chunk), self.output_limit)
        last = offset - 1 + len(chunk)
        if offset > 1 or last < len(lines):
            text += f"\n[lines {offset}-{last} of {len(lines)}]"
        return text, False

    def write_file(self, args: dict) -> tuple[str, bool]:
        path = self.path(args.get("path"))
        content = args.get("content")
        if not isinstance(content, str):
            raise ToolError("write_file: 'content' must be a string")
        if os.path.isdir(path):
            raise ToolError(f"write_file: {path} is a directory")
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        data = content.encode("utf-8")
        with open(path, "wb") as handle:
            handle.write(data)
        return f"wrote {len(data)} bytes to {path}", False


# ---------------------------------------------------------------- the loop


def text_of(content: list) -> str:
    return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text").strip()


def run(*, args: argparse.Namespace, instruction: str, transcript: Transcript) -> int:
    env = os.environ
    base_url = env.get("ANTHROPIC_BASE_URL", "").strip()
    model = env.get("ANTHROPIC_MODEL", "").strip()
    api_key = env.get("ANTHROPIC_API_KEY", "").strip()
    auth_token = env.get("ANTHROPIC_AUTH_TOKEN", "").strip()
    if not base_url:
        raise AgentError("ANTHROPIC_BASE_URL is not set")
    if not model:
        raise AgentError("ANTHROPIC_MODEL is not set")
    if not (api_key or auth_token):
        log("neither ANTHROPIC_API_KEY nor ANTHROPIC_AUTH_TOKEN is set; calling without credentials")
    cwd = os.getcwd()
    system = args.system if args.system is not None else DEFAULT_SYSTEM.format(cwd=cwd)
    client = Client(
        base_url=base_url,
        api_key=api_key,
        auth_token=auth_token,
        headers=custom_headers(env.get("ANTHROPIC_CUSTOM_HEADERS", "")),
        timeout=args.request_timeout,
        max_retries=args.max_retries,
        transcript=transcript,
    )
    tools = Tools(cwd=cwd, bash_timeout=args.bash_timeout, output_limit=args.output_limit)
    transcript.write(
        "start",
        version=VERSION,
        python=sys.version.split()[0],
        base_url=base_url,
        model=model,
        cwd=cwd,
        max_turns=args.max_turns,
        max_tokens=args.max_tokens,
    )

    messages: list[dict] = [{"role": "user", "content": instruction}]
    usage = {"input_tokens": 0, "output_tokens": 0}
    tool_calls = 0
    started = time.monotonic()
    final_text, stop_reason, turn, finished = "", None, 0, False
    logged = 0  # messages already in the transcript
    while turn < args.max_turns:
        turn += 1
        body = {"model": model, "max_tokens": args.max_tokens, "messages": messages, "tools": TOOLS}
        if system:
            body["system"] = system
        # Requests repeat the whole history: the transcript has each message once, the
        # first request's system prompt and tools, and where each request's new messages start.
        record = {
            "model": model,
            "max_tokens": args.max_tokens,
            "message_offset": logged,
            "messages": messages[logged:],
        }
        if turn == 1:
            record.update(system=system, tools=TOOLS)
        transcript.write("request", turn=turn, **record)
        logged = len(messages)
        message = client.create(body, turn=turn)
        content = [b for b in message["content"] if isinstance(b, dict)]
        stop_reason = message.get("stop_reason")
        for key in usage:
            value = (message.get("usage") or {}).get(key)
            if isinstance(value, int):
                usage[key] += value
        if content:
            messages.append({"role": "assistant", "content": content})
            logged = len(messages)  # the response line has it
        final_text = text_of(content) or final_text
        uses = [b for b in content if b.get("type") == "tool_use"]
        if uses:
            results = []
            for block in uses:
                tool_calls += 1
                name, arguments = block.get("name"), block.get("input")
                t0 = time.monotonic()
                output, is_error = tools.run(str(name), arguments if arguments is not None else {})
                result = {"type": "tool_result", "tool_use_id": block.get("id"), "content": output}
                if is_error:
                    result["is_error"] = True
                results.append(result)
                shown = truncate(json.dumps(arguments, ensure_ascii=False), 200)
                status = "error: " if is_error else ""
                log(f"turn {turn}: {name} {shown} -> {status}{truncate(output, 200)}".replace("\n", " "))
                transcript.write(
                    "tool",
                    turn=turn,
                    name=name,
                    id=block.get("id"),
                    is_error=is_error,
                    seconds=round(time.monotonic() - t0, 3),
                )
            messages.append({"role": "user", "content": results})
            continue
        if stop_reason in ("end_turn", "stop_sequence"):
            finished = True
            break
        if stop_reason == "pause_turn":
            continue  # the API wants the same conversation sent again
        if stop_reason == "max_tokens":
            messages.append(
                {"role": "user", "content": "Your reply was cut off at the output limit. Continue where you stopped."}
            )
            continue
        raise AgentError(f"the model stopped with {stop_reason!r}")

    seconds = time.monotonic() - started
    outcome = "end_turn" if finished else "max_turns"
    transcript.write("end", outcome=outcome, turns=turn, tool_calls=tool_calls, usage=usage, seconds=round(seconds, 3))
    print(
        f"synth-mini: {outcome} after {turn} turn(s), {tool_calls} tool call(s), "
        f"{usage['input_tokens']} input / {usage['output_tokens']} output tokens, {seconds:.1f}s"
    )
    if final_text:
        print(final_text)
    return EXIT_OK if finished else EXIT_MAX_TURNS


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="synth-mini",
        description="A minimal Anthropic Messages tool-loop agent (bash, read_file, write_file).",
        allow_abbrev=False,  # "--trans" must not silently mean "--transcript"
    )
    p.add_argument("instruction", nargs="?", help="the task; default: --instruction-file, else stdin")
    p.add_argument("--instruction-file", metavar="PATH", help="read the instruction from this file")
    p.add_argument("--max-turns", type=positive_int, default=50, help="model calls at most (default 50)")
    p.add_argument("--max-tokens", type=positive_int, default=8192, help="max_tokens per call (default 8192)")
    p.add_argument("--system", metavar="TEXT", help="the system prompt (default: a short built-in one)")
    p.add_argument(
        "--transcript",
        metavar="PATH",
        default=DEFAULT_TRANSCRIPT,
        help=f"JSONL transcript, appended to (default {DEFAULT_TRANSCRIPT}; '' for none)",
    )
    p.add_argument("--max-retries", type=int, default=5, help="retries of a failed model call (default 5)")
    p.add_argument("--request-timeout", type=positive_float, default=600.0, help="seconds per model call (default 600)")
    p.add_argument(
        "--bash-timeout", type=positive_float, default=300.0, help="default seconds per bash command (default 300)"
    )
    p.add_argument(
        "--output-limit",
        type=positive_int,
        default=30000,
        help="characters of tool output returned to the model (default 30000)",
    )
    p.add_argument("--version", action="version", version="synth-mini " + VERSION)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.instruction is not None:
        instruction = args.instruction
    elif args.instruction_file:
        try:
            with open(args.instruction_file, encoding="utf-8") as handle:
                instruction = handle.read()
        except OSError as exc:
            log(f"cannot read the instruction: {exc}")
            return EXIT_ERROR
    else:
        instruction = sys.stdin.read()
    if not instruction.strip():
        log("no instruction (give it as the argument, with --instruction-file or on stdin)")
        return EXIT_ERROR
    transcript = Transcript(args.transcript)
    try:
        return run(args=args, instruction=instruction, transcript=transcript)
    except AgentError as exc:
        transcript.write("end", outcome="error", error=str(exc))
        log(str(exc))
        print(f"synth-mini: error: {exc}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        transcript.write("end", outcome="interrupted")
        return 130
    finally:
        transcript.close()


if __name__ == "__main__":
    sys.exit(main())
