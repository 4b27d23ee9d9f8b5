"""The Plan engine: deterministic steps, parallel bands, routing, checkpoint and resume."""

from stepstone.engines.plan._checkpoint import CHECKPOINT_VERSION
from stepstone.engines.plan._plan import Plan
from stepstone.engines.plan._step import Step
from stepstone.engines.plan._stream import StepToken
from stepstone.exceptions import PlanCompileError, PlanPaused, PlanRuntimeError

__all__ = [
    "CHECKPOINT_VERSION",
    "Plan",
    "PlanCompileError",
    "PlanPaused",
    "PlanRuntimeError",
    "Step",
    "StepToken",
]
