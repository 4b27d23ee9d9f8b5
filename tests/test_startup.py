"""Starting stepstone loads only what the program or the command uses (guarantee 645).

Each check starts a fresh interpreter and reads its ``sys.modules``: a module made to load on
first use that comes back into a start-up import fails here, without timing anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import typer.main

from stepstone import Store
from stepstone.cli import app

#: What no program pays for just by importing stepstone.
NOT_ON_IMPORT = (
    "pydantic",
    "psutil",
    "typer",
    "rich",
    "stepstone.durable._kernel",
    "stepstone.engines._protocol",
    "stepstone.core._tool",
    "stepstone.core._run_context",
    "stepstone.engines.plan",
    "stepstone.engines.graph",
    "stepstone.engines.llm",
    "stepstone.engines.workflow",
    "stepstone.runner",
    "stepstone.agent",
    "stepstone.worker",
)

#: The modules of the commands other than ``runs`` (and what they load).
OTHER_COMMANDS = (
    "stepstone.cli._ops",
    "stepstone.cli._migrate",
    "stepstone.cli._serve",
    "stepstone.cli._check",
    "stepstone.cli._messages",
    "stepstone.cli._settle",
    "stepstone.cli._requeue",
    "stepstone.cli._ui",
    "stepstone.cli._worker",
    "stepstone.server",
    "stepstone.engines.plan",
    "stepstone.engines.graph",
    "stepstone.engines.llm",
    "stepstone.runner",
    "stepstone.demos",
)


def _loaded(code: str) -> dict[str, list[str]]:
    """Run ``code`` in a fresh interpreter; it fills ``seen[stage]`` with sys.modules."""
    script = "import json, sys\nseen = {}\n" + textwrap.dedent(code)
    script += "\nprint(json.dumps(seen))\n"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    result: dict[str, list[str]] = json.loads(out.stdout.splitlines()[-1])
    return result


def _present(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in modules)]


def test_import_stepstone_loads_no_engine_kernel_pydantic_or_psutil() -> None:
    # guarantee 645
    seen = _loaded(
        """
        import stepstone
        seen["import"] = sorted(sys.modules)
        from stepstone import workflow, step
        seen["workflow"] = sorted(sys.modules)
        """
    )
    assert _present(seen["import"], NOT_ON_IMPORT) == []
    # a durable function needs the kernel and its engine, not pydantic or the other engines
    assert "stepstone.engines.workflow" in seen["workflow"]
    others = ("pydantic", "stepstone.engines.plan", "stepstone.engines.graph", "stepstone.runner")
    assert _present(seen["workflow"], others) == []


def test_the_cli_loads_only_the_command_that_runs(tmp_path: Path) -> None:
    # guarantee 645
    db = tmp_path / "s.sqlite"
    with Store(db=db) as store:
        store.setup()
    seen = _loaded(
        f"""
        import stepstone.cli
        seen["import"] = sorted(sys.modules)
        sys.argv = ["stepstone", "runs", "--db", {str(db)!r}]
        try:
            stepstone.cli.main()
        except SystemExit as exc:
            assert not exc.code, exc.code
        seen["runs"] = sorted(sys.modules)
        """
    )
    assert _present(seen["import"], ("stepstone.cli._basic", *OTHER_COMMANDS)) == []
    assert "stepstone.cli._basic" in seen["runs"]  # the command did run
    assert _present(seen["runs"], OTHER_COMMANDS) == []


def test_serve_loads_the_runner_and_workflows_only_for_a_request() -> None:
    # guarantee 645
    seen = _loaded(
        """
        import stepstone.cli._serve, stepstone.server
        seen["serve"] = sorted(sys.modules)
        """
    )
    later = ("stepstone.runner", "stepstone.engines.workflow", "stepstone.agent")
    assert _present(seen["serve"], later) == []


def _model_values(pydantic_first: bool) -> dict[str, list[str]]:
    """A model's typed JSON, its decoding and its input hash, in a fresh interpreter."""
    return _loaded(
        f"""
        if {pydantic_first!r}:
            import pydantic
        from stepstone.core._serialization import from_typed_json, to_typed_json
        from stepstone.durable._hashing import hash_json
        seen["before"] = sorted(sys.modules)
        import pydantic

        class Point(pydantic.BaseModel):
            x: int
            name: str

        class Bag(pydantic.BaseModel):
            items: set[str]

        sys.modules["__main__"].Point = Point
        point = Point(x=3, name="p")
        data = to_typed_json(point)
        digest = hash_json(Bag(items={{"a", "b"}}))
        seen["values"] = [
            json.dumps(data, sort_keys=True),
            str(from_typed_json(data) == point),
            f"{{digest}} v{{digest.version}} unstable={{digest.unstable}}",
        ]
        """
    )


def test_a_model_is_encoded_decoded_and_hashed_alike_when_pydantic_loads_later() -> None:
    # guarantee 645: stepstone tells models apart once pydantic is loaded, without loading it
    later, first = _model_values(pydantic_first=False), _model_values(pydantic_first=True)
    assert "pydantic" not in later["before"]
    assert later["values"] == first["values"]
    assert '"$stepstone": "model"' in later["values"][0]
    assert later["values"][1] == "True"
    assert later["values"][2].endswith("v2 unstable=True")  # a model holding a set


def test_an_app_builds_each_command_once_per_process() -> None:
    # guarantee 645: typer builds the group again on each call; the commands are kept
    first = typer.main.get_command(app)
    second = typer.main.get_command(app)
    assert first is not second
    assert first.commands["history"] is second.commands["history"]  # type: ignore[attr-defined]
