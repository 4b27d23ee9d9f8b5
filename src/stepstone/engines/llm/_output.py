"""Structured output: the JSON schema sent to the model and validation of its answer."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

__all__ = ["output_schema", "parse_output", "type_adapter", "wants_structured"]

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def wants_structured(output_type: Any) -> bool:
    """True unless the output is plain text (``str``, ``None`` or ``Any``)."""
    return output_type not in (str, None, Any, object)


@functools.lru_cache(maxsize=256)
def type_adapter(output_type: Any) -> TypeAdapter[Any]:
    """The (cached) pydantic adapter of ``output_type``."""
    return TypeAdapter(output_type)


def output_schema(output_type: Any) -> dict[str, Any]:
    """The JSON schema of ``output_type`` (a pydantic model or any type pydantic knows)."""
    if isinstance(output_type, type) and issubclass(output_type, BaseModel):
        return output_type.model_json_schema()
    return type_adapter(output_type).json_schema()


def _extract_json(text: str) -> str:
    m = _FENCE.match(text)
    if m:
        return m.group(1)
    stripped = text.strip()
    if stripped[:1] in "{[" or not stripped:
        return stripped
    # Models sometimes wrap the JSON in prose; take the outermost object.
    start, end = stripped.find("{"), stripped.rfind("}")
    if start != -1 and end > start:
        return stripped[start : end + 1]
    return stripped


def parse_output(text: str, output_type: Any) -> Any:
    """Parse and validate the model's final text as ``output_type``.

    Raises:
        ValueError: the text is not JSON or does not validate (the message says why).
    """
    blob = _extract_json(text)
    try:
        if isinstance(output_type, type) and issubclass(output_type, BaseModel):
            return output_type.model_validate_json(blob)
        return type_adapter(output_type).validate_json(blob)
    except ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())) or '(root)'}: {e.get('msg')}"
            for e in exc.errors()
        )
        raise ValueError(errors or str(exc)) from None
    except json.JSONDecodeError as exc:  # pragma: no cover - pydantic reports JSON errors
        raise ValueError(f"not valid JSON: {exc}") from None
