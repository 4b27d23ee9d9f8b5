"""Every relative link of README.md, CHANGELOG.md and docs/*.md reaches a file, and its
#anchor a heading of that file (GitHub's rule: lower case, punctuation dropped, spaces
to hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs._blocks import _FENCE, ROOT, doc_files

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)


def _anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _prose(path: Path) -> str:
    return _FENCE.sub("", path.read_text(encoding="utf-8"))


def _anchors(path: Path) -> set[str]:
    return {_anchor(h) for h in _HEADING.findall(_prose(path))}


def _pages() -> list[Path]:
    return [*doc_files(), ROOT / "CHANGELOG.md"]


def test_the_anchor_rule() -> None:
    assert _anchor("Before a deploy: migrate --dry-run") == "before-a-deploy-migrate---dry-run"
    assert _anchor("`stepstone runs`") == "stepstone-runs"
    assert _anchor("Crash, then resume") == "crash-then-resume"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.name}: {broken}"
