"""Core value types shared by every layer: Envelope, sentinels, tools, serialization."""

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
