"""``StepstoneDurability``: pydantic-ai agents made durable by a stepstone workflow.

Built on pydantic-ai's public durable-execution surface (``pydantic_ai.durable_exec``): the
capability subclasses ``BaseDurabilityCapability``, which routes every model request, tool
call, tool discovery and event-stream handler call of a run through a durable operation
backend; ours is a ``CallableOperationBackend`` whose ``execute`` runs each of them as one
operation of the workflow run the agent is in (the kernel's ``current_journal()``).

Inside a workflow's body:

* a tool call and a capability's durable operation each commit an intent before they
  run and an outcome after (the outcome rides with the next intent's commit): on resume
  a recorded outcome is replayed and the call is not made again;
* a model request, tool-argument validation, tool discovery and event-stream handler calls
  are recorded after they ran, committed with the next operation (a crash before that
  commit makes them again, as it would a call in flight), so a turn of the tool loop
  costs one commit;
* values are journaled as JSON (``JSON_CODEC``), under the names
  :class:`pydantic_ai.durable_exec.JournalOperationNamer` gives (``support__model.request``,
  ``support__function_toolset__tools.call_tool:refund``...): persisted data, pinned by a
  test.

Outside a workflow the capability is transparent: the agent runs as it would without it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal, TypedDict, cast

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolDenied
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    CallableOperationBackend,
    CapabilityOperationId,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    EventStreamHandlerId,
    JournalOperationNamer,
    ModelCancelSuspendedResponseId,
    ModelCompactMessagesId,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    ToolsetGetInstructionsId,
    ToolsetGetToolsId,
    ToolsetValidateToolArgumentsId,
    conversation_id_from_run_id,
)
from pydantic_ai.messages import AgentStreamEvent
from pydantic_ai.models import Model
from pydantic_ai.tools import AgentDepsT, RunContext
from pydantic_core import to_jsonable_python

from stepstone.durable._operations import Call, OperationJournal, Outcome, current_journal
from stepstone.durable._time import write_stream
from stepstone.engines.workflow import step_body
from stepstone.exceptions import ApprovalPendingError, ConfigurationError, UserError
from stepstone.integrations._approval import ask_approval
from stepstone.integrations._turns import turn_summary

__all__ = [
    "StepConfig",
    "StepstoneDurability",
    "StepstoneOperationBackend",
    "approval_results",
    "stream_events_to",
]

InDoubt = Literal["rerun", "fail"]


class StepConfig(TypedDict, total=False):
    """How stepstone journals one kind of call (``StepstoneDurability(tool_config=...)``, or
    per tool in its metadata: ``@agent.tool(metadata={"stepstone": {"in_doubt": "fail"}})``,
    or ``{"stepstone": False}`` for a tool that runs again on every replay).

    Keys:
        in_doubt: A call a crash cut short (started, no recorded outcome): ``"rerun"`` it
            on resume (the default; ``stepstone.step_context().idempotency_key`` is the
            same for every attempt), or ``"fail"`` (the run stops with
            ``EffectInDoubtError`` until it is settled by hand).
    """

    in_doubt: InDoubt


#: Operations recorded after they ran, without an intent commit of their own: a crash
#: before the next commit asks them again, as it would one in flight. A model request is
#: one: an intent committed first would cost a commit per turn and change nothing (a
#: request cut short is sent again either way).
_LIGHT = frozenset({"model", "validate", "discover", "event"})


def _jsonable(value: Any) -> Any:
    try:
        return to_jsonable_python(value)
    except Exception:  # noqa: BLE001 - shown only; a value pydantic cannot dump shows as text
        return repr(value)


def _shape(operation_id: DurableOperationId, cache_key: tuple[object, ...]) -> tuple[str, Any]:
    """The operation kind and the arguments its intent records (what the inspector shows
    and, for a tool call, what a replay checks)."""
    match operation_id:
        case ModelRequestId(model_id=model_id, streaming=streaming):
            return "model", {"model": model_id, "stream": streaming}
        case ModelCompactMessagesId(model_id=model_id):
            return "model", {"model": model_id, "compact": True}
        case ModelCancelSuspendedResponseId(model_id=model_id):
            return "model", {"model": model_id, "cancel": True}
        case ToolsetCallToolId():
            return "tool", {"tool": cache_key[0], "args": _jsonable(cache_key[1])}
        case ToolsetValidateToolArgumentsId():
            return "validate", {"tool": cache_key[0]}
        case ToolsetGetToolsId() | ToolsetGetInstructionsId():
            return "discover", None
        case EventStreamHandlerId():
            event = cache_key[0] if cache_key else None
            return "event", {"event": getattr(event, "event_kind", type(event).__name__)}
        case CapabilityOperationId(capability_id=capability_id, operation=operation):
            return "capability", {"capability": capability_id, "operation": operation}
        case _:  # the union grows in minor releases: a full operation, named by pydantic-ai
            return "operation", None


def _response_dict(payload: Any) -> dict[str, Any] | None:
    """The JSON of the ``ModelResponse`` a model operation returned (streamed or not)."""
    if isinstance(payload, dict):
        if isinstance(payload.get("parts"), list):
            return payload
        for value in payload.values():
            if isinstance(value, dict) and isinstance(value.get("parts"), list):
                return value
    return None


def model_turn_summary(payload: Any) -> dict[str, Any] | None:
    """Model, provider, tokens, cost, tool calls and text of a recorded model response."""
    response = _response_dict(payload)
    if response is None:
        return None
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    assert isinstance(usage, dict)
    calls: list[tuple[str, Any]] = []
    texts: list[str] = []
    for part in response["parts"]:
        if not isinstance(part, dict):
            continue
        kind = part.get("part_kind")
        if kind in ("tool-call", "builtin-tool-call"):
            calls.append((str(part.get("tool_name")), part.get("args")))
        elif kind == "text" and isinstance(part.get("content"), str):
            texts.append(part["content"])
    return turn_summary(
        model=response.get("model_name"),
        provider=response.get("provider_name"),
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        cache_read_tokens=int(usage.get("cache_read_tokens") or 0),
        cache_write_tokens=int(usage.get("cache_write_tokens") or 0),
        tool_calls=calls,
        text="".join(texts) or None,
    )


class StepstoneOperationBackend(CallableOperationBackend[StepConfig]):
    """Runs each durable unit pydantic-ai hands it as one operation of the current
    workflow run (see the module docstring); outside a workflow, just runs it."""

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: StepConfig,
    ) -> object:
        journal = current_journal()
        if journal is None:
            return await body()
        op, args = _shape(operation_id, cache_key)
        if op in _LIGHT:
            return await _light(journal, op, name, args, body)
        in_doubt: InDoubt = (config or {}).get("in_doubt", "rerun")

        async def invoke(call: Call) -> Outcome:
            with step_body(journal, call):
                payload = await body()
            return Outcome.of(payload, payload)

        return await journal.operation(
            op,
            name,
            args,
            invoke,
            check_args=op == "tool",
            in_doubt=in_doubt,
            wait=in_doubt == "fail",
            lazy=True,
        )


async def _light(
    journal: OperationJournal,
    op: str,
    name: str,
    args: Any,
    body: Callable[[], Awaitable[object]],
) -> object:
    """A call recorded after it ran (validation, discovery, an event handed to a handler):
    replayed when recorded, else run and recorded with the next commit."""
    pos, found = journal.lookup(op, name, args, check_args=False)
    if found is not None and found.outcome is not None:
        return journal.recorded_value(found, _same)
    started = time.perf_counter()
    call = Call(journal.key, pos, name, 1, journal.run.derived_key(f"{pos}:{name}"))
    with step_body(journal, call):
        payload = await body()
    ms = round((time.perf_counter() - started) * 1000, 3)
    summary = model_turn_summary(payload) if op == "model" else None
    journal.record_done(pos, op, name, args, payload, ms=ms, summary=summary)
    return payload


def _same(value: Any) -> Any:
    return value


@dataclasses.dataclass(init=False, kw_only=True)
class StepstoneDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes a pydantic-ai agent durable inside a stepstone workflow.

    ``Agent(..., name="support", capabilities=[StepstoneDurability()])``; then
    ``await agent.run(...)`` inside a ``@workflow`` body journals every model request and
    tool call of the run, and a resumed workflow replays them instead of calling again.
    Outside a workflow the agent runs as it would without the capability.

    Args:
        models: More models by id, for ``agent.run(model=...)`` inside a workflow (the
            agent's own model is always available; model-name strings need no entry).
        event_stream_handler: Called with the run's events: model events live inside the
            model request, each tool event recorded as an operation of its own.
        name: The name the run's operations are journaled under (default: the agent's
            ``name``). Persisted: renaming the agent strands runs in flight.
        tool_config: How tool calls are journaled (:class:`StepConfig`); per tool, in its
            metadata under ``"stepstone"``.
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="stepstone",
        durable_unit_noun="step",
        durable_unit_plural="steps",
        durable_container_noun="workflow",
        codec=JSON_CODEC,
        # Tools added for one run inside a workflow would run outside the journal.
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        # An MCP server keeps one session for the run: entered by its first operation.
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        tool_call_result_upgrade_lenient=False,
        journal_discovery=True,
        sequential_tools_in_durable_context=False,
        tool_config_key="stepstone",
    )

    def __init__(
        self,
        *,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        name: str | None = None,
        tool_config: StepConfig | None = None,
    ) -> None:
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self._tool_config: StepConfig = _checked_config("tool_config", tool_config or {})
        self._backend: StepstoneOperationBackend | None = None

    @property
    def in_durable_context(self) -> bool:
        """Whether the calling code is a workflow's body (not one of its steps' bodies)."""
        return current_journal() is not None

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        if self._backend is None:
            base = self._tool_config

            def resolve_tool(
                operation_id: DurableOperationId, tool: object | None, tool_name: str
            ) -> StepConfig | Literal[False]:
                tool_def = getattr(tool, "tool_def", None)
                metadata = getattr(tool_def, "metadata", None) or {}
                own = metadata.get("stepstone") if isinstance(metadata, dict) else None
                if own is False:
                    return False
                if own is None:
                    return base
                return {**base, **_checked_config(f"tool {tool_name!r} metadata", own)}

            self._backend = StepstoneOperationBackend(
                namer=self.namer,
                config=RoleBasedOperationConfig(
                    model={}, event={}, capability={}, tool=base, resolve_tool=resolve_tool
                ),
            )
        return self._backend

    @property
    def namer(self) -> JournalOperationNamer:
        """The names the run's operations are journaled under (persisted data)."""
        default_model = self.default_model_id or "default"
        return JournalOperationNamer(self.name, default_model_id=default_model)

    def get_default_run_id(self) -> str | None:
        """The run id of an agent run started in a workflow's body: its own position there,
        recorded, so a resume gives the run the same id (and a run started at another
        place another one)."""
        journal = current_journal()
        if journal is None:
            return None
        return journal.child_key("agent", self.name)

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        """When the run first started (from its recorded position), so ``timeout=`` counts
        from then across resumes."""
        journal = current_journal()
        if journal is None or not run_id.startswith(journal.key + "/"):
            return None
        entry = journal.entries.get(run_id[len(journal.key) + 1 :])
        at = None if entry is None else entry.intent.get("at")
        return datetime.fromtimestamp(at, UTC) if isinstance(at, int | float) else None


def _checked_config(what: str, config: Any) -> StepConfig:
    if not isinstance(config, dict):
        raise ConfigurationError(
            f"{what} must be a dict like {{'in_doubt': 'fail'}} (or False in a tool's metadata "
            f"to leave the tool out of the journal), got {config!r:.80}"
        )
    unknown = set(config) - {"in_doubt"}
    if unknown:
        raise ConfigurationError(
            f"{what} has unknown keys {sorted(unknown)}; the one key is 'in_doubt' "
            "('rerun' or 'fail')"
        )
    in_doubt = config.get("in_doubt", "rerun")
    if in_doubt not in ("rerun", "fail"):
        raise ConfigurationError(
            f"{what} in_doubt must be 'rerun' (run a call a crash cut short again) or 'fail' "
            f"(stop the run until it is settled by hand), got {in_doubt!r}"
        )
    return cast(StepConfig, dict(config))


def approval_results(requests: DeferredToolRequests) -> DeferredToolResults:
    """The decisions for the tool calls an agent run deferred for approval, asked through
    the workflow's journal: inside a workflow's body, each call is asked at a position of
    its own; a call nobody decided yet stops the run (``ApprovalPendingError``, the run is
    ``paused``) until ``stepstone approve KEY CALL_ID`` (or ``--deny 'why'``) decides it,
    from any process; running the key again then continues with the decisions.

    ::

        result = await agent.run(ticket, output_type=[str, DeferredToolRequests])
        if isinstance(result.output, DeferredToolRequests):
            result = await agent.run(
                message_history=result.all_messages(),
                deferred_tool_results=approval_results(result.output),
            )

    Raises:
        ApprovalPendingError: a call has no decision yet (all of them are asked first).
        UserError: called outside a workflow's body.
    """
    journal = current_journal()
    if journal is None:
        raise UserError(
            "approval_results() asks through a workflow's journal: call it inside a "
            "@workflow body (outside one, decide with DeferredToolResults yourself)"
        )
    decided: dict[str, bool | ToolDenied] = {}
    pending: list[dict[str, Any]] = []
    for part in requests.approvals:
        arguments = part.args_as_dict()
        decision = ask_approval(
            journal, journal.position(), part.tool_name, part.tool_call_id, arguments
        )
        if decision is None:
            pending.append(
                {"call_id": part.tool_call_id, "tool": part.tool_name, "arguments": arguments}
            )
        elif decision is True:
            decided[part.tool_call_id] = True
        else:
            reason = decision if isinstance(decision, str) else "The tool call was denied."
            decided[part.tool_call_id] = ToolDenied(reason)
    if pending:
        ids = ", ".join(str(c["call_id"]) for c in pending)
        raise ApprovalPendingError(
            f"run {journal.key!r} waits for approval of tool call(s) {ids}; approve each with "
            f"`stepstone approve {journal.key} CALL_ID` (or --deny 'why'), then run it again",
            calls=pending,
        )
    return DeferredToolResults(approvals=dict(decided))


def stream_events_to(name: str) -> EventStreamHandler[Any]:
    """An event-stream handler that appends each event of a run, as JSON (pydantic-ai's
    own shape: ``{"event_kind": "part_delta", "delta": {...}, ...}``), to the run stream
    ``name`` of the workflow the agent runs in; read it from anywhere with
    ``RunHandle.read_stream(name)`` or ``stepstone stream KEY NAME``, while the run goes.

    ::

        live = StepstoneDurability(event_stream_handler=stream_events_to("events"))
        agent = Agent(..., capabilities=[live])

    Model events (text and tool-call deltas) are written live, as the model streams
    them; each tool event once, recorded with the run. A model answer replayed on resume
    writes nothing again; a request a crash cut short is sent again and its events are
    written again (each value carries its attempt).

    Raises:
        ConfigurationError: ``name`` is not a stream name a store can keep.
    """
    from stepstone.durable._messages import check_name

    check_name("stream name", name)

    async def handler(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in events:
            await write_stream(name, _jsonable(event))

    return handler
