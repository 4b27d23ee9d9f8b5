"""`stepstone demo`: where the stories' files go, and how to look at them afterwards."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from stepstone.demos._etl import run_etl_demo
from stepstone.demos._lunar import run_lunar_demo
from stepstone.exceptions import UserError

__all__ = ["command_name", "run_demo"]


def command_name() -> str:
    """How the user can type this command: ``stepstone`` when it is on PATH, else a path
    (``make demo`` runs it from a virtualenv that is not activated)."""
    running = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    found = shutil.which("stepstone")
    if running is not None and running.name == "stepstone":
        if found is not None and Path(found).resolve() == running:
            return "stepstone"
        return str(running)
    if found is not None:
        return "stepstone"
    return f"{sys.executable} -m stepstone.cli"


def run_demo(console: Console, db: Path | None) -> None:
    """Run both stories; with ``db`` the files are kept, else a temp dir is removed."""
    if db is not None:
        if db.is_dir():
            raise UserError(f"--db {db} is a directory; pass a file path such as {db}/demo.sqlite")
        if not db.parent.exists():
            raise UserError(f"directory {db.parent} does not exist; create it or pick another")
        _narrate(console, db, db.parent)
        cmd = command_name()
        console.print(
            f"\n  inspect it yourself: [bold]{cmd} inspect --db {db} etl-2026-04-30[/]"
            f"\n                       [bold]{cmd} runs --db {db}[/]"
        )
        if cmd.endswith("/stepstone"):
            console.print(
                "  (stepstone is not on your PATH: activate its virtualenv first, for example "
                f"[bold]. {Path(cmd).parent.parent}/bin/activate[/], then type "
                "[bold]stepstone[/])"
            )
        return
    with tempfile.TemporaryDirectory(prefix="stepstone-demo-") as tmp:
        _narrate(console, Path(tmp) / "pipeline.sqlite", Path(tmp))
    console.print(
        "\n  the stores lived in a temporary directory, now removed; keep them with "
        f"[bold]{command_name()} demo --db demo.sqlite[/] and inspect them afterwards"
    )
    if command_name().endswith("/stepstone"):
        console.print(
            "  (stepstone is not on your PATH: activate its virtualenv first, for example "
            f"[bold]. {Path(command_name()).parent.parent}/bin/activate[/])"
        )


def _narrate(console: Console, path: Path, workdir: Path) -> None:
    console.print(f"[bold]stepstone demo[/] — store: {path} (no API key needed)\n")
    run_etl_demo(console, path)
    run_lunar_demo(console, workdir)
