"""Strict-mode JSON schemas: the shape OpenAI's ``strict: true`` structured output accepts."""

from __future__ import annotations

import copy
import json
from typing import Any

__all__ = ["object_root", "strict_schema", "unwrap_result"]

#: The property a non-object output is wrapped in where an API wants an object at the root.
RESULT_KEY = "result"


def object_root(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``schema`` with an object at its root (other schemas wrapped as ``result``), and
    whether it was wrapped."""
    if schema.get("type") == "object":
        return schema, False
    wrapped: dict[str, Any] = {
        "type": "object",
        "properties": {RESULT_KEY: {k: v for k, v in schema.items() if k != "$defs"}},
        "required": [RESULT_KEY],
    }
    if "$defs" in schema:
        wrapped["$defs"] = schema["$defs"]
    return wrapped, True


def unwrap_result(text: str) -> str:
    """The JSON of ``result`` in a wrapped answer; other text is returned as it is (the
    engine reports what is wrong with it to the model)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, dict) and set(value) == {RESULT_KEY}:
        return json.dumps(value[RESULT_KEY])
    return text


def _objects_closed(schema: Any) -> bool:
    """True when every object schema inside lists its properties and allows no others."""
    if isinstance(schema, list):
        return all(_objects_closed(s) for s in schema)
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object" and schema.get("additionalProperties") is not False:
        return False
    return all(_objects_closed(v) for v in schema.values() if isinstance(v, dict | list))


def strict_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """``schema`` transformed for strict mode (every property required, no extra keys), or
    None when it cannot be (free-form dicts): the caller then sends it non-strict."""
    try:
        from openai.lib._pydantic import _ensure_strict_json_schema
    except ImportError:  # pragma: no cover - the openai extra ships it
        return None
    root = copy.deepcopy(schema)
    if root.get("type") != "object":
        return None  # strict mode wants an object at the root
    try:
        out: dict[str, Any] = _ensure_strict_json_schema(root, path=(), root=root)
    except (TypeError, ValueError):
        return None
    return out if _objects_closed(out) else None
