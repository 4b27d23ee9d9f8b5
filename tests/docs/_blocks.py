"""Fenced code blocks of the Markdown docs, and the offline world they run in.

Conventions for README.md and docs/*.md:

* every block fenced with the info string ``python`` runs, in order, one namespace per file
  (a later block may use what an earlier one defined), in an empty working directory;
* ``python no-run`` marks a block that cannot run here (keep them rare); it must still
  compile;
* names a block uses without defining them come from :data:`PLACEHOLDERS` below: small
  tool functions and models that stand for the user's own;
* models answer offline: every built-in provider (anthropic, openai, google, ollama) is a
  scripted model that answers text, or a valid instance of the requested output schema;
* server addresses stand for the user's own servers and are replaced by the test's:
  ``postgresql://...`` by the test PostgreSQL server, ``http://localhost:8000/v1`` (an
  OpenAI-compatible server) by a loopback server speaking the OpenAI wire format.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

__all__ = ["Block", "blocks", "doc_files", "fake_instance"]

ROOT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.S | re.M)


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its info string and its code."""

    path: Path
    line: int
    info: str
    code: str

    @property
    def runs(self) -> bool:
        return self.info == "python"

    @property
    def is_python(self) -> bool:
        return self.info.split()[:1] == ["python"]

    @property
    def where(self) -> str:
        shown = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{shown}:{self.line}"


def doc_files() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    text = path.read_text(encoding="utf-8")
    return [
        Block(path, text.count("\n", 0, m.start()) + 2, m["info"].strip(), m["code"])
        for m in _FENCE.finditer(text)
    ]


def fake_instance(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> Any:
    """A small value that validates against a pydantic JSON schema."""
    defs = defs if defs is not None else schema.get("$defs", {})
    if "$ref" in schema:
        return fake_instance(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for union in ("anyOf", "oneOf", "allOf"):
        if union in schema:
            return fake_instance(schema[union][0], defs)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        props = schema.get("properties", {})
        return {name: fake_instance(props[name], defs) for name in schema.get("required", [])}
    if kind == "array":
        return [fake_instance(schema.get("items", {}), defs)] * schema.get("minItems", 0)
    if kind == "integer":
        return max(int(schema.get("minimum", 1)), int(schema.get("exclusiveMinimum", 0)) + 1)
    if kind == "number":
        return float(schema.get("minimum", 1.0))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return "x" * max(1, int(schema.get("minLength", 1)))
