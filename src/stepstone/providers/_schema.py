"""Strict-mode JSON schemas: the shape OpenAI's ``strict: true`` structured output accepts."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["strict_schema"]


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
