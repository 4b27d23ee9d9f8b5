"""Journaling the LLM loop: model turns and tool calls as effects of a durable run.

:class:`LoopHooks` is what ``LLMEngine._loop`` calls at each phase when it runs durably
(under a ``Runner``, or inside a Plan step or graph node with a store). It writes the
phase records, and its :class:`JournaledEffects` records every model completion and tool
call in the kernel's effect journal, replaying recorded outcomes on resume.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

from stepstone.core import Tool, payload_text
from stepstone.core._serialization import to_json_value
from stepstone.durable._agent_journal import AgentJournal
from stepstone.durable._effects import DurableScope, bind_scope, hash_json
from stepstone.engines.llm._calls import RunState
from stepstone.engines.llm._effects import EffectKey, _jsonable
from stepstone.exceptions import AgentCheckpointCorruptionError, PlanPaused
from stepstone.providers._pricing import estimate_cost
from stepstone.providers._types import (
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolResult,
    Usage,
)

__all__ = ["AgentPaused", "JournaledEffects", "LoopHooks", "decode_response", "encode_response"]

AWAITING_APPROVAL = "(awaiting approval: this call has not run)"


class AgentPaused(BaseException):
    """Internal signal: the run stopped for approvals (carries them)."""

    def __init__(self, pending: list[dict[str, Any]]) -> None:
        super().__init__(f"waiting for approval of {len(pending)} tool call(s)")
        self.pending = pending


class ReplayedToolError(Exception):
    """A tool failure replayed from the journal (shown to the model as the original was)."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


def encode_response(response: ModelResponse) -> dict[str, Any]:
    """A model response as JSON (``raw`` kept only when it is JSON already)."""
    try:
        raw = to_json_value(response.raw, warn=False, strict=True)
    except Exception:  # noqa: BLE001 - provider objects are not replayable: drop them
        raw = None
    return {
        "text": response.text,
        "tool_calls": [
            {
                "id": c.id,
                "name": c.name,
                "arguments": _jsonable(c.arguments),
                "raw": c.raw_arguments,
            }
            for c in response.tool_calls
        ],
        "usage": response.usage.to_dict(),
        "stop_reason": response.stop_reason,
        "model": response.model,
        "thinking": response.thinking,
        "raw": raw,
    }


def decode_response(data: Any) -> ModelResponse:
    """Undo :func:`encode_response`.

    Raises:
        ValueError: ``data`` is not an encoded response.
    """
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise ValueError(f"not a model response: {str(data)[:120]!r}")
    calls = data.get("tool_calls")
    if not isinstance(calls, list):
        raise ValueError("tool_calls is not a list")
    try:
        return ModelResponse(
            text=data["text"],
            tool_calls=[
                ToolCall(
                    id=str(c["id"]),
                    name=str(c["name"]),
                    arguments=dict(c.get("arguments") or {}),
                    raw_arguments=c.get("raw"),
                )
                for c in calls
            ],
            usage=Usage(**data.get("usage", {})),
            stop_reason=data.get("stop_reason"),
            model=data.get("model"),
            thinking=data.get("thinking") or "",
            raw=data.get("raw"),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed model response: {exc}") from exc


def _message_digest(message: Message) -> dict[str, Any]:
    # ``raw`` is left out: provider objects have no stable JSON form.
    return {
        "role": message.role,
        "text": message.text,
        "calls": [(c.id, c.name, _jsonable(c.arguments)) for c in message.tool_calls],
        "results": [(r.call_id, r.content, r.is_error) for r in message.tool_results],
    }


class JournaledEffects:
    """The effect handler of a durable loop: journal, replay, in-doubt policy, approvals."""

    def __init__(
        self,
        journal: AgentJournal,
        *,
        store_scope: DurableScope,
        decisions: dict[tuple[int, int, str], Any],
    ) -> None:
        self.journal = journal
        self.scope = store_scope
        self.decisions = decisions
        self.pending: list[dict[str, Any]] = []
        self.on_drained: Callable[[int], None] | None = None
        #: How many calls of the current tool batch run as effects (set by LoopHooks).
        self.batch_size = 0
        self._chain = ""
        self._hashed = 0
        # Outcomes a later model request depends on (a model answer, a refusal) recorded so
        # far, and how many of them a commit is known to hold: a tool call's commit holds
        # every row buffered before its outcome, and the model effect commits nothing itself.
        self._answered = 0
        self._held = 0

    @property
    def unsaved(self) -> bool:
        """Whether an outcome the next model request depends on is not committed yet."""
        return self._answered > self._held

    async def save(self) -> None:
        """Commit everything buffered (one group commit; none when nothing is)."""
        answered = self._answered
        await self.journal.flush()
        self._held = max(self._held, answered)

    def _model_hash(self, request: ModelRequest) -> str:
        # A chain over the messages added since the last turn: constant work per turn.
        new = [_message_digest(m) for m in request.messages[self._hashed :]]
        self._hashed = len(request.messages)
        head = {"model": request.model, "system": request.system, "turn": request.turn}
        self._chain = hash_json({"prev": self._chain, "new": new, **head})
        return self._chain

    async def model_call(
        self, key: EffectKey, invoke: Callable[[], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        """Replay the turn's recorded completion, or call the model and record it."""
        request: ModelRequest = key.input
        input_hash = self._model_hash(request)

        async def call() -> dict[str, Any]:
            return encode_response(await invoke())

        data, replayed = await self.journal.effect(
            kind="model",
            turn=key.turn,
            index=0,
            name=key.name,
            input_hash=input_hash,
            invoke=call,
            commit_intent=False,
            commit_outcome=False,
        )
        if not replayed:  # committed by the turn's first tool intent, else before the next turn
            self._answered += 1
        try:
            return decode_response(data)
        except ValueError as exc:
            raise AgentCheckpointCorruptionError(
                f"agent run {self.journal.run_id!r}: the recorded model response of turn "
                f"{key.turn} (pending_llm_response) cannot be decoded ({exc}); the model is "
                "not asked again for a committed turn. Start a new run under another run_id"
            ) from exc

    async def tool_call(self, key: EffectKey, invoke: Callable[[], Awaitable[Any]]) -> Any:
        """Replay the call's recorded outcome, or run it (after approval when required)."""
        tool: Tool | None = key.tool
        kind = "subagent" if tool is not None and tool.agent is not None else "tool"
        input_hash = hash_json({"name": key.name, "args": _jsonable(key.input)})
        j = self.journal
        recorded = j.recorded(
            kind=kind, turn=key.turn, index=key.index, name=key.name, input_hash=input_hash
        )
        if recorded is not None:
            j.replayed += 1
            return _decode_tool(recorded)
        answer = await self._approval(key, tool, kind, input_hash)
        if answer is not _RUN:
            return answer
        return await self._run(key, tool, kind, input_hash, invoke)

    async def _approval(self, key: EffectKey, tool: Tool | None, kind: str, input_hash: str) -> Any:
        """What a call that needs a person's decision gets: ``AWAITING_APPROVAL`` (none
        yet: the run pauses), a refusal as its result, or ``_RUN`` (approved, or none
        needed).

        A call that started before a crash and has no outcome is in doubt, approved or
        not: its in_doubt policy decides ("fail" raises in effect(), "rerun" runs it again
        under the same idempotency key), and "ask" asks a person again, saying it may have
        run; the approval it started with never answers that question."""
        if tool is None:
            return _RUN
        doubt = self.journal.in_doubt(kind, key.turn, key.index)
        if doubt:
            reason = "in_doubt" if tool.in_doubt == "ask" else None
        else:
            reason = "requires_approval" if tool.requires_approval else None
        if reason is None:
            return _RUN
        decision = self.decisions.get((key.turn, key.index, reason))
        if decision is None:
            self.pending.append(
                {
                    "call_id": key.call_id,
                    "tool": key.name,
                    # plain JSON, as the record holds it (a set as a list)
                    "arguments": to_json_value(_jsonable(key.input), warn=False),
                    "turn": key.turn,
                    "index": key.index,
                    "reason": reason,
                }
            )
            return AWAITING_APPROVAL
        if decision is not True:
            refusal = "refused" if decision is False else str(decision)
            data = {"error": {"type": "ApprovalDenied", "message": f"not approved: {refusal}"}}
            self.journal.record_outcome(
                kind=kind,
                turn=key.turn,
                index=key.index,
                name=key.name,
                input_hash=input_hash,
                data=data,
                call_id=key.call_id,
            )
            self._answered += 1  # the model sees the refusal: committed before it asks
            return _decode_tool(data)
        if doubt:
            # Approved to run again: commit this resume's records first, so the pause is
            # no longer the run's latest record. A crash inside this run of the call leaves
            # it in doubt again, to be asked about again; a retried resume carrying the
            # same decision does not run it a third time.
            await self.save()
        return _RUN

    async def _run(
        self,
        key: EffectKey,
        tool: Tool | None,
        kind: str,
        input_hash: str,
        invoke: Callable[[], Awaitable[Any]],
    ) -> Any:
        """Run the call as an effect (intent, call, outcome); a subagent runs in a scope of
        its own, and its pause for approvals pauses this run."""
        j = self.journal
        via = f"{kind}:{key.turn}:{key.index}/"
        child = (  # a subagent journals its own run, under a key of this call's position
            DurableScope(
                store=self.scope.store,
                key=f"{j.run.key}/{kind}:{key.turn}:{key.index}",
                approvals=child_approvals(self.scope.approvals, via),
            )
            if kind == "subagent"
            else None
        )

        async def call() -> dict[str, Any]:
            try:
                with bind_scope(child):
                    value = await invoke()
            except Exception as exc:  # noqa: BLE001 - recorded, then shown to the model
                return {
                    "error": {
                        "type": getattr(exc, "error_type", None) or type(exc).__name__,
                        "message": str(exc),
                    }
                }
            return {"content": payload_text(value)}

        covered = [self._answered]

        def drained() -> None:
            covered[0] = self._answered  # the outcome's commit holds the rows before it
            if not self.pending and self.on_drained is not None:
                self.on_drained(key.turn)

        policy = tool.in_doubt if tool is not None else "rerun"
        try:
            data, replayed = await j.effect(
                kind=kind,
                turn=key.turn,
                index=key.index,
                name=key.name,
                input_hash=input_hash,
                invoke=call,
                call_id=key.call_id,
                policy="rerun" if policy == "ask" else policy,
                after_outcome=drained,
                alone=self.batch_size == 1,
            )
        except PlanPaused as paused:
            if kind != "subagent":
                raise
            # The subagent waits for approvals of its own calls (its run is paused, its
            # call here has no outcome): this run pauses with them, each id prefixed with
            # the subagent call's position; a resume hands the decisions down to it.
            for p in getattr(paused, "pending_approvals", None) or []:
                self.pending.append(
                    {**p, "call_id": via + str(p["call_id"]), "via": via, "subagent": key.name}
                )
            return AWAITING_APPROVAL
        if not replayed:
            self._held = max(self._held, covered[0])
        return _decode_tool(data)


#: What :meth:`JournaledEffects._approval` answers for a call that may run.
_RUN = object()


def child_approvals(approvals: dict[str, Any], via: str) -> dict[str, Any]:
    """The decisions meant for the subagent called at ``via`` (``"subagent:T:I/"``), with
    that prefix taken off their call ids."""
    return {cid[len(via) :]: v for cid, v in approvals.items() if cid.startswith(via)}


def _decode_tool(data: dict[str, Any]) -> Any:
    error = data.get("error")
    if isinstance(error, dict):
        raise ReplayedToolError(str(error.get("type")), str(error.get("message")))
    return data.get("content", "")


@dataclasses.dataclass(kw_only=True)
class LoopHooks:
    """Phase records and snapshots of one durable loop (see ``LLMEngine._loop``).

    Commits per turn: the model's outcome rides with the tool intents (one commit, before
    any tool runs), and the tool outcomes share one group commit; the last outcome of a
    batch also carries the batch's closing records and the next turn's opening ones, so
    every phase record is committed before the next call starts. A turn that runs no tool
    has its answer committed when the next turn starts, before the next model request.
    """

    journal: AgentJournal
    effects: JournaledEffects
    provider: str
    requested_model: str
    context: dict[str, Any]
    max_turns: int = 1_000_000
    max_tool_calls_per_turn: int | None = None
    started_at_s: float = dataclasses.field(default_factory=time.time)
    final_text: str = ""
    _live_turn: int = -1
    _opened_turn: int = -1
    _closed_turn: int = -1
    _n_messages: int = 0
    _model: str = ""
    _state: RunState | None = None
    _batch: tuple[int, int, bool, bool] = (-1, 0, True, False)
    _expected: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.effects.on_drained = self._drained

    def snapshot(self, state: RunState, phase_state: str = "running") -> dict[str, Any]:
        """The runtime snapshot (counters; messages live in the journal as rows)."""
        model = state.model or self.requested_model
        return {
            "step": state.turns,
            "state": phase_state,
            "context": self.context,
            "llm_calls": state.turns,
            "tool_calls": state.tool_calls,
            "started_at_s": self.started_at_s,
            "usage": state.usage.to_dict(),
            "total_cost_usd": estimate_cost(model, state.usage),
            "session_token": None,
            "checkpoint_token": None,
            "requested_model": self.requested_model,
            "normalized_model": model,
            "provider_adapter": self.provider,
            "final_text": self.final_text,
            "final_structured": None,
            "replayed_effect_count": self.journal.replayed,
        }

    def _open_turn(self, turn: int, n_messages: int, model: str, state: RunState) -> None:
        """``step_started`` and ``pre_llm`` of ``turn``, with the runtime snapshot."""
        j = self.journal
        j.phase("step_started", {"state": "running", "message_count": n_messages, "step": turn})
        j.phase("pre_llm", {"model": model, "provider": self.provider, "message_count": n_messages})
        j.runtime_snapshot(self.snapshot(state))
        self._opened_turn = turn

    async def turn_started(self, request: ModelRequest, state: RunState) -> None:
        """Before the model call: ``step_started`` and ``pre_llm`` (not on replayed turns)."""
        j = self.journal
        j.turn = request.turn
        self._n_messages = len(request.messages)
        self._model = request.model
        self._state = state
        if j.has_outcome("model", request.turn):
            return
        self._live_turn = request.turn
        if self._opened_turn != request.turn:
            self._open_turn(request.turn, self._n_messages, request.model, state)
        if not j.async_writes or self.effects.unsaved:
            # Sync mode commits every record before the call; both modes commit the last
            # turn's answer when no tool intent did (a turn that ran no tool: an unknown
            # tool, bad arguments, a continued or repaired answer), or a refusal given to
            # the model. A no-op when the last tool outcome already carried them.
            await self.effects.save()

    def model_done(self, request: ModelRequest, response: ModelResponse, state: RunState) -> None:
        """After the model call: ``post_llm`` (committed with the tool intents)."""
        self.final_text = response.text
        if self._live_turn != request.turn:
            return
        self.journal.phase(
            "post_llm",
            {
                "model": response.model or request.model,
                "provider": self.provider,
                "finish_reason": response.stop_reason,
                "tool_call_count": len(response.tool_calls),
                "session_token": None,
                "checkpoint_token": None,
                "total_cost_usd": estimate_cost(request.model, state.usage),
            },
        )
        self.journal.runtime_snapshot(self.snapshot(state))

    def tools_started(self, turn: int, calls: list[ToolCall], tool_map: dict[str, Tool]) -> None:
        """``pre_tool_batch`` / ``pre_subagent_batch`` (committed with the intents)."""
        subs = [c for c in calls if _kind(tool_map, c) == "subagent"]
        kinds = (len(subs) < len(calls), bool(subs))
        self._batch = (turn, len(calls), *kinds)
        self._expected = tuple(
            f"{_kind(tool_map, c)}:{turn}:{i}"
            for i, c in enumerate(calls)
            if self._runs_as_effect(i, c, tool_map)
        )
        self.effects.batch_size = len(self._expected)
        if self._live_turn != turn and all(
            self.journal.has_outcome(_kind(tool_map, c), turn, i) for i, c in enumerate(calls)
        ):
            return
        self._live_turn = turn
        if kinds[0]:
            self.journal.phase("pre_tool_batch", {"tool_call_count": len(calls) - len(subs)})
        if kinds[1]:
            self.journal.phase("pre_subagent_batch", {"subagent_call_count": len(subs)})

    def _close_batch(self, turn: int, failures: int, n_results: int) -> None:
        """``post_tool_batch`` / ``post_subagent_batch`` of ``turn``'s calls."""
        _, _, tools, subs = self._batch
        state = self._state
        total = state.tool_calls if state is not None else n_results
        if tools:
            self.journal.phase(
                "post_tool_batch", {"tool_calls_total": total, "tool_failures": failures}
            )
        if subs:
            self.journal.phase("post_subagent_batch", {"subagent_calls": n_results})
        self._closed_turn = turn

    def _runs_as_effect(self, index: int, call: ToolCall, tool_map: dict[str, Tool]) -> bool:
        """Whether the tool batch will run this call through the effect handler (the
        others end at once as errors: unknown tool, bad arguments, over the per-turn cap)."""
        limit = self.max_tool_calls_per_turn
        tool = tool_map.get(call.name)
        if tool is None or call.raw_arguments is not None or (limit is not None and index >= limit):
            return False
        try:
            tool.validate_args(call.arguments)
        except Exception:  # noqa: BLE001 - the batch reports it to the model
            return False
        return True

    def _drained(self, turn: int) -> None:
        """A call just recorded its outcome; when it is the batch's last one, buffer the
        closing records and the next turn's opening ones, so the same commit carries them."""
        batch_turn, n_calls, _, _ = self._batch
        if batch_turn != turn or self._live_turn != turn or self._state is None:
            return
        if self._closed_turn == turn or any(
            pos not in self.journal.outcomes for pos in self._expected
        ):
            return
        outcomes = [
            o
            for i in range(n_calls)
            for kind in ("tool", "subagent")
            if (o := self.journal.outcomes.get(f"{kind}:{turn}:{i}")) is not None
        ]
        errors = sum(1 for o in outcomes if "error" in (o.get("data") or {}))
        self._close_batch(turn, errors + n_calls - len(outcomes), n_calls)
        if turn + 1 < self.max_turns:
            self._open_turn(turn + 1, self._n_messages + 2, self._model, self._state)

    async def tools_done(self, turn: int, results: list[ToolResult], state: RunState) -> None:
        """``post_tool_batch`` / ``post_subagent_batch``; stops the run for approvals."""
        pending = self.effects.pending
        if pending:
            self.effects.pending = []
            raise AgentPaused(pending)
        if self._live_turn != turn or self._closed_turn == turn:
            return
        self._close_batch(turn, sum(1 for r in results if r.is_error), len(results))


def _kind(tool_map: dict[str, Tool], call: ToolCall) -> str:
    tool = tool_map.get(call.name)
    return "subagent" if tool is not None and tool.agent is not None else "tool"
