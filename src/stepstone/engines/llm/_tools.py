"""Running the tool calls of one model turn: validation, concurrency, timeouts, errors."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from stepstone.core import Tool, ToolContext, payload_text
from stepstone.core._tool import bind_tool_context, reset_tool_context
from stepstone.engines.llm._effects import EffectHandler, EffectKey, bind_call_key
from stepstone.exceptions import (
    AgentCheckpointCorruptionError,
    CheckpointFlushError,
    ConcurrentRunError,
    EffectInDoubtError,
    ToolTimeoutError,
)
from stepstone.observability import EventType
from stepstone.providers._types import ToolCall, ToolResult

__all__ = ["ToolBatch"]

log = logging.getLogger("stepstone")

Emit = Callable[[EventType, dict[str, Any]], None]

_PREVIEW = 500

# Not the model's business: a durable run that cannot trust its journal, or lost it, stops.
_FATAL = (
    AgentCheckpointCorruptionError,
    CheckpointFlushError,
    ConcurrentRunError,
    EffectInDoubtError,
)


def _runs_in_thread(tool: Tool) -> bool:
    """Whether the tool is a sync function (run in a worker thread that cannot be stopped)."""
    return tool.fn is not None and not tool.is_async


def _preview(text: str) -> str:
    return text if len(text) <= _PREVIEW else text[:_PREVIEW] + "..."


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(arguments)"
        parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts)


@dataclasses.dataclass(kw_only=True)
class ToolBatch:
    """Runs one turn's tool calls concurrently and returns results in call order.

    Every failure the model can recover from (unknown tool, arguments that are not JSON or
    fail validation, the tool raising, ``tool_timeout``, calls beyond
    ``max_tool_calls_per_turn``) becomes an ``is_error`` result; cancellation and
    ``BaseException`` signals (``PlanPaused``) propagate and cancel the sibling calls.
    """

    tool_map: dict[str, Tool]
    effects: EffectHandler
    emit: Emit
    run_id: str
    max_parallel_tools: int | None
    max_tool_calls_per_turn: int | None
    tool_timeout: float | None

    async def run(self, turn: int, calls: list[ToolCall]) -> list[ToolResult]:
        """Run ``calls`` (one model turn) and return their results in the same order."""
        sem = (
            asyncio.Semaphore(self.max_parallel_tools)
            if self.max_parallel_tools is not None and len(calls) > self.max_parallel_tools
            else None
        )
        limit = self.max_tool_calls_per_turn

        async def one(index: int, call: ToolCall) -> ToolResult:
            if limit is not None and index >= limit:
                return self._refused(call, limit)
            if sem is None:
                return await self._call(turn, index, call)
            async with sem:
                return await self._call(turn, index, call)

        if len(calls) == 1:
            return [await one(0, calls[0])]
        tasks = [asyncio.ensure_future(one(i, c)) for i, c in enumerate(calls)]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _with_timeout(
        self, tool: Tool, args: dict[str, Any], call: ToolCall, turn: int, index: int
    ) -> Any:
        """Run ``tool`` under ``tool_timeout``; a sync tool's thread is left to finish."""
        assert self.tool_timeout is not None
        inner = asyncio.ensure_future(tool.invoke(args))
        try:
            return await asyncio.wait_for(asyncio.shield(inner), self.tool_timeout)
        except TimeoutError:
            if not _runs_in_thread(tool):
                inner.cancel()
                raise ToolTimeoutError(
                    f"tool {call.name!r} exceeded tool_timeout={self.tool_timeout}s "
                    f"(turn {turn}, call {index}) and was cancelled"
                ) from None
            inner.add_done_callback(lambda done: self._late(done, call, turn, index))
            raise ToolTimeoutError(
                f"tool {call.name!r} exceeded tool_timeout={self.tool_timeout}s (turn {turn}, "
                f"call {index}). It is a sync function and its thread cannot be stopped: it "
                "is still running and its effects may still happen, so do not assume it had "
                "no effect and do not simply call it again"
            ) from None
        except BaseException:
            inner.cancel()
            raise

    def _late(self, done: asyncio.Future[Any], call: ToolCall, turn: int, index: int) -> None:
        """Record what a timed-out sync tool did once its thread finished."""
        if done.cancelled():
            return
        error = done.exception()
        outcome = (
            {"ok": False, "error": type(error).__name__, "message": str(error)}
            if error is not None
            else {"ok": True, "result": _preview(payload_text(done.result()))}
        )
        log.warning(
            "stepstone: tool %r (run %s, turn %d, call %d) finished after its tool_timeout: %s",
            call.name,
            self.run_id,
            turn,
            index,
            outcome,
        )
        self.emit(
            EventType.TOOL_LATE_RESULT,
            {"tool": call.name, "call_id": call.id, "turn": turn, "index": index, **outcome},
        )

    def _refused(self, call: ToolCall, limit: int) -> ToolResult:
        content = (
            f"Error: only {limit} tool call(s) per turn are allowed; this call to "
            f"{call.name!r} was not run. Make at most {limit} call(s) per turn."
        )
        self.emit(
            EventType.TOOL_ERROR,
            {"tool": call.name, "call_id": call.id, "error": "max_tool_calls_per_turn"},
        )
        return ToolResult(call_id=call.id, name=call.name, content=content, is_error=True)

    def _error(self, call: ToolCall, turn: int, kind: str, message: str) -> ToolResult:
        self.emit(
            EventType.TOOL_ERROR,
            {
                "tool": call.name,
                "call_id": call.id,
                "turn": turn,
                "error": kind,
                "message": message,
            },
        )
        return ToolResult(
            call_id=call.id, name=call.name, content=f"Error: {kind}: {message}", is_error=True
        )

    async def _call(self, turn: int, index: int, call: ToolCall) -> ToolResult:
        self.emit(
            EventType.TOOL_CALL,
            {"tool": call.name, "call_id": call.id, "turn": turn, "arguments": call.arguments},
        )
        tool = self.tool_map.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tool_map)) or "none"
            return self._error(
                call, turn, "UnknownTool", f"no tool named {call.name!r}; available: {known}"
            )
        if call.raw_arguments is not None:
            return self._error(
                call,
                turn,
                "InvalidArguments",
                f"arguments must be a JSON object, got {call.raw_arguments[:200]!r}",
            )
        try:
            args = tool.validate_args(call.arguments)
        except ValidationError as exc:
            return self._error(call, turn, "InvalidArguments", _validation_message(exc))
        except (TypeError, ValueError) as exc:
            return self._error(call, turn, "InvalidArguments", str(exc))
        key = EffectKey(
            run_id=self.run_id,
            kind="tool",
            turn=turn,
            index=index,
            name=call.name,
            input=args,
            call_id=call.id,
            tool=tool,
        )
        ctx = ToolContext(
            idempotency_key=key.idempotency_key,
            run_id=self.run_id,
            turn=turn,
            index=index,
            call_id=call.id,
        )

        async def invoke() -> Any:
            token = bind_tool_context(ctx)
            try:
                with bind_call_key(key):
                    if self.tool_timeout is None:
                        return await tool.invoke(args)
                    return await self._with_timeout(tool, args, call, turn, index)
            finally:
                reset_tool_context(token)

        try:
            value = await self.effects.tool_call(key, invoke)
        except _FATAL:
            raise
        except Exception as exc:  # noqa: BLE001 - every tool failure is shown to the model
            kind = getattr(exc, "error_type", None) or type(exc).__name__
            return self._error(call, turn, kind, str(exc))
        text = payload_text(value)
        self.emit(
            EventType.TOOL_RESULT,
            {"tool": call.name, "call_id": call.id, "turn": turn, "result": _preview(text)},
        )
        return ToolResult(call_id=call.id, name=call.name, content=text)
