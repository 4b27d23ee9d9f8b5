"""ReplanEngine: a planner decides each round's tool calls; durable mid-round."""

from stepstone.engines.replan._engine import ReplanEngine
from stepstone.engines.replan._record import RECORD_VERSION
from stepstone.engines.replan._schema import PlanRound, Task
from stepstone.exceptions import MaxRoundsExceeded, PlannerOutputError

ReplanTask = Task

__all__ = [
    "RECORD_VERSION",
    "MaxRoundsExceeded",
    "PlanRound",
    "PlannerOutputError",
    "ReplanEngine",
    "ReplanTask",
    "Task",
]
