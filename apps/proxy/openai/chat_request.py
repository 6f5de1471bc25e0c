"""POST /v1/chat/completions requests -> the internal (Anthropic Messages shaped) request.

OpenAI's messages become Anthropic turns, then schema.messages_request_parse normalizes and
validates them as for /v1/messages, so both protocols render through the same adapters,
fitting and capture. Errors name the OpenAI path of the bad value (``messages.2.tool_calls.0
.function.arguments: ...``) with OpenAI's ``param``.

| field                                   | handling |
|-----------------------------------------|----------|
| model                                   | act: resolved to a route as on /v1/messages |
| messages: system, developer             | act: the first (before any other) is the system prompt, later ones stay in place as system turns; string or text parts |
| messages: user                          | act: string or parts: text; image_url (data: URL or http(s) URL) -> an image block (text-only families render a note); other parts -> 400 |
| messages: assistant                     | act: content (string, text/refusal parts or null), tool_calls (arguments: a JSON object as a string, else 400), reasoning_content (or reasoning) -> a thinking block first |
| messages: tool                          | act: a tool_result for tool_call_id; consecutive tool messages (and a user message after them) form one user turn |
| messages: function (legacy)             | 400 |
| messages[].name                         | ignore |
| tools                                   | act: type "function" only; function.parameters (default an empty object schema) is the input schema; strict is accepted (not enforced) |
| tool_choice                             | record + passed to the adapter: none, auto, required (Anthropic "any"), {type: function, function: {name}}; not enforced by constrained decoding |
| parallel_tool_calls                     | ignore (accepted) |
| max_completion_tokens, max_tokens       | act: >= 1, clamped to the route's max_output; absent: the route's max_output |
| stop (string or list)                   | act: as stop_sequences (finish_reason "stop") |
| temperature (0..2), top_p (0..1), seed, top_k | act: passed to the sampler |
| n                                       | act: only 1 (otherwise 400) |
| stream, stream_options.include_usage    | act |
| response_format                         | act: only {"type": "text"}; json_object and json_schema are 400 (not enforced on open models) |
| reasoning_effort, chat_template_kwargs.enable_thinking | act: "none" or false -> thinking off; another effort or true -> on; absent: the family's default |
| logprobs, top_logprobs, logit_bias, presence_penalty, frequency_penalty, modalities, audio | act: 400 when they ask for something not served (logprobs true, a bias, a non-zero penalty, a non-text modality) |
| metadata, user                          | record (metadata; user as metadata.user) |
| store, service_tier, prediction, prompt_cache_key, safety_identifier, verbosity, web_search_options, other fields | ignore |
"""

from __future__ import annotations

import json
import math
from typing import Any

from apps.proxy import schema
from apps.proxy.errors import InvalidRequest

ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_CHOICES = ("none", "auto", "required")


def _fail(path: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{path}: {message}" if path else message, param=path or None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(name, f"Input should be a number between {low:g} and {high:g}")
    if not (low <= value <= high):
        raise _fail(name, f"Input should be a number between {low:g} and {high:g}")
    return float(value)


def _text_parts(value: Any, path: str, *, allowed: tuple[str, ...] = ("text",)) -> list[dict[str, Any]]:
    """A string or a list of text parts -> Anthropic text blocks."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        raise _fail(path, "Input should be a string or a list of content parts")
    blocks = []
    for i, part in enumerate(value):
        where = f"{path}.{i}"
        if not isinstance(part, dict):
            raise _fail(where, "Input should be an object")
        kind = part.get("type")
        if kind not in allowed:
            raise _fail(f"{where}.type", f"Input should be one of {', '.join(repr(a) for a in allowed)}")
        key = "refusal" if kind == "refusal" else "text"
        if not isinstance(part.get(key), str):
            raise _fail(f"{where}.{key}", "Input should be a valid string")
        blocks.append({"type": "text", "text": part[key]})
    return blocks


def _image(part: dict[str, Any], path: str) -> dict[str, Any]:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url:
        raise _fail(f"{path}.image_url.url", "Field required (a string)")
    if url.startswith("data:"):
        header, sep, data = url[5:].partition(",")
        media_type, _, encoding = header.partition(";")
        if not sep or encoding != "base64" or not media_type.startswith("image/"):
            raise _fail(f"{path}.image_url.url", "a data: URL must be data:image/<type>;base64,<data>")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise _fail(f"{path}.image_url.url", "Input should be a data: or http(s) URL")


def _user_content(value: Any, path: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        raise _fail(path, "Input should be a string or a list of content parts")
    blocks = []
    for i, part in enumerate(value):
        where = f"{path}.{i}"
        if isinstance(part, dict) and part.get("type") == "image_url":
            blocks.append(_image(part, where))
        elif isinstance(part, dict) and part.get("type") in ("input_audio", "file"):
            raise _fail(f"{where}.type", f"{part['type']} content is not supported by this model")
        else:
            blocks.extend(_text_parts([part], path)[:1] if not isinstance(part, dict) else _text_parts([part], where))
    return blocks


def _arguments(value: Any, path: str) -> dict[str, Any]:
    if isinstance(value, dict):  # some clients send the object itself; accepted as sent
        return value
    if not isinstance(value, str):
        raise _fail(path, "Input should be a JSON object as a string")
    if not value.strip():
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise _fail(path, f"is not valid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(parsed, dict):
        raise _fail(path, "should be a JSON object")
    return parsed


def _assistant(message: dict[str, Any], path: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning = message.get("reasoning")  # vLLM's newer name for the same field
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise _fail(f"{path}.reasoning_content", "Input should be a valid string")
        if reasoning:
            blocks.append({"type": "thinking", "thinking": reasoning})
    content = message.get("content")
    if content is not None:
        blocks.extend(
            b for b in _text_parts(content, f"{path}.content", allowed=("text", "refusal")) if b["text"] or not blocks
        )
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise _fail(f"{path}.tool_calls", "Input should be a valid list")
        for i, call in enumerate(calls):
            where = f"{path}.tool_calls.{i}"
            if not isinstance(call, dict):
                raise _fail(where, "Input should be an object")
            if call.get("type", "function") != "function":
                raise _fail(f"{where}.type", "Input should be 'function'")
            function = call.get("function")
            if not isinstance(function, dict):
                raise _fail(f"{where}.function", "Field required (an object)")
            if not isinstance(call.get("id"), str) or not call["id"]:
                raise _fail(f"{where}.id", "Field required (a non-empty string)")
            if not isinstance(function.get("name"), str) or not function["name"]:
                raise _fail(f"{where}.function.name", "Field required (a non-empty string)")
            arguments = _arguments(function.get("arguments", "{}"), f"{where}.function.arguments")
            blocks.append({"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments})
    # An empty text beside other blocks renders nothing; alone it is the empty turn it was.
    return [b for b in blocks if not (b["type"] == "text" and not b["text"] and len(blocks) > 1)]


def _tool_result(message: dict[str, Any], path: str) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise _fail(f"{path}.tool_call_id", "Field required (a non-empty string)")
    content = message.get("content")
    if content is None:
        content = ""
    text: str | list[dict[str, Any]] = content if isinstance(content, str) else _text_parts(content, f"{path}.content")
    return {"type": "tool_result", "tool_use_id": call_id, "content": text}


def _conversation(value: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """OpenAI messages -> (system blocks, Anthropic messages)."""
    if not isinstance(value, list) or not value:
        raise _fail("messages", "Input should be a non-empty list")
    if len(value) > schema.MAX_MESSAGES:
        raise _fail("messages", f"at most {schema.MAX_MESSAGES} messages")
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(value):
        path = f"messages.{i}"
        if not isinstance(message, dict):
            raise _fail(path, "Input should be an object")
        role = message.get("role")
        if role == "function":
            raise _fail(f"{path}.role", "function messages are not supported; use tool messages")
        if role not in ROLES:
            raise _fail(f"{path}.role", f"Input should be one of {', '.join(repr(r) for r in ROLES)}")
        if role in ("system", "developer"):
            blocks = _text_parts(message.get("content"), f"{path}.content")
            if not turns and not system:
                system = blocks
            else:
                turns.append({"role": "system", "content": blocks})
        elif role == "user":
            if "content" not in message:
                raise _fail(f"{path}.content", "Field required")
            turns.append({"role": "user", "content": _user_content(message["content"], f"{path}.content")})
        elif role == "assistant":
            turns.append({"role": "assistant", "content": _assistant(message, path)})
        else:
            turns.append({"role": "user", "content": [_tool_result(message, path)]})
    return system, turns


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail("tools", "Input should be a valid list")
    tools = []
    for i, tool in enumerate(value):
        path = f"tools.{i}"
        if not isinstance(tool, dict):
            raise _fail(path, "Input should be an object")
        if tool.get("type") != "function":
            raise _fail(f"{path}.type", "Input should be 'function'")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise _fail(f"{path}.function", "Field required (an object)")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(f"{path}.function.name", "Field required (a non-empty string)")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise _fail(f"{path}.function.parameters", "Input should be an object")
        if "strict" in function and not isinstance(function["strict"], (bool, type(None))):
            raise _fail(f"{path}.function.strict", "Input should be a boolean")
        spec: dict[str, Any] = {"name": name}
        if function.get("description") is not None:
            spec["description"] = function["description"]
        spec["input_schema"] = parameters
        tools.append(spec)
    return tools


def _tool_choice(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if value in TOOL_CHOICES:
        return {"type": "any" if value == "required" else value}
    if isinstance(value, dict) and value.get("type") == "function":
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise _fail("tool_choice.function.name", "Field required (a non-empty string)")
        return {"type": "tool", "name": name}
    raise _fail("tool_choice", "Input should be 'none', 'auto', 'required' or {type: 'function', function: {name}}")


def _max_tokens(body: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value) or value < 1:
            raise _fail(name, "Input should be an integer >= 1")
        return int(value)
    return None


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _fail("stop", "Input should be a string or a list of strings")
    return [s for s in stops if s]


def _thinking(body: dict[str, Any]) -> dict[str, Any] | None:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise _fail("chat_template_kwargs", "Input should be an object")
    enable = (kwargs or {}).get("enable_thinking", (kwargs or {}).get("thinking"))
    if enable is not None:
        if not isinstance(enable, bool):
            raise _fail("chat_template_kwargs.enable_thinking", "Input should be a boolean")
        return {"type": "adaptive" if enable else "disabled"}
    effort = body.get("reasoning_effort")
    if effort is None:
        return None
    if not isinstance(effort, str):
        raise _fail("reasoning_effort", "Input should be a string")
    return {"type": "disabled" if effort == "none" else "adaptive"}


def _refuse_unserved(body: dict[str, Any]) -> None:
    """Options that would change what is sampled or returned and are not served: a clear 400
    rather than a silently different answer."""
    n = body.get("n")
    if n is not None and n != 1:
        raise _fail("n", "only n=1 is supported")
    response_format = body.get("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or response_format.get("type") != "text"):
        raise _fail("response_format", "only {'type': 'text'} is supported (structured outputs are not enforced)")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") not in (None, 0):
        raise _fail("logprobs", "logprobs are not returned by this endpoint")
    if body.get("logit_bias"):
        raise _fail("logit_bias", "logit_bias is not supported")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise _fail(name, f"{name} is not supported")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise _fail("modalities", "only ['text'] is supported")
    if body.get("audio") is not None:
        raise _fail("audio", "audio output is not supported")


def chat_request_parse(body: Any) -> dict[str, Any]:
    """A validated POST /v1/chat/completions body as the internal request (see the table),
    with `include_usage` for the stream writer."""
    if not isinstance(body, dict):
        raise _fail("", "the request body must be a JSON object")
    if "messages" not in body:
        raise _fail("messages", "Field required")
    _refuse_unserved(body)
    system, turns = _conversation(body["messages"])
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise _fail("seed", "Input should be an integer")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _fail("stream", "Input should be a valid boolean")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _fail("stream_options", "Input should be an object")
    include_usage = (options or {}).get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise _fail("stream_options.include_usage", "Input should be a valid boolean")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _fail("metadata", "Input should be an object")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise _fail("user", "Input should be a valid string")
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < -1):
        raise _fail("top_k", "Input should be an integer")
    # The Messages validation normalizes the translated turns (merging consecutive turns of a
    # role, checking tools against tool_choice) exactly as for /v1/messages.
    request = schema.messages_request_parse(
        {
            "model": body.get("model"),
            "system": system,
            "messages": turns,
            "tools": _tools(body.get("tools")),
            "tool_choice": _tool_choice(body.get("tool_choice")),
            "thinking": None,
            "max_tokens": 0,
            "stop_sequences": _stop(body.get("stop"))[: schema.MAX_STOP_SEQUENCES + 1],
            "stream": bool(stream),
        }
    )
    request.update(
        {
            "thinking": _thinking(body),
            "max_tokens": _max_tokens(body),
            "temperature": _number(body, "temperature", 0.0, 2.0),
            "top_p": _number(body, "top_p", 0.0, 1.0),
            "top_k": top_k if top_k and top_k > 0 else None,
            "seed": seed,
            "metadata": {**(metadata or {}), **({"user": user} if user else {})},
            "include_usage": include_usage,
        }
    )
    return request
