"""The flow layer: guards over the State, steps and constraints, and the runner that advances
a flow the moment its guards hold."""

from . import guards, signals
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
from .ground import Ground
from .guards import *  # noqa: F403  (the names are guards.__all__)
from .runner import Admission, Enforcement, FlowExplanation, FlowRunner, Verdict, Violation
from .serialize import FLOW_FORMAT
from .steps import Edge, OnEnter, Step, edge, run

__all__ = [
    *guards.__all__,
    "FLOW_FORMAT",
    "Admission",
    "Before",
    "Commit",
    "Constraint",
    "Edge",
    "Enforcement",
    "Flow",
    "FlowExplanation",
    "FlowRunner",
    "Ground",
    "Never",
    "OnEnter",
    "Once",
    "Require",
    "Reset",
    "Step",
    "Verdict",
    "Violation",
    "before",
    "commit",
    "edge",
    "never",
    "once",
    "require",
    "reset",
    "run",
    "signals",
]
