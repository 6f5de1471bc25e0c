"""OpenAI Responses requests (what Codex CLI sends) -> the proxy's internal request.

The internal request is the Anthropic-shaped one every family adapter renders (schema.py's
output: system, messages, tools, tool_choice, thinking, max_tokens, ...), so a Responses call
goes through the same render, fit, sample, parse and capture as a Messages call. This module
is pure (no Django, no I/O): validation with the path of the bad value in every message, and
the mapping below. `responses_output.py` maps the parsed completion back to output items.

| field                         | handling |
|-------------------------------|----------|
| model                         | act: resolved to a route like Messages' model |
| instructions                  | act: the system prompt |
| input (string)                | act: one user message |
| input: message user           | act: a user turn; input_text parts joined with "\\n"; input_image / input_file as a short note (text-only families) |
| input: message system/developer | act: a system message where it stands (the template decides how it renders) |
| input: message assistant      | act: output_text / refusal parts -> text of the assistant turn |
| input: reasoning              | act: the assistant turn's reasoning, exactly: `content` reasoning_text, else this server's `encrypted_content`, else the summary texts |
| input: function_call          | act: a tool call (arguments: a JSON object as a string) |
| input: custom_tool_call       | act: a tool call of the custom tool, its raw `input` as the one string argument |
| input: function_call_output, custom_tool_call_output | act: the tool result (string, or input_text parts) |
| input: web_search_call and other hosted-tool calls | ignore: nothing to render (the proxy runs no hosted tools) |
| input: item_reference, other types | 400: this server keeps no state |
| tools: function               | act: rendered natively (strict ignored) |
| tools: namespace {name, tools} | act: its tools are shown as plain tools (qualified "NAMESPACE__NAME" only where a name repeats); calls name the namespace again |
| tools: custom {name, description, format} | act: presented to the model as a function with one string parameter `input`; the format (grammar, lark or regex) goes into the description; the call comes back as custom_tool_call |
| tools: web_search, file_search, code_interpreter, image_generation, mcp, computer_use | ignore: hosted tools the proxy cannot run are not shown to the model |
| tools: local_shell, other     | 400 |
| tool_choice                   | record: auto/none/required/{function or custom name} map to Messages' auto/none/any/tool; not enforced |
| parallel_tool_calls           | record; not enforced |
| max_output_tokens             | act: the turn's limit (clamped to the route's max_output; absent: the route's max_output) |
| temperature (0..2), top_p     | act: passed to the sampler |
| reasoning.effort              | act: "none" turns the template's thinking off, any other effort on; absent: the family's default |
| reasoning.summary             | ignore: the reasoning is returned whole, as reasoning_text content |
| include                       | act: "reasoning.encrypted_content" adds encrypted_content to reasoning items; others ignored |
| store, service_tier, truncation, user, safety_identifier, prompt_cache_retention, stream_options, text, top_logprobs, max_tool_calls, client_metadata | ignore (we are stateless; text formats are not enforced) |
| prompt_cache_key              | act: the session key of the prefix cache and of the captured call (Codex sends its thread id) |
| metadata                      | record |
| stream                        | act: the Responses event stream or one response object |
| previous_response_id, conversation, background | 400: this server keeps no responses; send the whole conversation |
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
from dataclasses import dataclass, field
from typing import Any

from apps.proxy.errors import InvalidRequest

MAX_ITEMS = 100_000
CUSTOM_INPUT = "input"  # the one parameter a custom tool is presented with
ENCRYPTED_PREFIX = "synth1"
ENCRYPTED_INCLUDE = "reasoning.encrypted_content"
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
HOSTED_TOOLS = (
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "image_generation",
    "mcp",
    "computer_use",
    "computer_use_preview",
)
HOSTED_CALLS = (
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "computer_call",
    "computer_call_output",
)
STATEFUL = ("previous_response_id", "conversation")


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated Responses request: the internal request and what the answer needs."""

    internal: dict[str, Any]  # Anthropic-shaped, as schema.messages_request_parse returns it
    custom_tools: frozenset[str] = frozenset()
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)  # shown name -> (namespace, name)
    include_encrypted: bool = False
    max_output_tokens: int | None = None
    prompt_cache_key: str = ""
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the response object repeats


def _fail(path: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{path}: {message}" if path else message)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _string(value: Any, path: str, *, allow_empty: bool = True) -> str:
    if not isinstance(value, str) or (not allow_empty and not value):
        raise _fail(path, "Input should be a valid string" if allow_empty else "Field required (a non-empty string)")
    return value


# REASONING KEPT BY THE CLIENT
# ------------------------------------------------------------------------------


def reasoning_seal(*, text: str, key: bytes) -> str:
    """The reasoning text as an opaque `encrypted_content` that this server turns back into
    exactly the same text (`reasoning_unseal`); the tag keeps anyone from forging one."""
    payload = base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii").rstrip("=")
    tag = hmac.new(key, payload.encode("ascii"), hashlib.sha256).hexdigest()[:32]
    return f"{ENCRYPTED_PREFIX}.{payload}.{tag}"


def reasoning_unseal(*, sealed: str, key: bytes) -> str | None:
    """The text `reasoning_seal` sealed, or None if this server did not issue `sealed`."""
    parts = sealed.split(".")
    if len(parts) != 3 or parts[0] != ENCRYPTED_PREFIX:
        return None
    _, payload, tag = parts
    expected = hmac.new(key, payload.encode("ascii", "replace"), hashlib.sha256).hexdigest()[:32]
    if not hmac.compare_digest(expected, tag):
        return None
    try:
        return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None


# INPUT ITEMS
# ------------------------------------------------------------------------------


def _image_block(part: dict[str, Any], path: str) -> dict[str, Any]:
    """input_image / input_file as the Messages image/document block the adapters note."""
    url = part.get("image_url") or part.get("file_url") or ""
    if not isinstance(url, str):
        raise _fail(f"{path}.image_url", "Input should be a valid string")
    if url.startswith("data:") and ";base64," in url:
        media_type, _, data = url[5:].partition(";base64,")
        source: dict[str, Any] = {"type": "base64", "media_type": media_type or "unknown", "data": data}
    elif url:
        source = {"type": "url", "url": url}
    elif isinstance(part.get("file_data"), str):
        source = {"type": "base64", "media_type": "application/octet-stream", "data": part["file_data"]}
    else:
        source = {"type": "file", "file_id": str(part.get("file_id") or "")}
    return {"type": "image" if part["type"] == "input_image" else "document", "source": source}


def _user_parts(content: Any, path: str) -> list[dict[str, Any]]:
    """A user/system message's content as Messages blocks."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _fail(path, "Input should be a string or a list of content parts")
    blocks = []
    for i, part in enumerate(content):
        where = f"{path}.{i}"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _fail(where, "Input should be a content part with a type")
        kind = part["type"]
        if kind in ("input_text", "output_text", "text"):
            blocks.append({"type": "text", "text": _string(part.get("text"), f"{where}.text")})
        elif kind in ("input_image", "input_file"):
            blocks.append(_image_block(part, where))
        elif kind == "refusal":
            blocks.append({"type": "text", "text": _string(part.get("refusal"), f"{where}.refusal")})
        else:
            raise _fail(f"{where}.type", f"unknown content part type {kind!r}")
    return blocks


def _assistant_parts(content: Any, path: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _fail(path, "Input should be a string or a list of content parts")
    blocks = []
    for i, part in enumerate(content):
        where = f"{path}.{i}"
        if not isinstance(part, dict):
            raise _fail(where, "Input should be an object")
        kind = part.get("type")
        if kind in ("output_text", "input_text", "text"):
            blocks.append({"type": "text", "text": _string(part.get("text"), f"{where}.text")})
        elif kind == "refusal":
            blocks.append({"type": "text", "text": _string(part.get("refusal"), f"{where}.refusal")})
        else:
            raise _fail(f"{where}.type", f"an assistant message holds output_text or refusal parts, not {kind!r}")
    return blocks


def _reasoning_text(item: dict[str, Any], path: str, *, key: bytes) -> str | None:
    """The exact reasoning text of a reasoning item (see the table above)."""
    content = item.get("content")
    if content is not None:
        if not isinstance(content, list):
            raise _fail(f"{path}.content", "Input should be a list")
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("reasoning_text", "text"):
                raise _fail(f"{path}.content.{i}", "Input should be a reasoning_text part")
            texts.append(_string(part.get("text"), f"{path}.content.{i}.text"))
        if texts:
            return "".join(texts)
    sealed = item.get("encrypted_content")
    if sealed is not None:
        text = reasoning_unseal(sealed=_string(sealed, f"{path}.encrypted_content"), key=key)
        if text is None:
            raise _fail(f"{path}.encrypted_content", "was not issued by this server")
        return text
    summary = item.get("summary") or []
    if not isinstance(summary, list):
        raise _fail(f"{path}.summary", "Input should be a list")
    texts = []
    for i, part in enumerate(summary):
        if not isinstance(part, dict):
            raise _fail(f"{path}.summary.{i}", "Input should be a summary_text part")
        texts.append(_string(part.get("text"), f"{path}.summary.{i}.text"))
    return "\n\n".join(texts) if texts else None


def _arguments(value: Any, path: str) -> dict[str, Any]:
    text = _string(value, path)
    if not text.strip():
        return {}
    try:
        arguments = json.loads(text)
    except ValueError as exc:
        raise _fail(path, f"is not valid JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise _fail(path, "Input should be a JSON object (as a string)")
    return arguments


def _output_content(value: Any, path: str) -> str | list[dict[str, Any]]:
    """A tool output: a string, or content parts (text, images)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return _user_parts(value, path)
    raise _fail(path, "Input should be a string or a list of content parts")


class _Turns:
    """Builds Messages turns from items: an assistant turn's items (reasoning, messages, calls)
    join one assistant message; each user, system or developer message is its own turn; tool
    outputs join the user turn that follows the calls."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def _last(self, role: str) -> list[dict[str, Any]]:
        if self.messages and self.messages[-1]["role"] == role and self.messages[-1].get("_open"):
            return self.messages[-1]["content"]
        self.messages.append({"role": role, "content": [], "_open": True})
        return self.messages[-1]["content"]

    def assistant(self, block: dict[str, Any]) -> None:
        self._last("assistant").append(block)

    def tool_result(self, block: dict[str, Any]) -> None:
        self._last("user").append(block)

    def message(self, role: str, blocks: list[dict[str, Any]]) -> None:
        # Closed: the next message of the same role is a turn of its own.
        self.messages.append({"role": role, "content": blocks, "_open": False})

    def done(self) -> list[dict[str, Any]]:
        return [{"role": m["role"], "content": m["content"]} for m in self.messages]


def _items(value: Any, *, key: bytes, tools: _ToolSet) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": [{"type": "text", "text": value}]}]
    if not isinstance(value, list):
        raise _fail("input", "Input should be a string or a list of items")
    if len(value) > MAX_ITEMS:
        raise _fail("input", f"at most {MAX_ITEMS} items")
    turns = _Turns()
    for i, item in enumerate(value):
        path = f"input.{i}"
        if not isinstance(item, dict):
            raise _fail(path, "Input should be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                for block in _assistant_parts(item.get("content"), f"{path}.content"):
                    turns.assistant(block)
            elif role in ("user", "system", "developer"):
                blocks = _user_parts(item.get("content"), f"{path}.content")
                if role == "user":
                    turns.message("user", blocks)
                else:
                    texts = [b for b in blocks if b["type"] == "text"]
                    if len(texts) != len(blocks):
                        raise _fail(f"{path}.content", f"a {role} message holds text only")
                    turns.message("system", texts)
            else:
                raise _fail(f"{path}.role", "Input should be 'user', 'assistant', 'system' or 'developer'")
        elif kind == "reasoning":
            text = _reasoning_text(item, path, key=key)
            if text is not None:
                turns.assistant({"type": "thinking", "thinking": text, "signature": ""})
        elif kind == "function_call":
            call_id = _string(item.get("call_id"), f"{path}.call_id", allow_empty=False)
            name = _string(item.get("name"), f"{path}.name", allow_empty=False)
            if item.get("namespace"):
                name = tools.presented(namespace=_string(item["namespace"], f"{path}.namespace"), name=name)
            arguments = _arguments(item.get("arguments"), f"{path}.arguments")
            turns.assistant({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
        elif kind == "custom_tool_call":
            call_id = _string(item.get("call_id"), f"{path}.call_id", allow_empty=False)
            name = _string(item.get("name"), f"{path}.name", allow_empty=False)
            raw = _string(item.get("input"), f"{path}.input")
            turns.assistant({"type": "tool_use", "id": call_id, "name": name, "input": {CUSTOM_INPUT: raw}})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = _string(item.get("call_id"), f"{path}.call_id", allow_empty=False)
            if "output" not in item:
                raise _fail(f"{path}.output", "Field required")
            content = _output_content(item["output"], f"{path}.output")
            turns.tool_result({"type": "tool_result", "tool_use_id": call_id, "content": content})
        elif kind in HOSTED_CALLS:
            continue  # a hosted tool's call: nothing the model could have sampled here
        elif kind == "item_reference":
            raise _fail(f"{path}.type", "item_reference needs stored responses; this server keeps none")
        else:
            raise _fail(f"{path}.type", f"unknown input item type {kind!r}")
    messages = turns.done()
    if not any(m["role"] != "system" for m in messages):
        raise _fail("input", "at least one user or assistant item is required")
    return messages


# TOOLS
# ------------------------------------------------------------------------------


def custom_tool_schema() -> dict[str, Any]:
    """The parameters a custom tool is presented with: its raw input as one string."""
    return {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string"}},
        "required": [CUSTOM_INPUT],
        "additionalProperties": False,
    }


def _custom_description(tool: dict[str, Any], path: str) -> str:
    description = tool.get("description") or ""
    if not isinstance(description, str):
        raise _fail(f"{path}.description", "Input should be a valid string")
    fmt = tool.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return description
    if not isinstance(fmt, dict) or fmt.get("type") != "grammar":
        raise _fail(f"{path}.format.type", "Input should be 'text' or 'grammar'")
    syntax = _string(fmt.get("syntax"), f"{path}.format.syntax", allow_empty=False)
    definition = _string(fmt.get("definition"), f"{path}.format.definition", allow_empty=False)
    grammar = f"The input is raw text that follows this {syntax} grammar:\n```\n{definition}\n```"
    return f"{description}\n\n{grammar}" if description else grammar


@dataclass
class _ToolSet:
    tools: list[dict[str, Any]] = field(default_factory=list)
    custom: set[str] = field(default_factory=set)
    # The name the model sees -> (namespace, name) for the tools of a namespace.
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)

    def presented(self, *, namespace: str, name: str) -> str:
        for shown, origin in self.namespaced.items():
            if origin == (namespace, name):
                return shown
        return name


def _tools(value: Any) -> _ToolSet:
    if value is None:
        return _ToolSet()
    if not isinstance(value, list):
        raise _fail("tools", "Input should be a valid list")
    out = _ToolSet()
    entries: list[tuple[str, dict[str, Any], str]] = []  # (path, tool, namespace)
    for i, tool in enumerate(value):
        path = f"tools.{i}"
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            # Codex groups some tools (e.g. its sub-agent tools) in a namespace; the model
            # sees them as plain tools and its calls name the namespace again.
            namespace = _string(tool.get("name"), f"{path}.name", allow_empty=False)
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise _fail(f"{path}.tools", "Input should be a valid list")
            entries += [(f"{path}.tools.{j}", t, namespace) for j, t in enumerate(inner)]
        else:
            entries.append((path, tool, ""))
    plain = {t.get("name") for _, t, ns in entries if not ns and isinstance(t, dict)}
    names: set[str] = set()
    for path, tool, namespace in entries:
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise _fail(path, "Input should be a tool with a type")
        kind = tool["type"]
        if kind in HOSTED_TOOLS:
            continue
        if kind not in ("function", "custom"):
            raise _fail(f"{path}.type", f"tool type {kind!r} is not supported here (use a function or custom tool)")
        name = _string(tool.get("name"), f"{path}.name", allow_empty=False)
        if namespace:
            shown = f"{namespace}__{name}" if name in plain else name
            out.namespaced[shown] = (namespace, name)
            name = shown
        if name in names:
            raise _fail(f"{path}.name", f"tool names must be unique ({name!r} repeats)")
        names.add(name)
        if kind == "function":
            parameters = tool.get("parameters")
            if parameters is None:
                parameters = {"type": "object", "properties": {}}
            if not isinstance(parameters, dict):
                raise _fail(f"{path}.parameters", "Input should be an object")
            entry: dict[str, Any] = {"name": name}
            if tool.get("description") is not None:
                entry["description"] = _string(tool["description"], f"{path}.description")
            entry["input_schema"] = parameters
        else:
            description = _custom_description(tool, path)
            entry = {"name": name, "description": description, "input_schema": custom_tool_schema()}
            out.custom.add(name)
        out.tools.append(entry)
    return out


def _tool_choice(value: Any, names: set[str]) -> dict[str, Any] | None:
    if value is None:
        return None
    modes = {"auto": "auto", "none": "none", "required": "any"}
    if isinstance(value, str):
        if value not in modes:
            raise _fail("tool_choice", "Input should be 'auto', 'none', 'required' or a tool")
        return {"type": modes[value]}
    if not isinstance(value, dict):
        raise _fail("tool_choice", "Input should be a string or an object")
    kind = value.get("type")
    if kind in ("function", "custom"):
        name = _string(value.get("name"), "tool_choice.name", allow_empty=False)
        if name not in names:
            raise _fail("tool_choice.name", f"no tool named {name!r} in tools")
        return {"type": "tool", "name": name}
    if kind == "allowed_tools":
        mode = value.get("mode", "auto")
        return {"type": "any" if mode == "required" else "auto"}
    if kind in HOSTED_TOOLS:
        return {"type": "auto"}
    raise _fail("tool_choice.type", f"unknown tool_choice type {kind!r}")


# THE REQUEST
# ------------------------------------------------------------------------------


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (low <= value <= high):
        raise _fail(name, f"Input should be a number between {low:g} and {high:g}")
    return float(value)


def _thinking(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _fail("reasoning", "Input should be an object")
    effort = value.get("effort")
    if effort is None:
        return None
    if effort not in EFFORTS:
        raise _fail("reasoning.effort", f"Input should be one of {', '.join(EFFORTS)}")
    return {"type": "disabled"} if effort == "none" else {"type": "adaptive"}


def responses_request_parse(body: Any, *, key: bytes) -> ResponsesRequest:
    """A validated POST /v1/responses body as the internal request (see the table above).
    `key` checks reasoning items' encrypted_content (the server's secret)."""
    if not isinstance(body, dict):
        raise _fail("", "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _fail("model", "Field required (a non-empty string)")
    if len(model) > 300:
        raise _fail("model", "at most 300 characters")
    for name in STATEFUL:
        if body.get(name) is not None:
            raise _fail(name, "is not supported: this server keeps no responses; send the whole conversation in input")
    if body.get("background"):
        raise _fail("background", "is not supported: this server keeps no responses")
    if "input" not in body:
        raise _fail("input", "Field required")
    toolset = _tools(body.get("tools"))
    tools = toolset.tools
    messages = _items(body["input"], key=key, tools=toolset)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _fail("instructions", "Input should be a valid string")
    max_output = body.get("max_output_tokens")
    if max_output is not None and (not _is_int(max_output) or max_output < 1):
        raise _fail("max_output_tokens", "Input should be a positive integer")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _fail("stream", "Input should be a valid boolean")
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise _fail("include", "Input should be a list of strings")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _fail("metadata", "Input should be an object")
    cache_key = body.get("prompt_cache_key")
    if cache_key is not None and not isinstance(cache_key, str):
        raise _fail("prompt_cache_key", "Input should be a valid string")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _fail("parallel_tool_calls", "Input should be a valid boolean")
    tool_choice = _tool_choice(body.get("tool_choice"), {t["name"] for t in tools})
    if tool_choice is not None and parallel is False:
        tool_choice["disable_parallel_tool_use"] = True
    internal = {
        "model": model,
        "system": [{"type": "text", "text": instructions}] if instructions else [],
        "messages": messages,
        "tools": tools,
        "tool_choice": tool_choice,
        "thinking": _thinking(body.get("reasoning")),
        # Replaced by the route's max_output when absent (the route is not known here).
        "max_tokens": max_output,
        "stop_sequences": [],
        "stream": bool(stream),
        "temperature": _number(body, "temperature", 0.0, 2.0),
        "top_p": _number(body, "top_p", 0.0, 1.0),
        "top_k": None,
        "metadata": metadata or {},
    }
    echo = {
        "instructions": instructions,
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": True if parallel is None else parallel,
        "reasoning": body.get("reasoning") if isinstance(body.get("reasoning"), dict) else None,
        "store": body.get("store") if isinstance(body.get("store"), bool) else False,
        "temperature": internal["temperature"],
        "top_p": internal["top_p"],
        "metadata": metadata or {},
        "text": body.get("text") if isinstance(body.get("text"), dict) else {"format": {"type": "text"}},
    }
    return ResponsesRequest(
        internal=internal,
        custom_tools=frozenset(toolset.custom),
        namespaced=dict(toolset.namespaced),
        include_encrypted=ENCRYPTED_INCLUDE in include,
        max_output_tokens=max_output,
        prompt_cache_key=cache_key or "",
        echo=echo,
    )
