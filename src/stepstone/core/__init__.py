"""Core value types shared by every layer: Envelope, sentinels, tools, serialization."""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

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


def __getattr__(name: str) -> _Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
