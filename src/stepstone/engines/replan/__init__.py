"""ReplanEngine: a planner decides each round's tool calls; durable mid-round."""

from stepstone.engines.replan._engine import ReplanEngine
from stepstone.engines.replan._record import RECORD_VERSION, replan_view
from stepstone.engines.replan._schema import PlanRound, Task
from stepstone.exceptions import MaxRoundsExceeded, PlannerOutputError
from stepstone.store import register_run_view

register_run_view("replan", replan_view)

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
