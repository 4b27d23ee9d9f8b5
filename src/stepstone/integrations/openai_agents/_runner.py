"""``DurableRunner``: the OpenAI Agents SDK's ``Runner``, journaled by a stepstone workflow.

Built on the SDK's public extension points, as other durable runners for it are: the
starting agent is cloned with its model wrapped (a ``Model`` whose ``get_response`` /
``stream_response`` is one operation of the workflow run, recorded when the answer is
complete and committed with the next operation), its function tools' invokers wrapped
(each call one operation, its intent committed before it runs), its handoffs wrapped
(the agent a handoff returns is wrapped the same way), its MCP servers wrapped (each
``call_tool`` one operation), and the run config's model provider wrapped (models the SDK
looks up by name). Tools that need approval ask through an operation of their own, so the answer
given from any process, hours later, is what the resumed run sees.

Positions: the tool calls a model answer asks for take their positions right after the
model operation, in the answer's order, in the task that made the request; the tools then
use them whatever order their tasks run in, so concurrent tool calls replay at the same
place.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    Handoff,
    Model,
    ModelProvider,
    RunConfig,
    Runner,
    RunResult,
    RunResultStreaming,
)
from agents.items import ModelResponse, TResponseStreamEvent
from agents.mcp import MCPServer
from agents.models.multi_provider import MultiProvider
from agents.tool_context import ToolContext
from openai.types.responses import Response, ResponseCompletedEvent
from pydantic import TypeAdapter

from stepstone.core._sync import run_sync
from stepstone.durable._messages import check_name
from stepstone.durable._operations import Call, OperationJournal, Outcome, current_journal
from stepstone.durable._time import write_stream
from stepstone.engines.workflow import run_workflow, step_body
from stepstone.engines.workflow._values import decode_value, encode_value
from stepstone.exceptions import ApprovalPendingError, UserError
from stepstone.integrations._approval import ask_approval
from stepstone.integrations._turns import turn_summary
from stepstone.store import Store

__all__ = ["DurableRunner", "RecordedRunResult"]

#: The workflow name a keyed run (``DurableRunner.run(..., store=, key=)``) is recorded under.
WORKFLOW_NAME = "openai-agents"

_RESPONSE = TypeAdapter(ModelResponse)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecordedRunResult:
    """What ``DurableRunner.run`` returns for a key whose run had already finished: the
    recorded final output (nothing runs again).

    Attributes:
        key: The run's key.
        final_output: The final output it recorded (plain JSON for a structured output).
        last_agent_name: The name of the agent that gave it.
    """

    key: str
    final_output: Any
    last_agent_name: str | None


class _State:
    """One durable run's bookkeeping: positions taken for the tool calls a model answer
    asked for, and approval decisions read for them."""

    def __init__(self, stream_to: str | None = None) -> None:
        self.stream_to = stream_to
        self.tool_positions: dict[str, str] = {}
        self.approval_positions: dict[str, str] = {}
        self.refused: dict[str, str] = {}
        self.pending: list[dict[str, Any]] = []


def _summary(response: ModelResponse, model: str | None) -> dict[str, Any]:
    calls: list[tuple[str, Any]] = []
    texts: list[str] = []
    for item in response.output:
        kind = getattr(item, "type", None)
        if kind == "function_call":
            calls.append((str(getattr(item, "name", "")), getattr(item, "arguments", "")))
        elif kind == "message":
            for part in getattr(item, "content", ()) or ():
                text = getattr(part, "text", None)
                if isinstance(text, str):
                    texts.append(text)
    usage = response.usage
    details = getattr(usage, "input_tokens_details", None)
    return turn_summary(
        model=model,
        provider="openai",
        input_tokens=int(usage.input_tokens or 0),
        output_tokens=int(usage.output_tokens or 0),
        cache_read_tokens=int(getattr(details, "cached_tokens", 0) or 0),
        tool_calls=calls,
        text="".join(texts) or None,
    )


def _model_name(model: Model) -> str | None:
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else None


def _approval_tools(tools: list[Any]) -> set[str]:
    return {t.name for t in tools if isinstance(t, FunctionTool) and t.needs_approval}


class DurableModel(Model):
    """A model whose every request is one operation of the current workflow run (outside
    one, the wrapped model answers as usual)."""

    def __init__(self, model: Model, state: _State) -> None:
        self.model = model
        self._state = state

    def _take_positions(
        self, journal: OperationJournal, response: ModelResponse, tools: list[Any]
    ) -> None:
        asking = _approval_tools(tools)
        for item in response.output:
            if getattr(item, "type", None) != "function_call":
                continue
            call_id = str(getattr(item, "call_id", ""))
            if getattr(item, "name", None) in asking:
                self._state.approval_positions[call_id] = journal.position()
            self._state.tool_positions[call_id] = journal.position()

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        journal = current_journal()
        if journal is None:
            return await self.model.get_response(*args, **kwargs)
        name = _model_name(self.model)
        pos, found = journal.lookup("model", "model", {"model": name}, check_args=False)
        if found is not None and found.outcome is not None:
            response: ModelResponse = journal.recorded_value(found, _RESPONSE.validate_python)
        else:
            started = time.perf_counter()
            with step_body(journal, _call(journal, pos, "model")):
                response = await self.model.get_response(*args, **kwargs)
            journal.record_done(
                pos,
                "model",
                "model",
                {"model": name},
                _RESPONSE.dump_python(response, mode="json"),
                ms=round((time.perf_counter() - started) * 1000, 3),
                summary=_summary(response, name),
            )
        self._take_positions(journal, response, _tools(args, kwargs))
        return response

    async def stream_response(
        self, *args: Any, **kwargs: Any
    ) -> AsyncIterator[TResponseStreamEvent]:
        journal = current_journal()
        if journal is None:
            async for event in self.model.stream_response(*args, **kwargs):
                yield event
            return
        name = _model_name(self.model)
        pos, found = journal.lookup("model", "model.stream", {"model": name}, check_args=False)
        if found is not None and found.outcome is not None:
            response = journal.recorded_value(found, _response_of)
        else:
            started = time.perf_counter()
            final: Response | None = None
            with step_body(journal, _call(journal, pos, "model.stream")):
                async for event in self.model.stream_response(*args, **kwargs):
                    if isinstance(event, ResponseCompletedEvent):
                        final = event.response
                        continue
                    if self._state.stream_to is not None:  # live, a plain write
                        value = event.model_dump(mode="json", exclude_none=True)
                        await write_stream(self._state.stream_to, value)
                    yield event
            if final is None:
                raise UserError(f"model {name!r} ended its stream without a completed response")
            response = final
            journal.record_done(
                pos,
                "model",
                "model.stream",
                {"model": name},
                final.model_dump(mode="json"),
                ms=round((time.perf_counter() - started) * 1000, 3),
                summary=_summary(_as_model_response(final), name),
            )
        self._take_positions(journal, _as_model_response(response), _tools(args, kwargs))
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )

    async def close(self) -> None:
        await self.model.close()


def _response_of(data: Any) -> Response:
    """A recorded streamed answer, rebuilt as the SDK builds what the API sends: without
    validation (a field the server left out stays out, as it was when recorded)."""
    return Response.model_construct(**data)


def _call(journal: OperationJournal, pos: str, name: str) -> Call:
    """The call a model request recorded after it ran is made as (its scope's key)."""
    return Call(journal.key, pos, name, 1, journal.run.derived_key(f"{pos}:{name}"))


def _tools(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    tools = args[3] if len(args) > 3 else kwargs.get("tools", [])
    return list(tools or [])


def _as_model_response(response: Response) -> ModelResponse:
    from agents.usage import Usage

    usage = Usage(requests=1)
    if response.usage is not None:
        usage = Usage(
            requests=1,
            input_tokens=response.usage.input_tokens,
            output_tokens=response.usage.output_tokens,
            total_tokens=response.usage.total_tokens,
        )
    return ModelResponse(output=list(response.output), usage=usage, response_id=response.id)


class _DurableProvider(ModelProvider):
    """Wraps the models the SDK looks up by name."""

    def __init__(self, inner: ModelProvider, state: _State) -> None:
        self.inner = inner
        self.state = state

    def get_model(self, model_name: str | None) -> Model:
        model = self.inner.get_model(model_name)
        return model if isinstance(model, DurableModel) else DurableModel(model, self.state)


def _parsed(tool_input: str) -> Any:
    try:
        return json.loads(tool_input) if tool_input else {}
    except ValueError:
        return tool_input


def _wrap_tool(tool: FunctionTool, state: _State) -> FunctionTool:
    invoke_tool = tool.on_invoke_tool

    async def on_invoke_tool(ctx: ToolContext[Any], tool_input: str) -> Any:
        journal = current_journal()
        if journal is None:
            return await invoke_tool(ctx, tool_input)
        call_id = ctx.tool_call_id
        args = {"args": _parsed(tool_input), "call_id": call_id}
        pos = state.tool_positions.pop(call_id, None) or journal.position()
        found = journal.check(pos, "tool", tool.name, args, check_args=True)
        refused = state.refused.pop(call_id, None)

        async def invoke(call: Call) -> Outcome:
            if refused is not None:
                value: Any = f"The call was not approved: {refused}"
            else:
                with step_body(journal, call):
                    value = await invoke_tool(ctx, tool_input)
            return Outcome.of(encode_value(f"tool {tool.name!r}", value), value)

        return await journal.operation(
            "tool",
            tool.name,
            args,
            invoke,
            position=pos,
            found=found,
            decode=decode_value,
            lazy=True,
        )

    needs = tool.needs_approval
    if not needs:
        return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)

    async def needs_approval(ctx: Any, params: dict[str, Any], call_id: str) -> bool:
        required = needs if isinstance(needs, bool) else await needs(ctx, params, call_id)
        journal = current_journal()
        if not required or journal is None:
            return bool(required)
        pos = state.approval_positions.pop(call_id, None) or journal.position()
        decision = ask_approval(journal, pos, tool.name, call_id, params)
        if decision is None:
            state.pending.append({"call_id": call_id, "tool": tool.name, "arguments": params})
            return True
        if decision is not True:
            state.refused[call_id] = decision if isinstance(decision, str) else "refused"
        return False

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool, needs_approval=needs_approval)


class _DurableMCPServer(MCPServer):
    """An MCP server whose tool calls are operations of the current workflow run (its
    tool list recorded too); everything else is the wrapped server's."""

    def __init__(self, server: MCPServer, state: _State) -> None:  # no super(): a proxy
        self._server = server
        self._state = state

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    @property
    def name(self) -> str:
        return self._server.name

    async def connect(self) -> None:
        await self._server.connect()  # type: ignore[no-untyped-call]

    async def cleanup(self) -> None:
        await self._server.cleanup()  # type: ignore[no-untyped-call]

    async def list_tools(self, *args: Any, **kwargs: Any) -> Any:
        return await self._server.list_tools(*args, **kwargs)

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None, *args: Any, **kwargs: Any
    ) -> Any:
        journal = current_journal()
        if journal is None:
            return await self._server.call_tool(tool_name, arguments, *args, **kwargs)
        from mcp.types import CallToolResult

        async def invoke(call: Call) -> Outcome:
            with step_body(journal, call):
                result = await self._server.call_tool(tool_name, arguments, *args, **kwargs)
            return Outcome.of(result.model_dump(mode="json"), result)

        return await journal.operation(
            "tool",
            f"mcp:{self._server.name}:{tool_name}",
            {"args": arguments},
            invoke,
            decode=CallToolResult.model_validate,
            lazy=True,
        )

    async def list_prompts(self, *args: Any, **kwargs: Any) -> Any:
        return await self._server.list_prompts(*args, **kwargs)

    async def get_prompt(self, *args: Any, **kwargs: Any) -> Any:
        return await self._server.get_prompt(*args, **kwargs)


def _wrap_agent(agent: Agent[Any], state: _State, seen: dict[int, Agent[Any]]) -> Agent[Any]:
    """A clone of ``agent`` (and of the agents it hands off to) made durable."""
    if id(agent) in seen:
        return seen[id(agent)]
    changes: dict[str, Any] = {}
    if isinstance(agent.model, Model) and not isinstance(agent.model, DurableModel):
        changes["model"] = DurableModel(agent.model, state)
    changes["tools"] = [
        _wrap_tool(t, state) if isinstance(t, FunctionTool) else t for t in agent.tools
    ]
    changes["mcp_servers"] = [
        s if isinstance(s, _DurableMCPServer) else _DurableMCPServer(s, state)
        for s in agent.mcp_servers
    ]
    clone = agent.clone(**changes)
    seen[id(agent)] = clone
    handoffs: list[Any] = []
    for handoff in agent.handoffs:
        if isinstance(handoff, Agent):
            handoffs.append(_wrap_agent(handoff, state, seen))
        elif isinstance(handoff, Handoff):
            handoffs.append(_wrap_handoff(handoff, state, seen))
        else:
            handoffs.append(handoff)
    clone.handoffs = handoffs
    return clone


def _wrap_handoff(
    handoff: Handoff[Any, Any], state: _State, seen: dict[int, Agent[Any]]
) -> Handoff[Any, Any]:
    original = handoff.on_invoke_handoff

    async def on_invoke_handoff(*args: Any, **kwargs: Any) -> Any:
        agent = await original(*args, **kwargs)
        return _wrap_agent(agent, state, seen) if isinstance(agent, Agent) else agent

    return dataclasses.replace(handoff, on_invoke_handoff=on_invoke_handoff)


def _prepared(
    starting_agent: Agent[Any], kwargs: dict[str, Any], state: _State
) -> tuple[Agent[Any], dict[str, Any]]:
    if not isinstance(starting_agent, Agent):
        raise UserError(f"DurableRunner runs an agents.Agent, got {starting_agent!r:.80}")
    config = kwargs.pop("run_config", None) or RunConfig()
    provider = config.model_provider or MultiProvider()
    changes: dict[str, Any] = {"model_provider": _DurableProvider(provider, state)}
    if isinstance(config.model, Model) and not isinstance(config.model, DurableModel):
        changes["model"] = DurableModel(config.model, state)
    kwargs["run_config"] = dataclasses.replace(config, **changes)
    return _wrap_agent(starting_agent, state, {}), kwargs


def _check_finished(result: RunResult, state: _State, journal: OperationJournal) -> None:
    if result.interruptions:
        calls = state.pending or [
            {
                "call_id": getattr(getattr(i, "raw_item", None), "call_id", None),
                "tool": getattr(i, "name", None),
            }
            for i in result.interruptions
        ]
        ids = ", ".join(str(c["call_id"]) for c in calls)
        raise ApprovalPendingError(
            f"run {journal.key!r} waits for approval of tool call(s) {ids}; approve each with "
            f"`stepstone approve {journal.key} CALL_ID` (or --deny 'why'), then run it again",
            calls=calls,
        )


def _jsonable(value: Any) -> Any:
    from pydantic_core import to_jsonable_python

    try:
        return to_jsonable_python(value)
    except Exception:  # noqa: BLE001 - a final output pydantic cannot dump is kept as text
        return str(value)


class DurableRunner:
    """A drop-in for ``agents.Runner`` whose runs survive crashes.

    Inside a ``@workflow`` body, ``await DurableRunner.run(agent, input)`` journals the run
    in the workflow's own journal. Anywhere else, pass where to record it:
    ``DurableRunner.run(agent, input, store=store, key="ticket-42")`` is a workflow run of
    its own under ``key``: running the key again resumes it (committed model answers and
    tool results are replayed, not requested again), or returns a finished run's recorded
    output (:class:`RecordedRunResult`).

    Every other keyword goes to ``Runner.run`` (``context``, ``max_turns``, ``hooks``,
    ``run_config``...).

    Raises:
        ApprovalPendingError: the run stopped on tool calls that need approval; approve
            them (``stepstone approve KEY CALL_ID``) and run the key again.
    """

    @classmethod
    async def run(
        cls,
        starting_agent: Agent[Any],
        input: Any,
        *,
        store: Store | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> RunResult | RecordedRunResult:
        journal = current_journal()
        if store is None and key is None:
            if journal is None:
                raise UserError(
                    "DurableRunner.run needs a place to record the run: call it inside a "
                    "@workflow body, or pass store=Store(db='app.sqlite') and key='...' "
                    "(use agents.Runner.run for a run that need not survive a crash)"
                )
            return await cls._run_here(journal, starting_agent, input, kwargs)
        if store is None or key is None:
            raise UserError(
                "DurableRunner.run takes store= and key= together (the run's store and key)"
            )
        holder: list[RunResult] = []

        async def body() -> Any:
            inner = current_journal()
            assert inner is not None
            result = await cls._run_here(inner, starting_agent, input, dict(kwargs))
            holder.append(result)
            return {
                "final_output": _jsonable(result.final_output),
                "last_agent": result.last_agent.name,
            }

        argdata = {"agent": starting_agent.name, "input": _jsonable(input)}
        recorded = await run_workflow(WORKFLOW_NAME, body, store, key, (), {}, argdata)
        if holder:
            return holder[0]
        return RecordedRunResult(
            key=key,
            final_output=recorded.get("final_output") if isinstance(recorded, dict) else recorded,
            last_agent_name=recorded.get("last_agent") if isinstance(recorded, dict) else None,
        )

    @classmethod
    async def _run_here(
        cls,
        journal: OperationJournal,
        starting_agent: Agent[Any],
        input: Any,
        kwargs: dict[str, Any],
    ) -> RunResult:
        state = _State()
        agent, kwargs = _prepared(starting_agent, kwargs, state)
        result = await Runner.run(agent, input, **kwargs)
        _check_finished(result, state, journal)
        return result

    @classmethod
    def run_sync(
        cls,
        starting_agent: Agent[Any],
        input: Any,
        *,
        store: Store | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> RunResult | RecordedRunResult:
        """Sync :meth:`run` (refused inside a running event loop: await ``run`` there)."""
        return run_sync(
            cls.run(starting_agent, input, store=store, key=key, **kwargs),
            sync_name="DurableRunner.run_sync()",
            async_name="DurableRunner.run(...)",
        )

    @classmethod
    def run_streamed(
        cls,
        starting_agent: Agent[Any],
        input: Any,
        *,
        stream_to: str | None = None,
        **kwargs: Any,
    ) -> RunResultStreaming:
        """``Runner.run_streamed`` inside a workflow's body: the events stream live, each
        model answer and tool call is journaled as in :meth:`run` (a replayed model answer
        comes as one completed-response event).

        Args:
            stream_to: A run stream of the workflow to append each live model event to
                (the Responses API event as JSON: ``{"type":
                "response.output_text.delta", "delta": "..."...}``), for readers in other
                processes (``RunHandle.read_stream``, ``stepstone stream``). A replayed
                answer writes nothing again. Journal nothing per streamed event in the
                workflow's body: a replayed answer comes as one event, not as its deltas.
        """
        if stream_to is not None:
            check_name("stream name", stream_to)
        if "store" in kwargs or "key" in kwargs:
            raise UserError(
                "DurableRunner.run_streamed runs inside a @workflow body (the workflow's "
                "store and key record it); call it there without store= and key="
            )
        if current_journal() is None:
            raise UserError(
                "DurableRunner.run_streamed needs a workflow to record the run: call it inside "
                "a @workflow body (or use agents.Runner.run_streamed for a run that need not "
                "survive a crash)"
            )
        state = _State(stream_to)
        agent, kwargs = _prepared(starting_agent, kwargs, state)
        return Runner.run_streamed(agent, input, **kwargs)
