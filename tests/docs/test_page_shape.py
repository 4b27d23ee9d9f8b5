"""The shape a newcomer meets: a short README that points to every guide, and guides that
open with a runnable example before they explain (guarantee 409)."""

from __future__ import annotations

import re

import pytest

from tests.docs._blocks import ROOT, blocks

DOCS = ROOT / "docs"
# Pages that are references rather than guides: the numbered guarantees and the tables of
# measurements (it opens with the command that makes them).
REFERENCES = {"guarantees.md", "performance.md"}
# The guides of the README's "pick your path" table: one row each.
PATHS = {
    "workflows.md",
    "plans.md",
    "agents.md",
    "integrations.md",
    "graph.md",
    "replan.md",
    "workers.md",
    "time-and-messages.md",
    "serve.md",
    "operate.md",
}


def _guides() -> list[str]:
    return sorted(p.name for p in DOCS.glob("*.md") if p.name not in REFERENCES)


@pytest.mark.parametrize("name", _guides())
def test_a_guide_opens_with_a_runnable_example(name: str) -> None:
    # guarantee 409: the title, at most a short paragraph, then an example of 10-25 lines
    # that runs in the docs tests (docs/cli.md's shell lines run in tests/cli)
    path = DOCS / name
    first = blocks(path)[0]
    assert first.line <= 12, f"{name}: the first example starts at line {first.line}"
    runs = first.runs or (name == "cli.md" and first.info == "sh")
    assert runs, f"{name}: the first block ({first.info!r}) is not a runnable example"
    lines = first.code.rstrip("\n").count("\n") + 1
    assert 10 <= lines <= 25, f"{name}: the opening example has {lines} lines"


def test_the_readme_is_short_and_every_page_is_reachable_from_it() -> None:
    # guarantee 409
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    linked = set(re.findall(r"\]\(docs/([a-z-]+\.md)(?:#[^)]*)?\)", text))
    pages = {p.name for p in DOCS.glob("*.md")}
    assert pages <= linked, f"README.md links no {sorted(pages - linked)}"
    table = text.split("## Pick your path", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\|.*\]\(docs/([a-z-]+\.md)\) \|$", table, re.M)
    assert sorted(rows) == sorted(PATHS), "pick your path: one row per guide"
