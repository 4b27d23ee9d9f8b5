"""OpenAI Agents SDK runs made durable by stepstone (``pip install stepstone[openai-agents]``).

::

    from agents import Agent, function_tool
    from stepstone.integrations.openai_agents import DurableRunner

    result = await DurableRunner.run(agent, "refund order 42", store=store, key="ticket-42")

See ``docs/integrations.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepstone.integrations.openai_agents._runner import DurableRunner, RecordedRunResult

__all__ = ["DurableRunner", "RecordedRunResult"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        import agents  # noqa: F401
    except ImportError as exc:
        from stepstone.exceptions import MissingExtraError

        raise MissingExtraError("openai-agents", "openai-agents") from exc
    from stepstone.integrations.openai_agents import _runner

    value = getattr(_runner, name)
    globals()[name] = value
    return value
