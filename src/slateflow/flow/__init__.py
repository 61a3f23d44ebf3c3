"""The flow layer: guards over the State, steps and constraints, and the runner that advances
a flow the moment its guards hold."""

from . import guards, signals
from .admission import Admission, Enforcement, ToolRules, Violation
from .brief import Brief
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
from .explain import FlowExplanation
from .ground import Ground
from .guards import *  # noqa: F403  (the names are guards.__all__)
from .machine import Verdict
from .repair import RepairPolicy, escalate_key, reprompt_key
from .runner import FlowRunner
from .serialize import FLOW_FORMAT
from .stack import (
    OVER_KEY,
    OVERLAY_KEY,
    TERMINATED_KEY,
    Digression,
    FlowStack,
    StackRunner,
    Then,
)
from .steps import Edge, OnEnter, Step, edge, run
from .timing import DEFAULT_REPROMPT, VoiceTiming

__all__ = [
    *guards.__all__,
    "DEFAULT_REPROMPT",
    "FLOW_FORMAT",
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
    "Flow",
    "FlowExplanation",
    "FlowRunner",
    "FlowStack",
    "Ground",
    "Never",
    "OnEnter",
    "Once",
    "RepairPolicy",
    "Require",
    "Reset",
    "Then",
    "StackRunner",
    "Step",
    "ToolRules",
    "Verdict",
    "Violation",
    "VoiceTiming",
    "before",
    "commit",
    "edge",
    "escalate_key",
    "never",
    "once",
    "require",
    "reprompt_key",
    "reset",
    "run",
    "signals",
]
