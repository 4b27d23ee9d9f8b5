"""The workflow engine: durable functions on plain Python (``@workflow``, ``@step``).

A workflow run is a kernel run of kind ``"workflow"``; its steps, child workflows and
patches are operations of the kernel's operation journal
(:mod:`stepstone.durable._operations`), replayed on resume.
"""

from stepstone.engines.workflow._api import (
    BoundWorkflow,
    StepContext,
    Workflow,
    WorkflowStep,
    deprecate_patch,
    patched,
    queued_args,
    step,
    step_body,
    step_context,
    workflow,
)
from stepstone.engines.workflow._run import WORKFLOW_KIND, run_workflow
from stepstone.engines.workflow._view import workflow_view

__all__ = [
    "WORKFLOW_KIND",
    "BoundWorkflow",
    "StepContext",
    "Workflow",
    "WorkflowStep",
    "deprecate_patch",
    "patched",
    "queued_args",
    "run_workflow",
    "step",
    "step_body",
    "step_context",
    "workflow",
    "workflow_view",
]
