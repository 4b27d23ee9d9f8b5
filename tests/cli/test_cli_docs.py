"""docs/cli.md lists every command of ``stepstone`` and its options, and its opening example
runs (guarantees 409, 436)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer.main

from stepstone.cli import app
from tests.docs._one_interpreter import run_steps

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


def _sections() -> dict[str, str]:
    """Each command's section of docs/cli.md, by command name."""
    text = DOC.read_text()
    return {
        m[1]: m[2]
        for m in re.finditer(r"\n## `stepstone ([a-z-]+)`\n(.*?)(?=\n## |\Z)", text, re.S)
    }


def _subcommands(command: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            yield (*path, name), sub
            yield from _subcommands(sub, (*path, name))


def test_each_commands_section_names_every_option_it_takes() -> None:
    # guarantee 409: before, `stepstone serve --lease-seconds` was in --help only
    sections = _sections()
    shared = {"--json", "--debug", "--help"}  # the table of options every command shares
    missing = []
    for path, command in _subcommands(typer.main.get_command(app), ()):
        section = sections[path[0]]
        if len(path) > 1 and path[-1] not in section:
            missing.append(" ".join(path))
        for param in command.params:
            names = [o for o in param.opts if o.startswith("--")]
            if names and not shared & set(names) and not any(n in section for n in names):
                missing.append(f"{' '.join(path)} {names[0]}")
    assert not missing, f"docs/cli.md does not describe: {missing}"


def opening_lines() -> list[str]:
    """The command lines of the shell block the page opens with, comments cut off."""
    opening = re.search(r"```sh\n(.*?)```", DOC.read_text(), re.S)
    assert opening is not None
    return [line.split("  #")[0].strip() for line in opening[1].splitlines()]


def test_the_opening_example_runs(tmp_path: Path) -> None:
    # guarantee 409: the commands the page opens with run, in order, and succeed (one
    # interpreter runs them all, each as the `stepstone` command runs it)
    lines = opening_lines()
    assert 10 <= len(lines) <= 25 and all(line.startswith("stepstone ") for line in lines)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["COLUMNS"] = "200"
    ran = run_steps(lines, cwd=tmp_path, env=env)
    assert [done.line for done in ran] == lines
    for done in ran:
        assert done.status == 0, f"{done.line}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        assert done.stdout.strip(), done.line
