"""LLMEngine: the model ↔ tool-call loop behind ``Agent("claude-sonnet-4-6")``."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any, Final, Generic, Literal, NoReturn, TypeVar, cast, overload

from stepstone.core import Envelope, RunContext, Tool, payload_text
from stepstone.core._run_context import resolve_run_context
from stepstone.core._tokens import TokenSink, claim_tokens
from stepstone.durable._effects import current_scope
from stepstone.engines.llm._calls import (
    _STREAM_RESULT,
    CONTINUE_NOTE,
    MALFORMED_CALL_NOTE,
    ModelCalls,
    RunState,
    TokenQueue,
    last_stream_result,
)
from stepstone.engines.llm._effects import EffectHandler, EffectKey, PassThroughEffects
from stepstone.engines.llm._hooks import LoopHooks
from stepstone.engines.llm._output import output_schema, parse_output, wants_structured
from stepstone.engines.llm._routing import ProviderRouting
from stepstone.engines.llm._settings import (
    DEFAULT_STREAM_IDLE_TIMEOUT,
    UNSET,
    LLMSettings,
    Unset,
)
from stepstone.engines.llm._tools import ToolBatch
from stepstone.exceptions import (
    ConfigurationError,
    MaxTurnsExceeded,
    UserError,
)
from stepstone.observability import EventType, Session
from stepstone.providers._base import Provider, SDKClientMixin
from stepstone.providers._pricing import estimate_cost
from stepstone.providers._registry import create_provider, routing_table
from stepstone.providers._types import (
    CacheConfig,
    Message,
    ModelRequest,
    ModelResponse,
    NativeTool,
    ThinkingConfig,
    ToolDefinition,
    UsageLimits,
)

__all__ = ["DEFAULT_STREAM_IDLE_TIMEOUT", "LLMEngine", "LLMSettings", "last_stream_result"]

log = logging.getLogger("stepstone")

T = TypeVar("T")


class _Setting(Generic[T]):
    """An engine attribute that shows one field of its frozen settings."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, engine: None, owner: type) -> _Setting[T]: ...
    @overload
    def __get__(self, engine: LLMEngine, owner: type) -> T: ...
    def __get__(self, engine: LLMEngine | None, owner: type) -> _Setting[T] | T:
        if engine is None:
            return self
        return cast(T, getattr(engine.settings, self.name))

    def __set__(self, engine: LLMEngine, value: object) -> NoReturn:
        raise dataclasses.FrozenInstanceError(
            f"LLMEngine.{self.name} is read-only: an engine's settings are frozen when it is "
            f"built. Build a new engine with LLMEngine(..., {self.name}={value!r})"
        )


class LLMEngine(ProviderRouting):
    """Drives the LLM ↔ tool-call loop for one agent invocation.

    Args:
        model: A model id (``"claude-sonnet-4-6"``, ``"gpt-5"``, ``"gemini-2.5-flash"``); the
            provider is inferred from it. A :class:`~stepstone.providers.Provider` instance
            (e.g. ``stepstone.testing.FakeModel([...])``) is used as it is.
        provider: Provider name (``"anthropic"``, ``"openai"``, ``"google"``, ``"ollama"``) or
            instance (``OpenAIProvider(base_url="http://localhost:8000/v1")``); overrides
            inference. With a name, ``model`` may be a tier alias (``"medium"``).
        thinking: ``True`` or a :class:`ThinkingConfig` enables extended thinking/reasoning.
        max_turns: Cap on model turns; a model still calling tools after it raises
            :class:`MaxTurnsExceeded` (an error envelope from ``run``).
        tool_choice: ``"auto"``, or ``"any"``: the model must call a tool on the first turn
            (sent as the provider's "required"/"any"), then ``"auto"``.
        temperature: Sampling temperature (None: provider default).
        system: Static system prompt; the envelope's context is added below it.
        native_tools: Provider-side tools (:class:`NativeTool` or their string values).
        allow_dangerous_native_tools: Opt-in for ``CODE_EXECUTION`` / ``COMPUTER_USE``.
        max_retries: Retries of transient provider errors (429, 5xx, network, timeouts).
        retry_delay: Base backoff in seconds (doubles per attempt, ±10% jitter); a server's
            ``retry-after`` wins.
        max_retry_wait: Longest wait (seconds) the engine sleeps before a retry. A server
            asking for more (``retry-after: 3600``) ends the turn at once with a retryable
            :class:`~stepstone.exceptions.ModelAPIError` whose ``retry_at`` says when to
            resume, instead of sleeping with the run's lease held.
        request_timeout: Per-completion deadline in seconds, passed to the SDK (None: the
            SDK's own).
        usage_limits: Caps on a run's requests, tokens and estimated cost, checked before
            every request (:class:`~stepstone.exceptions.UsageLimitExceeded`).
        continue_on_length: Times a final answer cut off at the output-token cap is
            continued (the model is asked to go on and the pieces are joined); 0 (the
            default) ends the run with :class:`~stepstone.exceptions.ModelLengthError`.
        max_parallel_tools: Concurrent tool calls per turn (None: unbounded).
        max_tool_calls_per_turn: Calls run per turn; extras get an ``is_error`` result.
        tool_timeout: Per-tool deadline; expiry is reported to the model as an error
            (:class:`ToolTimeoutError`) and the run continues. A sync tool's thread cannot
            be stopped: it runs to the end, the model is told its outcome is unknown, and
            the late outcome is logged as a ``tool_late_result`` event.
        stream_idle_timeout: Max silence between stream chunks before
            :class:`StreamStallError` (default 90 s). ``None`` disables it, with a warning.
        stream_buffer: Size of the bounded token queue between the loop and ``stream()``'s
            consumer (backpressure).
        cache: ``True`` or a :class:`CacheConfig` asks for prompt caching.
        strict_multimodal: Raise instead of dropping attachments a model cannot take.
        stream_to: In a durable run (a ``Runner`` run, a queued agent, a Plan step, a
            workflow's body, a graph node), write the model's text as it comes to the
            run's stream of this name, as ``{"text": ...}`` values a few tokens at a time,
            so another process can show the answer live (``RunHandle.read_stream``). A
            model call replayed from the journal writes nothing; one that runs again after
            a crash writes again, its values carrying a later attempt. Elsewhere, ignored.

    Example::

        engine = LLMEngine("claude-sonnet-4-6", max_turns=8, tool_timeout=30)
        agent = Agent(engine=engine, tools=[search, fetch])
        env = agent("What changed in the Q3 report?")
        env.payload, env.metadata["usage"], env.metadata["cost_usd"]
    """

    #: Wraps every model call and tool call; a durable journal replaces it.
    effects: EffectHandler

    def __init__(
        self,
        model: str | Provider,
        *,
        provider: str | Provider | None = None,
        thinking: bool | ThinkingConfig = False,
        max_turns: int = 20,
        tool_choice: Literal["auto", "any"] = "auto",
        temperature: float | None = None,
        system: str | None = None,
        native_tools: list[NativeTool | str] | None = None,
        allow_dangerous_native_tools: bool = False,
        max_retries: int = 3,
        retry_delay: float = 1.0,
        request_timeout: float | None = 120.0,
        max_retry_wait: float = 60.0,
        usage_limits: UsageLimits | None = None,
        continue_on_length: int = 0,
        max_parallel_tools: int | None = 8,
        max_tool_calls_per_turn: int | None = None,
        tool_timeout: float | None = None,
        stream_idle_timeout: float | Unset | None = UNSET,
        stream_buffer: int = 64,
        cache: bool | CacheConfig = False,
        strict_multimodal: bool = False,
        stream_to: str | None = None,
    ) -> None:
        #: The engine's configuration, checked and frozen (see :class:`LLMSettings`).
        self.settings: Final = LLMSettings.from_arguments(
            model,
            provider=provider,
            thinking=thinking,
            max_turns=max_turns,
            tool_choice=tool_choice,
            temperature=temperature,
            system=system,
            native_tools=native_tools,
            allow_dangerous_native_tools=allow_dangerous_native_tools,
            max_retries=max_retries,
            retry_delay=retry_delay,
            request_timeout=request_timeout,
            max_retry_wait=max_retry_wait,
            usage_limits=usage_limits,
            continue_on_length=continue_on_length,
            max_parallel_tools=max_parallel_tools,
            max_tool_calls_per_turn=max_tool_calls_per_turn,
            tool_timeout=tool_timeout,
            stream_idle_timeout=stream_idle_timeout,
            stream_buffer=stream_buffer,
            cache=cache,
            strict_multimodal=strict_multimodal,
            stream_to=stream_to,
            stacklevel=2,
        )
        self._provider_obj: Provider | None = None
        if isinstance(model, Provider):
            self._provider_obj = model
        elif isinstance(provider, Provider):
            self._provider_obj = provider
        self._calls = ModelCalls(self.settings)
        self.effects = PassThroughEffects()

    # Read-only views of the settings, under the argument names.
    model = _Setting[str]()
    provider = _Setting[str]()
    thinking = _Setting[bool | ThinkingConfig]()
    max_turns = _Setting[int]()
    tool_choice = _Setting[Literal["auto", "any"]]()
    temperature = _Setting[float | None]()
    system = _Setting[str | None]()
    allow_dangerous_native_tools = _Setting[bool]()
    max_retries = _Setting[int]()
    retry_delay = _Setting[float]()
    request_timeout = _Setting[float | None]()
    max_retry_wait = _Setting[float]()
    usage_limits = _Setting[UsageLimits | None]()
    continue_on_length = _Setting[int]()
    max_parallel_tools = _Setting[int | None]()
    max_tool_calls_per_turn = _Setting[int | None]()
    tool_timeout = _Setting[float | None]()
    stream_idle_timeout = _Setting[float | None]()
    stream_buffer = _Setting[int]()
    cache = _Setting[CacheConfig | None]()
    strict_multimodal = _Setting[bool]()
    stream_to = _Setting[str | None]()

    @property
    def native_tools(self) -> list[NativeTool]:
        """The provider-side tools requests carry (a copy)."""
        return list(self.settings.native_tools)

    def __repr__(self) -> str:
        return f"LLMEngine(model={self.model!r}, provider={self.provider!r})"

    # -- provider -------------------------------------------------------------------------

    def get_provider(self) -> Provider:
        """The provider adapter (built on first use; raises MissingExtraError without its SDK)."""
        if self._provider_obj is None:
            provider = create_provider(self.provider)
            if self.settings.routed_by_default:
                _check_default_route(self.model, provider)
            self._provider_obj = provider
        return self._provider_obj

    async def aclose(self) -> None:
        """Close the provider's network resources (SDK connection pools) on this loop."""
        if self._provider_obj is not None:
            await self._provider_obj.aclose()

    @property
    def wire_model(self) -> str:
        """The model id sent to the provider (tier aliases resolved)."""
        return self.get_provider().resolve_model(self.model)

    # -- public API -----------------------------------------------------------------------

    async def run(
        self,
        env: Envelope[Any],
        ctx: RunContext | None = None,
        *,
        tools: list[Tool] | None = None,
        output_type: type | None = None,
        memory: Any = None,
        session: Session | None = None,
    ) -> Envelope[Any]:
        """Run the loop to a final answer; failures come back as error envelopes.

        ``ctx`` is the :class:`~stepstone.RunContext` an Agent gives (or pass ``tools=``,
        ``session=``... as keywords instead). With ``ctx.location``, the run is the durable
        agent run whose ``run_id`` is ``ctx.location.key`` (as ``Runner.run`` records it);
        inside a durable Plan step or graph node it is journaled under a key derived from
        that position.

        The envelope's ``metadata`` has ``model``, ``provider``, ``usage`` (token counts),
        ``input_tokens``, ``output_tokens``, ``cost_usd`` (estimate, None when the model's
        price is unknown), ``latency_ms``, ``turns``, ``tool_calls`` and ``run_id``.
        Misuse (:class:`~stepstone.exceptions.UserError`, e.g. a missing SDK extra) raises.
        """
        ctx = resolve_run_context("LLMEngine.run", ctx, tools, output_type, memory, session)
        if ctx.location is not None:
            from stepstone.engines.llm._durable import run_at_location

            return await run_at_location(self, env, ctx.location, ctx)
        scope = current_scope()
        if scope is not None:
            from stepstone.engines.llm._durable import run_in_scope

            return await run_in_scope(self, env, scope, ctx)
        state = self._new_run(ctx)
        state.emit(
            EventType.AGENT_START,
            {"task": env.task, "model": self.model, "provider": self.provider},
        )
        started = time.perf_counter()
        ok = False
        try:
            payload = await self._loop(
                env, tools=list(ctx.tools), output_type=ctx.output_type, state=state
            )
            ok = True
            return Envelope(
                task=env.task,
                context=env.context,
                payload=payload,
                metadata=self._metadata(state, started),
            )
        except UserError:
            raise
        except Exception as exc:
            state.error = type(exc).__name__
            log.debug("stepstone: LLM run %s failed", state.run_id, exc_info=True)
            metadata = self._metadata(state, started)
            retry_at = getattr(exc, "retry_at", None)
            if retry_at is not None:
                metadata["retry_at"] = retry_at  # when a resumed run may try again
            return Envelope.error_envelope(exc, task=env.task, metadata=metadata)
        finally:
            state.emit(
                EventType.AGENT_FINISH,
                {
                    "ok": ok,
                    "cancelled": False,
                    "error": state.error,
                    **self._metadata(state, started),
                },
            )

    async def stream(
        self,
        env: Envelope[Any],
        ctx: RunContext | None = None,
        *,
        tools: list[Tool] | None = None,
        output_type: type | None = None,
        memory: Any = None,
        session: Session | None = None,
    ) -> AsyncGenerator[str, None]:
        """Stream tokens from the whole tool-calling loop.

        Text is yielded as the model produces it; tool calls between turns run silently and
        the next turn streams on, so output is continuous across tool turns. A bounded queue
        (``stream_buffer``) applies backpressure to the provider stream; a consumer that
        stops early (``break``, ``aclose()``) cancels the loop. Errors
        (:class:`StreamStallError`, :class:`MaxTurnsExceeded`...) are raised to the consumer.
        With a structured ``output_type`` only the validated JSON answer is sent (a failed
        attempt never reaches the consumer). After the loop, :func:`last_stream_result`
        gives the final value, usage and stop reason. ``ctx`` is as for :meth:`run`; a
        stream is not journaled, so a ``ctx.location`` is refused (``UserError``): run it
        with :meth:`run` instead.
        """
        ctx = resolve_run_context("LLMEngine.stream", ctx, tools, output_type, memory, session)
        if ctx.location is not None:
            raise UserError(
                f"LLMEngine.stream got RunContext(location=RunLocation(key="
                f"{ctx.location.key!r})): a stream is not journaled; run it with "
                "agent.run(..., location=...) instead"
            )
        state = self._new_run(ctx)
        state.emit(
            EventType.AGENT_START,
            {"task": env.task, "model": self.model, "provider": self.provider},
        )
        started = time.perf_counter()
        sink: asyncio.Queue[str | None] = asyncio.Queue(maxsize=self.settings.stream_buffer)

        async def run_loop() -> Any:
            try:
                return await self._loop(
                    env, tools=list(ctx.tools), output_type=ctx.output_type, state=state, sink=sink
                )
            finally:
                await sink.put(None)

        task = asyncio.create_task(run_loop())
        cancelled_by_us = False
        try:
            while True:
                token = await sink.get()
                if token is None:
                    break
                yield token
            if task.done() and not task.cancelled() and task.exception() is None:
                metadata = self._metadata(state, started)
                _STREAM_RESULT.set(
                    Envelope(
                        task=env.task, context=env.context, payload=task.result(), metadata=metadata
                    )
                )
        finally:
            if not task.done():
                task.cancel()
                cancelled_by_us = True
            try:
                await task
            except asyncio.CancelledError:
                if not cancelled_by_us:
                    raise
            finally:
                self._emit_stream_finish(state, task, started, cancelled=cancelled_by_us)

    def _emit_stream_finish(
        self, state: RunState, task: asyncio.Task[Any], started: float, *, cancelled: bool
    ) -> None:
        """The AGENT_FINISH event of a stream, whatever ended it."""
        failed = task.done() and not task.cancelled() and task.exception() is not None
        state.emit(
            EventType.AGENT_FINISH,
            {
                "cancelled": cancelled,
                "ok": task.done() and not task.cancelled() and task.exception() is None,
                "error": type(task.exception()).__name__ if failed else None,
                **self._metadata(state, started),
            },
        )

    # -- the loop -------------------------------------------------------------------------

    def _new_run(self, ctx: RunContext) -> RunState:
        return RunState(run_id=uuid.uuid4().hex, agent_name=ctx.agent_name, session=ctx.session)

    def _metadata(self, state: RunState, started: float) -> dict[str, Any]:
        model = state.model or self.model
        return {
            "model": model,
            "provider": self.provider,
            "usage": state.usage.to_dict(),
            "input_tokens": state.usage.input_tokens,
            "output_tokens": state.usage.output_tokens,
            "cost_usd": estimate_cost(model, state.usage, self.settings.provider),
            "stop_reason": state.stop_reason,
            "raw_stop_reason": state.raw_stop_reason,
            "latency_ms": round((time.perf_counter() - started) * 1000, 3),
            "turns": state.turns,
            "tool_calls": state.tool_calls,
            "run_id": state.run_id,
        }

    def _system(self, env: Envelope[Any]) -> str | None:
        parts = [p for p in (self.settings.system, env.context) if p]
        return "\n\n".join(parts) if parts else None

    async def _loop(
        self,
        env: Envelope[Any],
        *,
        tools: list[Tool],
        output_type: type,
        state: RunState,
        sink: TokenQueue | None = None,
        hooks: LoopHooks | None = None,
    ) -> Any:
        # A caller up the stack that streams this run (Plan.stream) gets its text as it
        # comes; what the loop calls meanwhile (an agent as a tool) streams nothing there.
        with claim_tokens() as claimed:
            if sink is None and claimed is not None:
                sink = _Forward(claimed)
            return await self._turns(
                env, tools=tools, output_type=output_type, state=state, sink=sink, hooks=hooks
            )

    async def _turns(
        self,
        env: Envelope[Any],
        *,
        tools: list[Tool],
        output_type: type,
        state: RunState,
        sink: TokenQueue | None,
        hooks: LoopHooks | None,
    ) -> Any:
        provider = self.get_provider()
        effects = hooks.effects if hooks is not None else self.effects
        wire_model = provider.resolve_model(self.settings.model)
        state.model = wire_model
        tool_map = {t.name: t for t in tools}
        definitions = _definitions(tools)
        structured = wants_structured(output_type)
        schema = output_schema(output_type) if structured else None
        user_text = env.task if env.task else payload_text(env.payload)
        messages = [Message(role="user", text=user_text)]
        batch = self._tool_batch(tool_map, effects, state)
        # What every turn's request carries; each turn adds the messages so far.
        request_of = functools.partial(
            ModelRequest,
            model=wire_model,
            system=self._system(env),
            tools=definitions,
            temperature=self.settings.temperature,
            thinking=self.settings.thinking_config,
            cache=self.settings.cache,
            output_schema=schema,
            output_name=getattr(output_type, "__name__", None) if structured else None,
        )
        pending = ""  # text of paused or length-continued turns, joined to the final answer
        for turn in range(self.settings.max_turns):
            self._calls.check_limits(state, wire_model, provider.name)
            force = self.settings.tool_choice == "any" and turn == 0 and bool(definitions)
            request = request_of(
                messages=list(messages),
                tool_choice="required" if force else "auto",
                native_tools=list(self.settings.native_tools),
                turn=turn,
            )
            if hooks is not None:
                await hooks.turn_started(request, state)
            # Structured answers are not streamed as they come: a failed attempt and its
            # repair must not reach the consumer as one text. The validated JSON is sent.
            turn_sink = None if structured else sink
            response = await self._model_call(provider, request, state, turn_sink, effects)
            state.turns = turn + 1
            state.usage.add(dataclasses.replace(response.usage, requests=1))
            if hooks is not None:
                hooks.model_done(request, response, state)
            outcome = self._calls.outcome(provider, response, state)
            messages.append(_assistant_message(response, provider.name))
            if outcome in ("malformed", "pause", "continue"):
                pending = _unfinished_turn(outcome, response.text, pending, messages)
                continue
            if response.tool_calls:
                state.tool_calls += len(response.tool_calls)
                if hooks is not None:
                    hooks.tools_started(turn, response.tool_calls, tool_map)
                results = await batch.run(turn, response.tool_calls)
                if hooks is not None:
                    await hooks.tools_done(turn, results, state)
                messages.append(Message(role="tool", tool_results=results))
                continue
            text, pending = pending + response.text, ""
            if not structured:
                return text
            answer = await _structured_answer(text, output_type, sink, messages)
            if answer is not _RETRY:
                return answer
        raise MaxTurnsExceeded(
            f"the model was still working after max_turns={self.settings.max_turns} turns "
            f"(model {wire_model!r}, {state.tool_calls} tool call(s)); raise "
            f"LLMEngine(max_turns=...) or simplify the task"
        )

    def _tool_batch(
        self, tool_map: dict[str, Tool], effects: EffectHandler, state: RunState
    ) -> ToolBatch:
        """What runs the tool calls of each turn, with the engine's limits."""
        return ToolBatch(
            tool_map=tool_map,
            effects=effects,
            emit=state.emit,
            run_id=state.run_id,
            max_parallel_tools=self.settings.max_parallel_tools,
            max_tool_calls_per_turn=self.settings.max_tool_calls_per_turn,
            tool_timeout=self.settings.tool_timeout,
        )

    async def _model_call(
        self,
        provider: Provider,
        request: ModelRequest,
        state: RunState,
        sink: TokenQueue | None,
        effects: EffectHandler | None = None,
    ) -> ModelResponse:
        key = EffectKey(
            run_id=state.run_id,
            kind="model",
            turn=request.turn,
            index=0,
            name=request.model,
            input=request,
        )

        async def invoke() -> ModelResponse:
            return await self._calls.with_retries(provider, request, state, sink)

        state.emit(
            EventType.MODEL_REQUEST,
            {
                "turn": request.turn,
                "model": request.model,
                "provider": provider.name,
                "messages": len(request.messages),
                "tools": len(request.tools),
                "tool_choice": request.tool_choice,
                "stream": sink is not None,
            },
        )
        started = time.perf_counter()
        try:
            response = await (effects or self.effects).model_call(key, invoke)
        except Exception as exc:
            state.emit(
                EventType.MODEL_RESPONSE,
                {
                    "turn": request.turn,
                    "model": request.model,
                    "provider": provider.name,
                    "error": type(exc).__name__,
                    "message": str(exc),
                    "latency_ms": round((time.perf_counter() - started) * 1000, 3),
                },
            )
            raise
        state.emit(
            EventType.MODEL_RESPONSE,
            {
                "turn": request.turn,
                "model": response.model or request.model,
                "provider": provider.name,
                "input_tokens": response.usage.input_tokens,
                "output_tokens": response.usage.output_tokens,
                "cache_read_tokens": response.usage.cache_read_tokens,
                "cache_write_tokens": response.usage.cache_write_tokens,
                "reasoning_tokens": response.usage.reasoning_tokens,
                "tool_calls": [c.name for c in response.tool_calls],
                "stop_reason": response.stop_reason,
                "raw_stop_reason": response.raw_stop_reason,
                "latency_ms": round((time.perf_counter() - started) * 1000, 3),
            },
        )
        return response


class _Forward:
    """A token queue that hands each piece of text to a caller's sink (see
    :func:`~stepstone.core._tokens.claim_tokens`)."""

    def __init__(self, sink: TokenSink) -> None:
        self.sink = sink

    async def put(self, item: str | None) -> None:
        if item:
            await self.sink(item)


def _check_default_route(model: str, provider: Provider) -> None:
    """Refuse a model no alias or rule routes when the default provider it went to cannot
    be used (no API key): the model is most likely not that provider's, and saying only
    that the key is missing would send its user after the wrong fix."""
    if not isinstance(provider, SDKClientMixin):
        return
    try:
        provider._resolve_api_key()
    except UserError as exc:
        table = routing_table()
        raise ConfigurationError(
            f"no provider recognises model {model!r}: no alias or rule routes it "
            f"({table.describe()}), so it went to the default provider {provider.name!r}, "
            f"which cannot be used ({exc}). "
            f"If {model!r} is not a model of {provider.name!r}, name its provider: "
            f"LLMEngine({model!r}, provider='openai'), or route it: "
            f"LLMEngine.register_provider_rule({model.split('-')[0]!r}, '<provider>', "
            "kind='startswith')"
        ) from exc


#: What :func:`_structured_answer` returns when the model must try again.
_RETRY: Final = object()


def _unfinished_turn(outcome: str, text: str, pending: str, messages: list[Message]) -> str:
    """Prepare the next turn after one that gave no answer: a malformed tool call is
    pointed out to the model; the text of a paused or length-cut turn is kept (returned,
    joined to ``pending``) and a cut one is asked to continue."""
    if outcome == "malformed":
        messages.append(Message(role="user", text=MALFORMED_CALL_NOTE))
        return pending
    if outcome == "continue":
        messages.append(Message(role="user", text=CONTINUE_NOTE))
    return pending + text


async def _structured_answer(
    text: str, output_type: type, sink: TokenQueue | None, messages: list[Message]
) -> Any:
    """The final answer ``text`` parsed as ``output_type`` (and sent to ``sink``), or
    ``_RETRY`` after telling the model what was wrong (the retry counts as a turn)."""
    try:
        value = parse_output(text, output_type)
    except ValueError as exc:
        messages.append(
            Message(
                role="user",
                text=(
                    f"Your answer did not match the required JSON schema: {exc}. "
                    "Reply with only a JSON value that matches the schema."
                ),
            )
        )
        return _RETRY
    if sink is not None and text:
        await sink.put(text)
    return value


def _assistant_message(response: ModelResponse, provider: str) -> Message:
    """The model's answer as the history keeps it (with the provider's raw parts)."""
    return Message(
        role="assistant",
        text=response.text,
        tool_calls=list(response.tool_calls),
        raw=response.raw,
        raw_provider=provider,
    )


def _definitions(tools: list[Tool]) -> list[ToolDefinition]:
    """The tools as the model is offered them."""
    return [
        ToolDefinition(name=t.name, description=t.description, parameters=t.parameters)
        for t in tools
    ]
