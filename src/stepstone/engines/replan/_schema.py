"""What a planner answers each round: a PlanRound of Tasks."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PlanRound", "Task"]


class Task(BaseModel):
    """One tool call the planner wants made this round (also exported as ``ReplanTask``).

    ``tool`` names a tool of the Agent (a function, an agent, any ``Tool``); ``kwargs`` go
    to it verbatim, so they must match its JSON schema. A tool that does not exist or
    kwargs that do not validate become an error in the history the planner sees next
    round, not a crash.

    Attributes:
        tool: The tool's name in the Agent's tool map.
        kwargs: Its keyword arguments.
        parallel: ``True``: runs concurrently with the round's other parallel tasks.
            ``False``: runs after them, one at a time, in the order given.

    Example::

        Task(tool="researcher", kwargs={"task": "find prior art on WAL shipping"})
        Task(tool="add", kwargs={"a": 3, "b": 7}, parallel=False)
    """

    model_config = ConfigDict(extra="forbid")

    tool: str
    kwargs: dict[str, Any] = Field(default_factory=dict)
    parallel: bool = True


class PlanRound(BaseModel):
    """The planner's answer for one round.

    Attributes:
        reasoning: Why these tasks (kept in the run record and shown to the planner later).
        tasks: What to run this round. Tasks that need this round's results belong in the
            next round, after the planner has seen them.
        done: ``True`` ends the run; ``final_answer`` becomes the result's payload and the
            round's tasks are not run.
        final_answer: The answer when ``done``.

    Example::

        PlanRound(
            reasoning="two independent look-ups first",
            tasks=[Task(tool="researcher", kwargs={"task": "A"}),
                   Task(tool="researcher", kwargs={"task": "B"})],
        )
        PlanRound(reasoning="both found", done=True, final_answer="A and B agree")
    """

    model_config = ConfigDict(extra="forbid")

    reasoning: str
    tasks: list[Task] = Field(default_factory=list)
    done: bool = False
    final_answer: str | None = None
