"""The public surface: grouped, sorted, complete, documented."""

from __future__ import annotations

import ast
import inspect
import types
from pathlib import Path

import stepstone

INIT = Path(stepstone.__file__)


def _all_groups() -> list[list[str]]:
    """__all__ as written: groups separated by comment lines."""
    tree = ast.parse(INIT.read_text())
    node = next(
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "__all__"
    )
    assert isinstance(node.value, ast.List)
    lines = INIT.read_text().splitlines()[node.lineno : node.end_lineno]
    groups: list[list[str]] = []
    for line in lines:
        text = line.strip()
        if text.startswith("#"):
            groups.append([])
        elif text.startswith('"'):
            groups[-1].append(text.strip('",'))
    return [g for g in groups if g]


def test_all_is_grouped_and_sorted_within_groups() -> None:
    for group in _all_groups():
        assert group == sorted(group), f"__all__ group not sorted: {group}"
    flat = [n for g in _all_groups() for n in g]
    assert flat == list(stepstone.__all__)
    assert len(flat) == len(set(flat)), "a name appears twice in __all__"


def test_all_is_complete() -> None:
    # dir() lists the names loaded on first use too; getattr loads each of them
    public = {
        name
        for name in dir(stepstone)
        if not name.startswith("_") and not isinstance(getattr(stepstone, name), types.ModuleType)
    }
    assert public == set(stepstone.__all__)


def test_every_public_name_has_a_docstring() -> None:
    missing = []
    for name in stepstone.__all__:
        obj = getattr(stepstone, name)
        if isinstance(obj, (int, str, dict)) or not (inspect.isclass(obj) or callable(obj)):
            continue
        if not (inspect.getdoc(obj) or "").strip():
            missing.append(name)
    assert not missing, f"public names without a docstring: {missing}"


def test_documented_surface_is_importable() -> None:
    # the names README.md and docs/ show
    for name in (
        "Agent",
        "Plan",
        "Step",
        "Store",
        "Envelope",
        "ErrorInfo",
        "from_prev",
        "from_start",
        "from_step",
        "from_parallel",
        "from_parallel_all",
        "PlanCompileError",
        "PlanRuntimeError",
        "PlanPaused",
        "ConcurrentPlanRunError",
        "ToolTimeoutError",
        "StreamStallError",
        "AgentCheckpointCorruptionError",
        "Session",
        "Tool",
        "tool",
    ):
        assert hasattr(stepstone, name), name


def test_the_durable_function_names_are_public() -> None:
    # guarantee 494: what docs/workflows.md uses comes from `stepstone` itself
    names = {
        "ConcurrentRunError",
        "EffectInDoubtError",
        "NonDeterministicWorkflowError",
        "ReplayedStepError",
        "RunHandle",
        "StepContext",
        "Store",
        "Workflow",
        "deprecate_patch",
        "patched",
        "step",
        "step_context",
        "workflow",
    }
    assert names <= set(stepstone.__all__), sorted(names - set(stepstone.__all__))
