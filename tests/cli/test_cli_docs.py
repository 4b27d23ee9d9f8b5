"""docs/cli.md lists every command of ``stepstone`` (guarantee 436)."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from stepstone.cli import app

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _commands() -> set[str]:
    group = typer.main.get_command(app)
    commands = getattr(group, "commands", {})
    return {name for name, command in commands.items() if not command.hidden}


def _listed() -> set[str]:
    """The commands of the table of every command: its rows' first cells, each a link to the
    command's own section, which must exist too."""
    text = DOC.read_text()
    rows = re.findall(r"^\| \[`([a-z][a-z-]*)`\]\(#stepstone-([a-z-]*)\) \|", text, re.M)
    for name, anchor in rows:
        assert anchor == name, f"docs/cli.md: the row of {name!r} links to #stepstone-{anchor}"
        assert f"\n## `stepstone {name}`\n" in text, f"docs/cli.md has no section for {name!r}"
    return {name for name, _ in rows}


def test_docs_cli_lists_every_command() -> None:
    commands = _commands()
    assert {"runs", "show", "history", "requeue", "worker"} <= commands  # the app was read
    missing = sorted(commands - _listed())
    assert not missing, f"docs/cli.md lists no row `stepstone NAME` for {missing}"
    unknown = sorted(_listed() - commands)
    assert not unknown, f"docs/cli.md lists commands stepstone has not: {unknown}"
