"""Core value types shared by every layer: Envelope, sentinels, tools, serialization."""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from stepstone.core._lazy import lazy_attributes as _lazy_attributes

if _TYPE_CHECKING:
    from stepstone.core._envelope import Envelope, ErrorInfo, payload_text
    from stepstone.core._run_context import RunContext, RunLocation
    from stepstone.core._sentinels import (
        Sentinel,
        from_parallel,
        from_parallel_all,
        from_prev,
        from_start,
        from_step,
    )
    from stepstone.core._serialization import SignedPickle
    from stepstone.core._tool import (
        AgentLike,
        Tool,
        ToolContext,
        build_tool_map,
        call_maybe_async,
        is_agent_like,
        tool,
    )

# Each name loads its module on first use (PEP 562): importing one module of the package
# does not import the others.
_LAZY: dict[str, str] = {
    "Envelope": "stepstone.core._envelope",
    "ErrorInfo": "stepstone.core._envelope",
    "payload_text": "stepstone.core._envelope",
    "RunContext": "stepstone.core._run_context",
    "RunLocation": "stepstone.core._run_context",
    "Sentinel": "stepstone.core._sentinels",
    "from_parallel": "stepstone.core._sentinels",
    "from_parallel_all": "stepstone.core._sentinels",
    "from_prev": "stepstone.core._sentinels",
    "from_start": "stepstone.core._sentinels",
    "from_step": "stepstone.core._sentinels",
    "SignedPickle": "stepstone.core._serialization",
    "AgentLike": "stepstone.core._tool",
    "Tool": "stepstone.core._tool",
    "ToolContext": "stepstone.core._tool",
    "build_tool_map": "stepstone.core._tool",
    "call_maybe_async": "stepstone.core._tool",
    "is_agent_like": "stepstone.core._tool",
    "tool": "stepstone.core._tool",
}


__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY, globals())


__all__ = [
    "AgentLike",
    "Envelope",
    "ErrorInfo",
    "RunContext",
    "RunLocation",
    "Sentinel",
    "SignedPickle",
    "Tool",
    "ToolContext",
    "build_tool_map",
    "call_maybe_async",
    "from_parallel",
    "from_parallel_all",
    "from_prev",
    "from_start",
    "from_step",
    "is_agent_like",
    "payload_text",
    "tool",
]
