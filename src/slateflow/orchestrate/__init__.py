"""The orchestrate layer: programmable multi-agent work over an executor seam.

Steps (:class:`AgentStepSpec`) are run by an :class:`AgentExecutor` (``LocalExecutor`` in this
process); ``execute_parallel``, ``execute_pipeline`` and ``execute_loop`` compose them as code,
and write each step's progress into a State like a resolver's. Budgets, lifecycle events,
workflows and supervision build on these.
"""

from .combinators import (
    LoopDecision,
    PipelineStage,
    execute_loop,
    execute_parallel,
    execute_pipeline,
    run_step,
)
from .local import AgentFunction, LocalExecutor
from .spec import AgentExecutor, AgentStepSpec, StepOutcome

__all__ = [
    "AgentExecutor",
    "AgentFunction",
    "AgentStepSpec",
    "LocalExecutor",
    "LoopDecision",
    "PipelineStage",
    "StepOutcome",
    "execute_loop",
    "execute_parallel",
    "execute_pipeline",
    "run_step",
]
