"""The run context: everything an engine is told about one run, in one frozen value.

An :class:`~stepstone.Agent` builds one per call and passes it to its engine's
``run(env, ctx)`` / ``stream(env, ctx)``. Engines are shared (several Agents may hold one
and run it concurrently), so nothing about a run is ever written onto an engine: what
differs between runs travels here.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from stepstone.core._tool import Tool

__all__ = [
    "KEYWORD_ENGINE_ARGS",
    "RunContext",
    "RunLocation",
    "resolve_run_context",
    "takes_run_context",
]

#: The keyword arguments of the keyword engine interface:
#: ``run(env, *, tools, output_type, memory, session)``.
KEYWORD_ENGINE_ARGS = ("tools", "output_type", "memory", "session")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunLocation:
    """Where a durable engine records a run, when its caller decides it.

    A worker running a queued entry gives the entry's key, so that the entry's next
    attempt continues the same run. An engine given a location records the run under
    ``key`` in ``store`` instead of its own ``store=`` / ``checkpoint_key=``, and continues
    a run already recorded there (a finished one gives its stored result).

    Attributes:
        store: The :class:`~stepstone.Store` (typed loosely here: the store layer sits
            above this one).
        key: The run's key in that store.

    Example::

        ctx = RunContext(location=RunLocation(store=store, key="etl-2026-04-30"))
        env = await plan.run(Envelope.from_task("today's batch"), ctx)
    """

    store: Any
    key: str

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError(f"RunLocation(key={self.key!r}): the key must be a non-empty str")
        if not callable(getattr(self.store, "keys", None)):
            raise TypeError(f"RunLocation(store={self.store!r}): must be a stepstone Store")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """What an engine is told about one run: who runs it, with what, and where it is
    recorded.

    Attributes:
        agent_name: The name of the Agent running the engine (events and run records
            carry it). A nested Agent (a Plan step, a tool) builds its own context, so its
            engine sees its own name.
        tools: The Agent's tools, in the order given.
        output_type: The payload type asked for: ``str`` or a pydantic model.
        memory: Reserved for conversation memory (None today).
        session: The :class:`~stepstone.Session` run events go to, or None.
        location: Where a durable engine records the run when the caller decides it
            (:class:`RunLocation`); None: the engine's own ``store=`` / ``checkpoint_key=``
            (or, inside a durable Plan step or graph node, a key derived from that
            position).

    Example::

        class Shout:
            async def run(self, env, ctx):
                return Envelope(task=env.task, payload=f"{ctx.agent_name}: {env.task}!")

        Agent(engine=Shout(), name="crier")("hello").payload   # 'crier: hello!'
    """

    agent_name: str = "agent"
    tools: tuple[Tool, ...] = ()
    output_type: type = str
    memory: Any = None
    session: Any = None
    location: RunLocation | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tools, tuple):  # a list given: keep the value frozen
            object.__setattr__(self, "tools", tuple(self.tools))
        if self.location is not None and not isinstance(self.location, RunLocation):
            raise TypeError(
                f"RunContext(location={self.location!r}): must be a RunLocation(store=, key=)"
            )

    def replace(self, **changes: Any) -> RunContext:
        """A copy with ``changes`` (``ctx.replace(output_type=Report)``)."""
        return dataclasses.replace(self, **changes)

    def keywords(self) -> dict[str, Any]:
        """This context as the keyword engine interface's arguments (``tools``,
        ``output_type``, ``memory``, ``session``)."""
        return {
            "tools": list(self.tools),
            "output_type": self.output_type,
            "memory": self.memory,
            "session": self.session,
        }


def takes_run_context(method: Callable[..., Any]) -> bool:
    """Whether an engine's ``run`` / ``stream`` takes a :class:`RunContext` as its second
    positional argument (``run(env, ctx)``) rather than the keyword interface
    (``run(env, *, tools, output_type, memory, session)``).

    The parameter after the envelope decides: a positional one not named like a keyword
    argument of that interface receives the context; a keyword-only one, ``**kwargs`` or
    a positional ``tools`` mean the keyword interface, as does a signature that cannot be
    read. The built-in engines take ``run(env, ctx=None, *, tools=None, ...)``: both forms.
    """
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return False
    if len(params) < 2:
        return False
    second = params[1]  # after the envelope (a bound method has no ``self`` here)
    return second.kind in _POSITIONAL and second.name not in KEYWORD_ENGINE_ARGS


_POSITIONAL = (
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.VAR_POSITIONAL,
)


def resolve_run_context(
    where: str,
    ctx: RunContext | None,
    tools: Any,
    output_type: type | None,
    memory: Any,
    session: Any,
) -> RunContext:
    """The context a built-in engine's ``run(env, ctx=None, *, tools=None, ...)`` runs
    with: ``ctx`` itself, or one built from the keyword interface's arguments (for code
    that calls the engine the keyword way, e.g. a custom engine wrapping a built-in one).
    ``where`` names the call in errors (``"Plan.run"``).

    Raises:
        TypeError: both a context and keyword arguments were given.
    """
    if type(ctx) is RunContext and tools is output_type is memory is session is None:
        return ctx  # the usual call, from an Agent: checked at once
    if ctx is None:
        return RunContext(
            tools=tuple(tools or ()),
            output_type=str if output_type is None else output_type,
            memory=memory,
            session=session,
        )
    if not isinstance(ctx, RunContext):
        raise TypeError(f"{where}: the second argument must be a RunContext, got {ctx!r}")
    given = [
        name
        for name, value in (
            ("tools", tools),
            ("output_type", output_type),
            ("memory", memory),
            ("session", session),
        )
        if value is not None
    ]
    if given:
        raise TypeError(
            f"{where} got a RunContext and keyword arguments {given}; pass one: "
            f"ctx.replace(...) changes a context"
        )
    return ctx
