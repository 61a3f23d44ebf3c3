"""The flow layer: guards over the State, steps and constraints, and the runner that advances
a flow the moment its guards hold."""

from . import signals
from .admission import Admission, Enforcement, ToolRules, Violation
from .brief import Brief
from .comparisons import between, eq, ge, gt, le, lt
from .constraints import (
    Before,
    Commit,
    Constraint,
    Never,
    Once,
    Require,
    Reset,
    before,
    commit,
    never,
    once,
    require,
    reset,
)
from .definition import Flow
from .digressions import Digression, FlowStack, Then
from .explain import FlowExplanation
from .ground import Ground
from .guard_base import (
    EMPTY_MARKING,
    GUARD_FORMAT,
    Explanation,
    Guard,
    Marking,
    MarkingRefs,
    all_,
    any_,
    custom,
    not_,
)
from .guards import (
    active,
    always,
    called_ok,
    captured,
    done,
    entered,
    failed,
    fresh,
    is_set,
    is_true,
    pending,
    resolved,
    told,
)
from .machine import Verdict
from .repair import RepairPolicy, escalate_key, reprompt_key
from .runner import FlowRunner
from .serialize import FLOW_FORMAT
from .stack import OVER_KEY, OVERLAY_KEY, TERMINATED_KEY, StackRunner
from .steps import ANY_TOOL, Edge, OnEnter, Step, edge, run
from .timing import DEFAULT_REPROMPT, VoiceTiming

__all__ = [
    "ANY_TOOL",
    "DEFAULT_REPROMPT",
    "EMPTY_MARKING",
    "FLOW_FORMAT",
    "GUARD_FORMAT",
    "OVERLAY_KEY",
    "OVER_KEY",
    "TERMINATED_KEY",
    "Admission",
    "Before",
    "Brief",
    "Commit",
    "Constraint",
    "Digression",
    "Edge",
    "Enforcement",
    "Explanation",
    "Flow",
    "FlowExplanation",
    "FlowRunner",
    "FlowStack",
    "Ground",
    "Guard",
    "Marking",
    "MarkingRefs",
    "Never",
    "OnEnter",
    "Once",
    "RepairPolicy",
    "Require",
    "Reset",
    "StackRunner",
    "Step",
    "Then",
    "ToolRules",
    "Verdict",
    "Violation",
    "VoiceTiming",
    "active",
    "all_",
    "always",
    "any_",
    "before",
    "between",
    "called_ok",
    "captured",
    "commit",
    "custom",
    "done",
    "edge",
    "entered",
    "eq",
    "escalate_key",
    "failed",
    "fresh",
    "ge",
    "gt",
    "is_set",
    "is_true",
    "le",
    "lt",
    "never",
    "not_",
    "once",
    "pending",
    "reprompt_key",
    "require",
    "reset",
    "resolved",
    "run",
    "signals",
    "told",
]
