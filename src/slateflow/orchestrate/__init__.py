"""The orchestrate layer: programmable multi-agent work over an executor seam.

Steps (:class:`AgentStepSpec`) are run by an :class:`AgentExecutor` (``LocalExecutor`` in this
process); ``execute_parallel``, ``execute_pipeline`` and ``execute_loop`` compose them as code,
and write each step's progress into a State like a resolver's. ``WorkflowBudget`` is the
ledger a workflow's model calls are checked against, and :mod:`.events` the lifecycle
vocabulary (budget and compaction events, JSON-compatible with layer0's). ``Workflow`` puts
them together; ``LocalOrchestrator`` implements the ``Orchestrator`` protocol, and
``AgentOrchestrator`` supervises long-lived agents. ``execute_parallel_resumable`` is the
fan-out that survives a crash: it journals each finished step as a JSON
:class:`WorkflowCheckpoint` in a checkpoint store and skips those steps on resume.
"""

from . import events
from .budget import BudgetSnapshot, WorkflowBudget, budget_event
from .checkpoint import (
    WORKFLOW_CHECKPOINT_SCHEMA_VERSION,
    WorkflowCheckpoint,
    WorkflowStepRecord,
    spec_digest,
)
from .combinators import (
    LoopDecision,
    PipelineStage,
    execute_loop,
    execute_parallel,
    execute_pipeline,
    run_step,
)
from .local import AgentFunction, LocalExecutor
from .metered import MeteredLLM
from .protocol import LocalOrchestrator, Orchestrator, QueryPayload, SignalPayload
from .resumable import execute_parallel_resumable
from .spec import AgentExecutor, AgentStepSpec, StepOutcome
from .supervise import (
    AgentOrchestrator,
    AgentStatus,
    DefaultSupervisor,
    OrchestratedHandle,
    PromptAgent,
    SupervisorAction,
    SupervisorPolicy,
    is_retryable,
)
from .workflow import (
    BudgetPolicy,
    SwappableLLM,
    Workflow,
    WorkflowBuilder,
    WorkflowEvent,
    default_policy,
)

__all__ = [
    "WORKFLOW_CHECKPOINT_SCHEMA_VERSION",
    "AgentExecutor",
    "AgentFunction",
    "AgentOrchestrator",
    "AgentStatus",
    "AgentStepSpec",
    "BudgetPolicy",
    "BudgetSnapshot",
    "DefaultSupervisor",
    "LocalExecutor",
    "LocalOrchestrator",
    "LoopDecision",
    "MeteredLLM",
    "OrchestratedHandle",
    "Orchestrator",
    "PipelineStage",
    "PromptAgent",
    "QueryPayload",
    "SignalPayload",
    "StepOutcome",
    "SupervisorAction",
    "SupervisorPolicy",
    "SwappableLLM",
    "Workflow",
    "WorkflowBudget",
    "WorkflowBuilder",
    "WorkflowCheckpoint",
    "WorkflowEvent",
    "WorkflowStepRecord",
    "budget_event",
    "default_policy",
    "events",
    "execute_loop",
    "execute_parallel",
    "execute_parallel_resumable",
    "execute_pipeline",
    "is_retryable",
    "run_step",
    "spec_digest",
]
