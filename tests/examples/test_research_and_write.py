"""examples/research_and_write.py runs offline: two LLM agents in a durable Plan."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from stepstone import Agent, Store
from stepstone.testing import FakeModel
from tests.examples._run import EXAMPLES, run_example

EXAMPLE = EXAMPLES / "research_and_write.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("research_and_write", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runs_offline_as_a_script(tmp_path: Path) -> None:
    proc = run_example("research_and_write.py", "--offline", tmp_path=tmp_path, timeout=120)
    out = proc.stdout.splitlines()
    assert out[0] == "mode: offline (scripted models)"
    assert out[1].startswith("research: 3 facts, angle: Failures are normal")
    assert out[3].startswith("  Failures are normal in LLM pipelines")
    assert out[-1] == "store keys: ['draft', 'research']"


async def test_writer_sees_the_research_and_steps_are_durable(tmp_path: Path) -> None:
    example = load_example()
    researcher, writer = example.build_agents(None)
    store = Store(db=str(tmp_path / "r.sqlite"))
    env = await Agent(engine=example.build_plan(store, researcher, writer)).run(example.TOPIC)
    assert env.ok, env.error
    research_model = researcher.engine.get_provider()
    writer_model = writer.engine.get_provider()
    assert isinstance(research_model, FakeModel) and isinstance(writer_model, FakeModel)
    # the researcher used its tool twice, then answered with validated notes
    assert len(research_model.requests) == 3
    assert research_model.requests[2].messages[-1].tool_results[0].name == "search_notes"
    notes = store.read("research")
    assert notes["angle"].startswith("Failures are normal")
    # the writer got the notes as context
    system = writer_model.requests[0].system or ""
    assert "commits each step before the next starts" in system
    assert store.read("draft") == env.payload
    # a second run with the same checkpoint key finds the finished run and calls no model
    researcher2, writer2 = example.build_agents(None)
    again = await Agent(engine=example.build_plan(store, researcher2, writer2)).run(example.TOPIC)
    assert researcher2.engine.get_provider().requests == []
    assert again.ok
    store.close()
