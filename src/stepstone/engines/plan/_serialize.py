"""A Plan's topology as JSON-ready data, and back (``Plan.to_dict`` / ``Plan.from_dict``).

Callables, Agents, route predicates and sources are saved by name and rebound from a
registry; sentinels, writes, parallel flags, routing, types and order are kept.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Mapping, Sequence
from typing import Any

from stepstone.core import AgentLike, Sentinel
from stepstone.engines.plan._step import Step, target_name
from stepstone.exceptions import PlanCompileError

__all__ = ["FORMAT_VERSION", "steps_from_dict", "steps_to_dict"]

#: The version ``to_dict`` writes and ``from_dict`` reads.
FORMAT_VERSION = 1


def steps_to_dict(steps: Sequence[Step], max_iterations: int) -> dict[str, Any]:
    """The data ``Plan.to_dict`` returns."""
    return {
        "version": FORMAT_VERSION,
        "max_iterations": max_iterations,
        "steps": [_step_to_dict(s) for s in steps],
    }


def steps_from_dict(
    data: Mapping[str, Any], registry: Mapping[str, Any] | None
) -> tuple[list[Step], int]:
    """The steps and ``max_iterations`` of ``Plan.to_dict`` output, names rebound."""
    if not isinstance(data, Mapping) or not isinstance(data.get("steps", []), list):
        raise PlanCompileError(
            f"Plan.from_dict takes what Plan.to_dict returns (a dict with a 'steps' list), "
            f"got {data!r:.200}"
        )
    version = data.get("version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise ValueError(
            f"Plan.from_dict: unsupported version {version!r} (expected {FORMAT_VERSION})"
        )
    reg = dict(registry or {})
    steps = []
    for i, item in enumerate(data.get("steps", [])):
        target: Any = item.get("target") if isinstance(item, Mapping) else None
        try:
            if "name" not in item or not {"tool", "agent", "callable"} & set(target):
                raise TypeError("it needs a 'name' and a 'target' naming a tool or callable")
            steps.append(_step_from_dict(item, reg))
        except (TypeError, AttributeError) as exc:  # not the shape to_dict writes
            raise PlanCompileError(
                f"Plan.from_dict: steps[{i}] is not a step as Plan.to_dict writes it "
                f"({exc}): {item!r:.200}"
            ) from exc
    return steps, data.get("max_iterations", 100)


def _spec_to_json(spec: Any) -> Any:
    if isinstance(spec, Sentinel):
        return spec.to_dict()
    if isinstance(spec, list):
        return [_spec_to_json(s) for s in spec]
    return spec


def _spec_from_json(data: Any) -> Any:
    if isinstance(data, dict):
        return Sentinel.from_dict(data)
    if isinstance(data, list):
        return [_spec_from_json(d) for d in data]
    return data


def _type_to_json(tp: Any) -> str | None:
    if tp is Any:
        return None
    return f"{getattr(tp, '__module__', '?')}:{getattr(tp, '__qualname__', repr(tp))}"


def _type_from_json(name: str | None, registry: Mapping[str, Any], default: Any) -> Any:
    if name is None:
        return default
    qualname = name.partition(":")[2]
    for candidate in (qualname, qualname.rsplit(".", 1)[-1], name):
        if candidate in registry:
            return registry[candidate]
    try:
        return pkgutil.resolve_name(name)  # "module:Qual.Name"
    except (ImportError, AttributeError, ValueError):
        raise KeyError(
            f"Plan.from_dict: type {name!r} cannot be imported; pass it in registry="
            f"{{{qualname.rsplit('.', 1)[-1]!r}: ...}}"
        ) from None


def _step_to_dict(step: Step) -> dict[str, Any]:
    t = step.target
    if isinstance(t, str):
        target = {"tool": t}
    elif isinstance(t, AgentLike):
        target = {"agent": str(t.name)}
    else:
        target = {"callable": target_name(t) or step.step_name}
    out: dict[str, Any] = {
        "name": step.step_name,
        "target": target,
        "task": _spec_to_json(step.task),
        "context": _spec_to_json(step.context),
        "writes": step.writes,
        "parallel": step.parallel,
        "input": _type_to_json(step.input),
        "output": _type_to_json(step.output),
        "routes": None,
        "routes_by": step.routes_by,
        "after_branches": step.after_branches,
        "sources": [getattr(s, "name", None) or type(s).__name__ for s in step.sources],
    }
    if step.routes is not None:
        out["routes"] = {k: target_name(p) or repr(p) for k, p in step.routes.items()}
    return out


def _lookup(registry: Mapping[str, Any], name: str, what: str, step: str) -> Any:
    if name not in registry:
        raise KeyError(
            f"Plan.from_dict: {what} {name!r} of step {step!r} is not in the registry; pass "
            f"registry={{{name!r}: ...}}"
        )
    return registry[name]


def _step_from_dict(data: Mapping[str, Any], registry: Mapping[str, Any]) -> Step:
    name = str(data["name"])
    target_spec = data["target"]
    if "tool" in target_spec:
        target: Any = target_spec["tool"]
    else:
        kind = "agent" if "agent" in target_spec else "callable"
        target = _lookup(registry, target_spec[kind], f"{kind} target", name)
    routes = data.get("routes")
    return Step(
        target,
        task=_spec_from_json(data.get("task", {"sentinel": "prev", "name": None})),
        context=_spec_from_json(data.get("context")),
        sources=[_lookup(registry, s, "source", name) for s in data.get("sources") or []],
        writes=data.get("writes"),
        input=_type_from_json(data.get("input"), registry, Any),
        output=_type_from_json(data.get("output"), registry, str),
        parallel=bool(data.get("parallel", False)),
        name=name,
        routes=(
            {k: _lookup(registry, p, "route predicate", name) for k, p in routes.items()}
            if routes
            else None
        ),
        routes_by=data.get("routes_by"),
        after_branches=data.get("after_branches"),
    )
