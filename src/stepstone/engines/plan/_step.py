"""Step: one node of a Plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from stepstone.core import AgentLike, Sentinel, Tool, from_prev
from stepstone.store._store import key_problem

__all__ = ["Step", "target_name"]

TaskSpec = Sentinel | str
ContextSpec = Sentinel | str | list[Sentinel | str] | None


def target_name(target: Any) -> str | None:
    """The name a target is known by: a tool name, an agent's name, a function's name."""
    if isinstance(target, str):
        return target
    if isinstance(target, Tool):
        return target.name
    if isinstance(target, AgentLike):
        return str(target.name)
    name = getattr(target, "__name__", None)
    if isinstance(name, str) and name != "<lambda>":
        return name
    return None


@dataclasses.dataclass(eq=False)
class Step:
    """A single step of a :class:`Plan`.

    ``target`` says what to call; ``name`` is the step's identity (routing, sentinels,
    checkpoints). A string target is a tool name from the Agent's ``tools=``; ``name``
    defaults to it, or to the function's or agent's name.

    Args:
        target: A tool name (str), a callable (sync or async), an Agent or a Tool.
        task: Where the step's task comes from: a sentinel (default ``from_prev``) or a
            literal string.
        context: Extra context: a sentinel, a string, or a list of them (joined by blank
            lines; each item is validated when the plan compiles).
        sources: Objects with a ``.text()`` method whose text is added to the context.
        writes: Store key under which the step's payload is saved (and checkpointed).
        input: Expected input payload type (checked when the plan compiles and at run time).
        output: Output payload type; a pydantic model is validated (structured output for
            agents) and kept as that type.
        parallel: Run concurrently with the adjacent ``parallel=True`` steps (a band).
        name: The step's identity; defaults to the target's name.
        routes: ``{step_name: predicate(envelope) -> bool}``, evaluated in order after the
            step; the first truthy one jumps there; none: continue linearly.
        routes_by: Name of a ``Literal[...]`` field of the output model whose value names
            the step to jump to (LLM-decided routing).
        after_branches: With ``routes``/``routes_by``: the rejoin step. Exactly one branch
            (the routed-to step) runs, then execution jumps here.

    Functions are called with the step's input payload as their one positional argument
    (none if they take no parameters); a parameter annotated ``Envelope`` gets the whole
    envelope, and a parameter named ``context`` gets the context text.

    Example::

        Step(extract, writes="raw")
        Step("transform", writes="clean")             # the tool named "transform"
        Step(triage, output=Triage, routes_by="kind", after_branches="archive")
    """

    target: Any
    task: TaskSpec = dataclasses.field(default_factory=lambda: from_prev)
    context: ContextSpec = None
    sources: list[Any] = dataclasses.field(default_factory=list)
    writes: str | None = None
    input: Any = Any
    output: Any = str
    parallel: bool = False
    name: str | None = None
    routes: dict[str, Callable[[Any], bool]] | None = None
    routes_by: str | None = None
    after_branches: str | None = None

    def __post_init__(self) -> None:
        from stepstone.exceptions import PlanCompileError

        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise PlanCompileError(f"Step name= must be a non-empty str, got {self.name!r}")
        if not isinstance(self.parallel, bool):
            raise PlanCompileError(f"Step parallel= must be True or False, got {self.parallel!r}")
        if not isinstance(self.sources, list | tuple):
            raise PlanCompileError(
                f"Step sources= must be a list of objects with a .text() method, got "
                f"{self.sources!r:.200}"
            )
        self.sources = list(self.sources)
        if self.name is None:
            self.name = target_name(self.target)
        if not isinstance(self.name, str) or not self.name:
            raise PlanCompileError(
                f"Step({self.target!r}) has no name: pass name='...' (a lambda or callable "
                "object has no usable name)"
            )
        problem = key_problem(self.name)  # names are stored with every journal row
        if problem is not None:
            raise PlanCompileError(f"Step name {self.name!r} {problem}")

    @property
    def step_name(self) -> str:
        """The step's name (always set after construction)."""
        assert self.name is not None
        return self.name

    def __repr__(self) -> str:
        return f"Step({self.name!r})"
