"""Agent: an engine plus its tools, callable like a function."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from stepstone.core import Envelope, RunContext, RunLocation, Tool, build_tool_map
from stepstone.core._run_context import takes_run_context
from stepstone.core._sync import run_sync
from stepstone.engines._protocol import Engine, KeywordEngine
from stepstone.exceptions import UserError
from stepstone.observability import Session
from stepstone.store import Store

if TYPE_CHECKING:
    from stepstone.durable._queue import RunHandle

__all__ = ["Agent"]


class Agent:
    """An engine (a ``Plan``, an ``LLMEngine``...) with a tool map, a name and an output type.

    ``agent("task")`` runs it synchronously and returns an :class:`Envelope`;
    ``await agent.run("task")`` is the async form. Step failures come back as error
    envelopes (check ``env.ok``); misuse and ownership conflicts raise.

    Every call gives the engine one :class:`~stepstone.RunContext` (this agent's name,
    tools, output type and session): the engine, which several agents may share, is never
    written to. An engine written to the keyword interface (``run(env, *, tools,
    output_type, memory, session)``) is called that way: the agent reads the signature of
    its ``run`` (and ``stream``) once, here.

    Args:
        engine: What runs: a ``Plan``, an ``LLMEngine``, a ``ReplanEngine``, an engine of
            your own (``run(env, ctx)``, see :class:`~stepstone.Engine`), or a model string
            (shorthand for ``LLMEngine(model)``).
        tools: Functions (become tools named after the function), Agents (become tools
            named after the agent) and :class:`Tool` objects. ``Step("name")`` targets and
            LLM tool calls resolve against them.
        name: The agent's name (its tool name when used as a tool). Default: ``"agent"``.
        description: What the agent does (shown to models when it is a tool).
        output: The payload type: ``str`` or a pydantic model (structured output).
        session: Where run events go.
        model: Shorthand for ``engine=LLMEngine(model, system=instructions)``: a model id
            or a provider instance (``stepstone.testing.FakeModel([...])``).
        instructions: The LLM agent's system prompt (with ``model=`` or a model string).

    Example::

        agent = Agent(engine=Plan(Step(extract), Step(transform)), tools=[])
        env = agent("today's batch")
        env.ok, env.payload
    """

    def __init__(
        self,
        engine: Engine | KeywordEngine | str | None = None,
        *,
        tools: Iterable[Any] | None = None,
        name: str | None = None,
        description: str | None = None,
        output: type = str,
        session: Session | None = None,
        model: Any = None,
        instructions: str | None = None,
        **engine_options: Any,
    ) -> None:
        if model is not None:
            if engine is not None:
                raise TypeError(
                    f"Agent() got both engine={engine!r} and model={model!r}; pass one: "
                    "model= is shorthand for engine=LLMEngine(model)"
                )
            engine = model
        if instructions is not None:
            if engine is not None and not isinstance(engine, str) and not _is_provider(engine):
                raise TypeError(
                    "Agent(instructions=...) goes with model= (an LLM agent); give the "
                    "engine its own system prompt: LLMEngine(model, system=...)"
                )
            engine_options = {**engine_options, "system": instructions}
        if engine is None or isinstance(engine, str) or _is_provider(engine):
            engine = _llm_engine(engine, engine_options)
        elif engine_options:
            raise TypeError(
                f"Agent() got unexpected keyword arguments {sorted(engine_options)}; engine "
                "options belong to the engine (e.g. LLMEngine(model, temperature=...))"
            )
        if not isinstance(engine, Engine | KeywordEngine):
            raise TypeError(f"Agent(engine=...) needs an engine with .run(), got {engine!r}")
        self.engine: Engine | KeywordEngine = engine
        # How to call the engine, read once: run(env, ctx) or the keyword interface.
        self._run_takes_context = takes_run_context(engine.run)
        stream_fn = getattr(engine, "stream", None)
        self._stream_takes_context = stream_fn is not None and takes_run_context(stream_fn)
        self.name = name or "agent"
        self.description = description or ""
        self.output = output
        self.session = session
        self.tool_map: dict[str, Tool] = build_tool_map(tools or [])
        compile_fn: Callable[..., Any] | None = getattr(engine, "compile", None)
        if compile_fn is not None:
            compile_fn(list(self.tool_map.values()), output_type=output)

    def __repr__(self) -> str:
        return f"Agent(name={self.name!r}, engine={type(self.engine).__name__})"

    @classmethod
    def from_provider(
        cls,
        provider: str,
        *,
        tier: str = "medium",
        tools: Iterable[Any] | None = None,
        name: str | None = None,
        description: str | None = None,
        output: type = str,
        session: Session | None = None,
        **engine_options: Any,
    ) -> Agent:
        """An LLM agent on ``provider``'s model for ``tier`` (``"top"``, ``"medium"``,
        ``"cheap"``), which tracks the provider's lineup instead of pinning a model id.

        Example::

            Agent.from_provider("anthropic", tier="cheap", tools=[search])("summarise X")

        ``engine_options`` go to ``LLMEngine`` (``max_turns=``, ``temperature=``...).
        """
        from stepstone.engines.llm import LLMEngine

        engine = LLMEngine(tier, provider=provider, **engine_options)
        return cls(
            engine=engine,
            tools=tools,
            name=name,
            description=description,
            output=output,
            session=session,
        )

    @property
    def tools(self) -> list[Tool]:
        """The agent's tools, in the order given."""
        return list(self.tool_map.values())

    def _envelope(self, task: str | Envelope[Any], context: str | None) -> Envelope[Any]:
        if isinstance(task, Envelope):
            if context is not None:
                joined = "\n\n".join(p for p in (task.context, context) if p)
                return Envelope(
                    task=task.task,
                    context=joined,
                    payload=task.payload,
                    metadata=dict(task.metadata),
                    error=task.error,
                )
            return task
        if not isinstance(task, str):
            raise TypeError(f"Agent tasks are str or Envelope, got {type(task).__name__}: {task!r}")
        return Envelope.from_task(task, context=context)

    async def run(
        self,
        task: str | Envelope[Any],
        *,
        context: str | None = None,
        output: type | None = None,
        session: Session | None = None,
        location: RunLocation | None = None,
    ) -> Envelope[Any]:
        """Run the engine on ``task`` and return the result envelope.

        Args:
            task: A string or an Envelope (a Plan step passes its resolved envelope).
            context: Extra context for this call, added to the envelope's context.
            output: Override the agent's output type for this call.
            session: Override the agent's session for this call.
            location: Record this run under ``location.key`` in ``location.store``
                instead of where the engine would (its ``checkpoint_key=``...), continuing
                a run already recorded there. For the built-in engines and engines taking
                ``run(env, ctx)``.

        Raises:
            UserError: ``location`` for an engine written to the keyword interface, which
                has no way to receive it.
        """
        env = self._envelope(task, context)
        ctx = self.run_context(output=output, session=session, location=location)
        if self._run_takes_context:
            return await cast(Engine, self.engine).run(env, ctx)
        if location is not None:
            raise UserError(
                f"{self.name}.run(location=...): engine {type(self.engine).__name__} takes "
                "the keyword interface run(env, *, tools, output_type, memory, session), "
                "which cannot receive a location; give it run(env, ctx) and read ctx.location"
            )
        return await cast(KeywordEngine, self.engine).run(env, **ctx.keywords())

    def run_context(
        self,
        *,
        output: type | None = None,
        session: Session | None = None,
        location: RunLocation | None = None,
    ) -> RunContext:
        """The :class:`~stepstone.RunContext` a call of this agent gives its engine: its
        name, tools, output type (``output`` overrides it) and session (``session``
        overrides it), and ``location``: where a durable engine records the run when the
        caller decides it (a worker gives its queue entry's key)."""
        return RunContext(
            agent_name=self.name,
            tools=tuple(self.tool_map.values()),
            output_type=output or self.output,
            session=session or self.session,
            location=location,
        )

    def __call__(
        self,
        task: str | Envelope[Any],
        *,
        context: str | None = None,
        output: type | None = None,
        session: Session | None = None,
        location: RunLocation | None = None,
    ) -> Envelope[Any]:
        """Synchronous :meth:`run` (not from inside a running event loop)."""
        return run_sync(
            self.run(task, context=context, output=output, session=session, location=location),
            sync_name=f"{self.name}(...)",
            async_name=f"{self.name}.run(...)",
        )

    async def stream(
        self, task: str | Envelope[Any], *, context: str | None = None, **options: Any
    ) -> AsyncIterator[str]:
        """Stream text tokens (engines with ``stream``; others yield the final text once).

        Over a Plan, the tokens are :class:`~stepstone.engines.plan.StepToken` strings
        naming the step they come from, and the run is checkpointed as by :meth:`run`.
        ``options`` go to the engine's ``stream`` (a Plan's ``boundaries=True``).
        """
        env = self._envelope(task, context)
        stream_fn = getattr(self.engine, "stream", None)
        if stream_fn is None:
            if options:
                raise TypeError(
                    f"{self.name}.stream() got {sorted(options)}, but its engine "
                    f"{type(self.engine).__name__} has no stream() to take them"
                )
            result = await self.run(env)
            if not result.ok:
                assert result.error is not None
                raise RuntimeError(f"{result.error.type}: {result.error.message}")
            yield result.text()
            return
        ctx = self.run_context()
        if self._stream_takes_context:
            tokens: AsyncIterator[str] = stream_fn(env, ctx, **options)
        else:
            tokens = stream_fn(env, **ctx.keywords(), **options)
        try:
            async for token in tokens:
                yield token
        finally:
            # a consumer that stops early stops the engine's stream now, not at collection
            aclose = getattr(tokens, "aclose", None)
            if aclose is not None:
                await aclose()

    def submit(
        self,
        task: str | Envelope[Any],
        *,
        store: Store | None = None,
        target: str | None = None,
        key: str | None = None,
        queue: str = "default",
        priority: int = 0,
        delay: float = 0.0,
        not_before: float | datetime | None = None,
        dedupe_key: str | None = None,
        max_attempts: int = 3,
    ) -> RunHandle:
        """Queue a run of this agent for a :class:`~stepstone.Worker` instead of running it
        here; returns a :class:`~stepstone.RunHandle`.

        The worker imports the agent by its module-level name (or ``target=``) and runs it
        durably in ``store`` (default: its engine's ``store``, for a Plan or a
        ``ReplanEngine`` built with one) under checkpoint key ``key``: an Agent over a
        Plan or a ``ReplanEngine`` as that engine with ``resume=True``, an LLM agent as
        ``Runner(store=store).run(agent, run_id=key, ...)`` (the result's payload is the
        ``AgentResult`` in JSON form). See :func:`stepstone.submit` for the other arguments.
        """
        from stepstone.durable._queue import submit

        where = store if store is not None else getattr(self.engine, "store", None)
        if not isinstance(where, Store):
            raise UserError(
                f"{self.name}.submit() needs a store the workers share: pass "
                "store=Store(url=...) or store=Store(db=...)"
            )
        return submit(
            where,
            target if target is not None else self,
            task,
            key=key,
            queue=queue,
            priority=priority,
            delay=delay,
            not_before=not_before,
            dedupe_key=dedupe_key,
            max_attempts=max_attempts,
        )

    def as_tool(self, name: str | None = None, *, description: str | None = None) -> Tool:
        """This agent as a tool named ``name`` (default: the agent's name).

        The tool takes one argument, ``task`` (a string), and returns the agent's payload.
        """
        return Tool(
            name=name or self.name,
            description=description or self.description or f"Ask the {self.name} agent.",
            parameters={
                "type": "object",
                "properties": {"task": {"type": "string", "description": "The task to do."}},
                "required": ["task"],
            },
            agent=self,
        )


def _is_provider(value: Any) -> bool:
    from stepstone.providers._base import Provider

    return isinstance(value, Provider)


def _llm_engine(model: Any, options: dict[str, Any]) -> Engine:
    if model is None:
        raise TypeError(
            "Agent() needs an engine: Agent(engine=Plan(...)) or Agent('claude-sonnet-4-6')"
        )
    try:
        from stepstone.engines.llm import LLMEngine
    except ImportError as exc:  # pragma: no cover - the LLM engine ships with stepstone
        raise UserError(
            f"Agent({model!r}) needs the LLM engine, which failed to import: {exc}"
        ) from exc
    engine: Engine = LLMEngine(model, **options)
    return engine
