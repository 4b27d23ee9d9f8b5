"""PlanCompiler: every check that can fail before a step runs."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter

from stepstone.core import Sentinel, Tool
from stepstone.core._tool import is_agent_like
from stepstone.engines.plan._step import Step
from stepstone.exceptions import PlanCompileError
from stepstone.store._store import key_problem, shown_key

__all__ = ["CompiledPlan", "Unit", "check_tools", "compile_plan", "literal_values"]


@dataclasses.dataclass(frozen=True, slots=True)
class Unit:
    """What runs at one position: a single step, or a parallel band of steps.

    Attributes:
        index: The position.
        steps: Its step, or the steps of its band.
        entry: The name checkpoints use for this position (a band's first step).
        is_band: True for a parallel band (even a band of one).
    """

    index: int
    steps: tuple[Step, ...]
    # Set once here, read on every step (they were properties).
    entry: str = dataclasses.field(init=False)
    is_band: bool = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entry", self.steps[0].step_name)
        object.__setattr__(self, "is_band", bool(self.steps[0].parallel))


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledPlan:
    """A validated plan: steps grouped into units, names indexed."""

    steps: tuple[Step, ...]
    units: tuple[Unit, ...]
    unit_of: Mapping[str, int]
    step_of: Mapping[str, Step]
    fingerprint: str

    def band_of(self, name: str) -> Unit:
        """The unit containing step ``name``."""
        return self.units[self.unit_of[name]]


@functools.cache
def type_adapter(tp: Any) -> TypeAdapter[Any]:
    """The validator of a step's ``input=`` or ``output=`` type (built once per type)."""
    return TypeAdapter(tp)


def compile_plan(
    steps: tuple[Step, ...],
    *,
    max_iterations: int,
    tools: Mapping[str, Tool] | None = None,
) -> CompiledPlan:
    """Validate ``steps`` and group them into units.

    Args:
        steps: The plan's steps in order.
        max_iterations: Must be >= 1.
        tools: The tool map string targets must resolve against; None skips that check
            (it then happens at run time).

    Raises:
        PlanCompileError: naming the step and the fix, for every invalid plan.
    """
    _check_arguments(steps, max_iterations)
    for step in steps:  # before the fingerprint, which encodes them
        _check_writes(step)
    step_of = _index_steps(steps)
    units, unit_of = _group_units(steps)
    compiled = CompiledPlan(
        steps=tuple(steps),
        units=tuple(units),
        unit_of=unit_of,
        step_of=step_of,
        fingerprint=_fingerprint(steps),
    )
    for step in steps:
        _check_target(step, tools)
        _check_sentinels(step, compiled)
        _check_routing(step, compiled)
        _check_types(step, compiled)
    for unit in units:
        _check_band_writes(unit)
    return compiled


def _check_arguments(steps: tuple[Step, ...], max_iterations: int) -> None:
    if not steps:
        raise PlanCompileError("Plan() needs at least one Step")
    if (
        isinstance(max_iterations, bool)
        or not isinstance(max_iterations, int)
        or max_iterations < 1
    ):
        raise PlanCompileError(f"max_iterations must be an int >= 1, got {max_iterations!r}")
    for i, step in enumerate(steps):
        if not isinstance(step, Step):
            raise PlanCompileError(
                f"Plan() takes Step objects; argument {i} is {type(step).__name__}: {step!r}"
            )


def _check_writes(step: Step) -> None:
    if step.writes is None:
        return
    if not isinstance(step.writes, str) or not step.writes:
        raise PlanCompileError(
            f"step {step.step_name!r}: writes= must be a non-empty str, got {step.writes!r}"
        )
    problem = key_problem(step.writes, new=True)
    if problem is not None:
        raise PlanCompileError(
            f"step {step.step_name!r}: writes={shown_key(step.writes)} {problem}"
        )


def _check_payload_types(step: Step) -> None:
    for what, tp in (("input", step.input), ("output", step.output)):
        if tp is str or tp is Any:
            continue
        try:
            type_adapter(tp)
        except Exception as exc:  # pydantic's errors differ by what the type is
            raise PlanCompileError(
                f"step {step.step_name!r}: {what}={tp!r} is not a type its payload can be "
                f"validated as ({type(exc).__name__}); pass a type such as str, dict or a "
                "pydantic model"
            ) from exc


def _index_steps(steps: tuple[Step, ...]) -> dict[str, Step]:
    step_of: dict[str, Step] = {}
    for step in steps:
        _check_payload_types(step)
        if step.step_name in step_of:
            raise PlanCompileError(
                f"two steps are named {step.step_name!r}; step names are identities (routing, "
                "sentinels, checkpoints): give one of them name='...'"
            )
        step_of[step.step_name] = step
    return step_of


def _group_units(steps: tuple[Step, ...]) -> tuple[list[Unit], dict[str, int]]:
    """Consecutive parallel=True steps form one band; every other step is its own unit."""
    units: list[Unit] = []
    unit_of: dict[str, int] = {}
    i = 0
    while i < len(steps):
        j = i + 1
        if steps[i].parallel:
            while j < len(steps) and steps[j].parallel:
                j += 1
        unit = Unit(len(units), tuple(steps[i:j]))
        for s in unit.steps:
            unit_of[s.step_name] = unit.index
        units.append(unit)
        i = j
    return units, unit_of


def _check_band_writes(unit: Unit) -> None:
    band_writes = [s.writes for s in unit.steps if s.writes]
    if len(band_writes) != len(set(band_writes)):
        raise PlanCompileError(
            f"parallel band starting at {unit.entry!r} has two steps writing the same "
            f"key ({band_writes}); give each branch its own writes= key"
        )


def _fingerprint(steps: tuple[Step, ...]) -> str:
    shape = "|".join(f"{s.step_name}:{int(s.parallel)}:{s.writes or ''}" for s in steps)
    return hashlib.sha256(shape.encode()).hexdigest()[:16]


def check_tools(plan: CompiledPlan, tools: Mapping[str, Tool]) -> None:
    """Every tool-name target of ``plan`` must be in ``tools`` (raises PlanCompileError)."""
    for step in plan.steps:
        if isinstance(step.target, str):
            _check_target(step, tools)


def _check_target(step: Step, tools: Mapping[str, Tool] | None) -> None:
    target = step.target
    if isinstance(target, str):
        if tools is not None and target not in tools:
            known = ", ".join(sorted(tools)) or "none"
            raise PlanCompileError(
                f"step {step.step_name!r} targets tool {target!r}, which is not in the "
                f"Agent's tools (known: {known}); add it to tools=[...] or fix the name"
            )
        return
    if callable(target) or isinstance(target, Tool) or is_agent_like(target):
        return
    raise PlanCompileError(
        f"step {step.step_name!r}: target must be a tool name, a callable or an Agent, "
        f"got {type(target).__name__}: {target!r}"
    )


def _sentinel_items(step: Step) -> list[tuple[str, Sentinel | str]]:
    items: list[tuple[str, Sentinel | str]] = [("task", step.task)]
    ctx = step.context
    if isinstance(ctx, list):
        items.extend((f"context[{i}]", c) for i, c in enumerate(ctx))
    elif ctx is not None:
        items.append(("context", ctx))
    return items


def _check_sentinels(step: Step, plan: CompiledPlan) -> None:
    for where, item in _sentinel_items(step):
        if isinstance(item, str):
            continue
        if not isinstance(item, Sentinel):
            raise PlanCompileError(
                f"step {step.step_name!r}: {where} must be a sentinel (from_prev, from_start, "
                f"from_step(...), ...) or a str, got {type(item).__name__}: {item!r}"
            )
        if item.name is None:
            continue
        if item.name not in plan.step_of:
            raise PlanCompileError(
                f"step {step.step_name!r}: {where}={item!r} names no step of this plan "
                f"(steps: {', '.join(plan.step_of)})"
            )
        if item.kind in ("parallel", "parallel_all") and not plan.step_of[item.name].parallel:
            raise PlanCompileError(
                f"step {step.step_name!r}: {where}={item!r} must name a parallel=True step; "
                f"use from_step({item.name!r}) for a sequential one"
            )
        if plan.unit_of[item.name] >= plan.unit_of[step.step_name]:
            # Its output does not exist yet when this step first runs.
            where_it_is = (
                "is this step itself"
                if item.name == step.step_name
                else "runs in the same parallel band"
                if plan.unit_of[item.name] == plan.unit_of[step.step_name]
                else "is declared after it"
            )
            raise PlanCompileError(
                f"step {step.step_name!r}: {where}={item!r} names step {item.name!r}, which "
                f"{where_it_is}, so it has no output when step {step.step_name!r} runs; name "
                "a step declared earlier (a step that a route sends back to gets the later "
                "step's output with from_prev)"
            )
    for i, src in enumerate(step.sources):
        if not callable(getattr(src, "text", None)):
            raise PlanCompileError(
                f"step {step.step_name!r}: sources[{i}] has no .text() method: {src!r}"
            )


def _check_routing(step: Step, plan: CompiledPlan) -> None:
    _check_routing_options(step)
    targets = _route_targets(step)
    for target in targets:
        _check_route_target(step.step_name, target, plan)
    if step.after_branches is not None:
        _check_after_branches(step, step.after_branches, targets, plan)


def _check_routing_options(step: Step) -> None:
    name = step.step_name
    if step.routes is not None and step.routes_by is not None:
        raise PlanCompileError(
            f"step {name!r} sets both routes= and routes_by=; they are mutually exclusive"
        )
    routed = step.routes is not None or step.routes_by is not None
    if step.after_branches is not None and not routed:
        raise PlanCompileError(
            f"step {name!r}: after_branches={step.after_branches!r} is only valid with "
            "routes= or routes_by="
        )
    if routed and step.parallel:
        raise PlanCompileError(
            f"step {name!r} is parallel=True and routes; a band runs all its branches, so "
            "route from a sequential step"
        )


def _route_targets(step: Step) -> list[str]:
    """The step names ``routes=`` or ``routes_by=`` may send to (checked callables)."""
    name = step.step_name
    targets: list[str] = []
    if step.routes is not None:
        if not isinstance(step.routes, dict):
            raise PlanCompileError(f"step {name!r}: routes= must be a dict, got {step.routes!r}")
        for target, pred in step.routes.items():
            if not callable(pred):
                raise PlanCompileError(
                    f"step {name!r}: routes[{target!r}] must be a predicate callable, got {pred!r}"
                )
            targets.append(target)
    if step.routes_by is not None:
        targets.extend(_routes_by_targets(step))
    return targets


def _check_route_target(name: str, target: str, plan: CompiledPlan) -> None:
    if target not in plan.step_of:
        raise PlanCompileError(
            f"step {name!r} routes to {target!r}, which is not a step of this plan "
            f"(steps: {', '.join(plan.step_of)})"
        )
    unit = plan.band_of(target)
    if unit.entry != target:
        raise PlanCompileError(
            f"step {name!r} routes to {target!r}, a member of the parallel band starting "
            f"at {unit.entry!r}; route to the band's first step"
        )


def _check_after_branches(step: Step, rejoin: str, targets: list[str], plan: CompiledPlan) -> None:
    name = step.step_name
    if rejoin not in plan.step_of:
        raise PlanCompileError(
            f"step {name!r}: after_branches={rejoin!r} is not a step of this plan"
        )
    here, there = plan.unit_of[name], plan.unit_of[rejoin]
    if there <= here + 1:
        raise PlanCompileError(
            f"step {name!r}: after_branches={rejoin!r} must come after the branch steps "
            f"that follow {name!r}"
        )
    for target in targets:
        if not here < plan.unit_of[target] < there:
            raise PlanCompileError(
                f"step {name!r} routes to {target!r} with after_branches={rejoin!r}; "
                f"branches must lie between {name!r} and {rejoin!r}"
            )


def literal_values(annotation: Any) -> list[Any] | None:
    """The values of ``Literal[...]`` (or ``Optional[Literal[...]]``), else None."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return list(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return literal_values(args[0])
    return None


def _routes_by_targets(step: Step) -> list[str]:
    name, field = step.step_name, step.routes_by
    output = step.output
    if not (inspect.isclass(output) and issubclass(output, BaseModel)):
        raise PlanCompileError(
            f"step {name!r}: routes_by={field!r} needs output= set to a pydantic model with a "
            f"Literal field {field!r}; got output={output!r}"
        )
    info = output.model_fields.get(field or "")
    if info is None:
        raise PlanCompileError(
            f"step {name!r}: routes_by={field!r} but {output.__name__} has no field {field!r}"
        )
    values = literal_values(info.annotation)
    if values is None:
        raise PlanCompileError(
            f"step {name!r}: routes_by={field!r} needs {output.__name__}.{field} typed "
            f"Literal['step_a', 'step_b', ...] (or Optional of it), got {info.annotation!r}"
        )
    bad = [v for v in values if not isinstance(v, str)]
    if bad:
        raise PlanCompileError(
            f"step {name!r}: {output.__name__}.{field} literal values must be step names "
            f"(str), got {bad!r}"
        )
    return [str(v) for v in values]


def _check_types(step: Step, plan: CompiledPlan) -> None:
    """Compatible output -> input types along ``from_prev`` / ``from_step`` edges."""
    if step.input is Any or not inspect.isclass(step.input):
        return
    task = step.task
    source: Step | None = None
    if isinstance(task, Sentinel):
        if task.kind in ("step", "parallel") and task.name is not None:
            source = plan.step_of[task.name]
        elif task.kind == "prev":
            unit = plan.unit_of[step.step_name]
            prev_units = plan.units[unit - 1] if unit > 0 else None
            if prev_units is not None and not prev_units.is_band:
                source = prev_units.steps[0]
    if source is None or source.output is Any or not inspect.isclass(source.output):
        return
    if source.output is str:
        return  # the default: nothing was declared, nothing to check
    if not issubclass(source.output, step.input):
        raise PlanCompileError(
            f"step {step.step_name!r} expects input {step.input.__name__} but step "
            f"{source.step_name!r} outputs {source.output.__name__}; align output=/input= "
            "or convert in between"
        )
