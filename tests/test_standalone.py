"""The repository stands on its own: nothing in it points at documents it does not hold.

Tests cite guarantees by number (``# guarantee 23``, see docs/guarantees.md); the design is
in ARCHITECTURE.md. A reference to a document outside the repository (a numbered
specification line, a design section, a style habit, a numbered source document) would leave
a reader of the repository with nowhere to look, so this test fails on any of them, in every
text file the repository ships, and in file names too.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Each pattern is a way of pointing outside the repository; the message says what to write.
FORBIDDEN: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\bspecs? ?\d", re.I), "cite the number of docs/guarantees.md: 'guarantee N'"),
    (re.compile(r"SPEC[-_ ]?CHECKLIST", re.I), "cite docs/guarantees.md"),
    (re.compile(r"\bseeds?[ _-]?0\d\d", re.I), "say what the example or behaviour is"),
    (
        re.compile(r"\bseeds?(?:'s)?(?=\s+(shape|example|own|semantics|compatib))", re.I),
        "say what it means in our own words",
    ),
    (re.compile(r"\bseed's\b", re.I), "say what it means in our own words"),
    (re.compile(r"\bthe seeds?\b", re.I), "say what it means in our own words"),
    (re.compile(r"\bseeds?/"), "the source documents are not in the repository"),
    (re.compile(r"\bDESIGN(\.md|\s+(section\s+)?\d|\s+section)"), "point at ARCHITECTURE.md"),
    (re.compile(r"\bSTYLE(\.md|\s+(habit\s+)?\d)"), "say why in a comment"),
]

SUFFIXES = {".py", ".md", ".toml", ".cfg", ".ini", ".txt", ".yml", ".yaml", ".json", ".sql"}
TOP_FILES = {"Makefile", "README.md", "ARCHITECTURE.md", "pyproject.toml"}


def _shipped_files() -> list[Path]:
    """Files git tracks or would add (ignored files such as .venv/ are not ours)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    files = [ROOT / line for line in out.splitlines() if line]
    return [
        p
        for p in files
        if p.is_file()
        and (p.suffix in SUFFIXES or p.name in TOP_FILES)
        and p.name != Path(__file__).name
    ]


def find_references(text: str) -> list[tuple[int, str, str]]:
    """``(line number, matched text, fix)`` for every outside reference in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, fix in FORBIDDEN:
            m = pattern.search(line)
            if m:
                found.append((number, m.group(0), fix))
    return found


@pytest.mark.parametrize(
    ("text", "hit"),
    [
        ("# spec 23", True),
        ("(Spec 116-120)", True),
        ("SPEC-CHECKLIST lines 1-45", True),
        ("the seed 002 walkthrough", True),
        ("seed-000 checkpoint shape", True),
        ("returns the seed's shape", True),
        ("as in the seed", True),
        ("Seed semantics: expected=None means absent", True),
        ("for seed compatibility", True),
        ("see DESIGN section 3", True),
        ('# DESIGN 3 "append"', True),
        ("STYLE 6: records", True),
        ("# guarantee 23", False),
        ('rng = random.Random(int(os.environ.get("CRASH_SEED", seed)))', False),
        ("def test_crash(seed: int) -> None:", False),
        ('final = g.invoke(S(log=["seed"]))', False),
        ("_STATUS_STYLE = {", False),
        ("see ARCHITECTURE.md", False),
    ],
)
def test_the_patterns_catch_outside_references_and_nothing_else(text: str, hit: bool) -> None:
    assert bool(find_references(text)) is hit, text


def test_no_file_refers_to_documents_outside_the_repository() -> None:
    problems = []
    files = _shipped_files()
    assert any(p.name == "guarantees.md" for p in files)  # the walk sees the docs
    for path in files:
        rel = path.relative_to(ROOT)
        for _, hit, fix in find_references(str(rel)):
            problems.append(f"{rel} (file name): {hit!r}: {fix}")
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, hit, fix in find_references(text):
            problems.append(f"{rel}:{number}: {hit!r}: {fix}")
    assert not problems, "references to documents outside the repository:\n" + "\n".join(problems)


def test_every_cited_guarantee_is_written_down() -> None:
    # a test citing "guarantee N" must point at a numbered line of docs/guarantees.md
    doc = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
    written = {int(n) for n in re.findall(r"^(\d+)\. ", doc, re.M)}
    cited: dict[int, str] = {}
    cite = re.compile(r"\bguarantees? (\d+(?:\s*(?:[-,/]|and)\s*\d+)*)", re.I)
    for path in _shipped_files():
        if path.suffix != ".py":
            continue
        for m in cite.finditer(path.read_text(encoding="utf-8", errors="replace")):
            numbers = [int(n) for n in re.findall(r"\d+", m.group(1))]
            if "-" in m.group(1) and len(numbers) == 2:
                numbers = list(range(numbers[0], numbers[1] + 1))
            for n in numbers:
                cited.setdefault(n, str(path.relative_to(ROOT)))
    missing = {n: where for n, where in sorted(cited.items()) if n not in written}
    assert not missing, f"guarantees cited but not in docs/guarantees.md: {missing}"


def test_guarantee_numbers_are_unique_and_1_to_120_are_written() -> None:
    # numbers are stable identities: one line each, never reused
    doc = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
    numbers = [int(n) for n in re.findall(r"^(\d+)\. ", doc, re.M)]
    twice = sorted({n for n in numbers if numbers.count(n) > 1})
    assert not twice, f"guarantee numbers used twice: {twice}"
    missing = sorted(set(range(1, 121)) - set(numbers))
    assert not missing, f"guarantees missing from docs/guarantees.md: {missing}"
