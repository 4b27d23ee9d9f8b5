"""pydantic-ai agents made durable by stepstone (``pip install stepstone[pydantic-ai]``).

::

    from pydantic_ai import Agent
    from stepstone import workflow
    from stepstone.integrations.pydantic_ai import StepstoneDurability

    agent = Agent("openai:gpt-5.2", name="support", capabilities=[StepstoneDurability()])

    @workflow
    async def handle_ticket(ticket: str) -> str:
        result = await agent.run(ticket)      # durable inside a workflow; unchanged outside
        return result.output

See ``docs/integrations.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepstone.integrations.pydantic_ai._durability import (
        StepConfig,
        StepstoneDurability,
        StepstoneOperationBackend,
        approval_results,
        stream_events_to,
    )

__all__ = [
    "StepConfig",
    "StepstoneDurability",
    "StepstoneOperationBackend",
    "approval_results",
    "stream_events_to",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        import pydantic_ai.durable_exec  # noqa: F401
    except ImportError as exc:
        from stepstone.exceptions import MissingExtraError

        raise MissingExtraError("pydantic-ai-slim", "pydantic-ai") from exc
    from stepstone.integrations.pydantic_ai import _durability

    value = getattr(_durability, name)
    globals()[name] = value
    return value
