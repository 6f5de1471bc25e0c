"""The adapters' memo of rendered tool lists: one rendering per exact value."""

from __future__ import annotations

import json
from typing import Any

from apps.proxy.adapters.render_cache import rendered_by_value


def test_a_tool_list_is_rendered_once_per_exact_value() -> None:
    rendered: list[Any] = []

    @rendered_by_value
    def render(tools: list[Any], *, footer: str = "") -> str:
        rendered.append(tools)
        return json.dumps(tools, ensure_ascii=False) + footer

    # Values Python's json writes differently, some of which compare equal in Python
    # (1 == 1.0 == True, 0.0 == -0.0, dicts whatever their key order).
    values: list[Any] = [
        [{"a": 1}],
        [{"a": 1.0}],
        [{"a": True}],
        [{"a": 0.0}],
        [{"a": -0.0}],
        [{"a": 1, "b": 2}],
        [{"b": 2, "a": 1}],
        [{"a": 0.1 + 0.2}],
        [{"a": 0.3}],
        [{"a": "é"}],
        [{"a": "e\u0301"}],
        [{"a": None}],
        [{"a": [1, 2]}],
        [{"a": {"1": 2}}],
    ]
    for _ in range(2):
        for value in values:
            assert render(value) == json.dumps(value, ensure_ascii=False)
    assert len(rendered) == len(values)
    assert render(values[0], footer="!") == '[{"a": 1}]!'  # the options are part of the key
    assert len(rendered) == len(values) + 1

    # A value orjson cannot write is rendered every time, correctly.
    wide = [{"a": 2**70}]
    assert render(wide) == render(wide) == json.dumps(wide)
    assert len(rendered) == len(values) + 3
