"""Blinker signals a FlowRunner sends as its flow advances.

Each is sent with the runner as sender and keyword arguments ``flow`` (the flow's name) and,
for step signals, ``step`` (the step id). Connect to one runner with
``step_done.connect(fn, sender=runner)``, or to every runner by leaving ``sender`` out.
Receivers run in the thread whose write advanced the flow; one that raises is logged and the
others still run.
"""

from __future__ import annotations

from blinker import Namespace

__all__ = [
    "flow_completed",
    "flow_over",
    "step_done",
    "step_entered",
    "step_reset",
    "steps_changed",
]

_signals = Namespace()

step_entered = _signals.signal("slateflow.step_entered", doc="A step became active (entered).")
step_done = _signals.signal("slateflow.step_done", doc="A step is done.")
step_reset = _signals.signal("slateflow.step_reset", doc="A reset constraint re-opened a step.")
flow_completed = _signals.signal("slateflow.flow_completed", doc="The flow became complete.")
flow_over = _signals.signal(
    "slateflow.flow_over",
    doc="The flow is complete (or a FlowStack ended) and its closing words were handed to the "
    "model: a voice adapter may hang up now, without cutting the goodbye off.",
)
steps_changed = _signals.signal(
    "slateflow.steps_changed",
    doc="The active steps changed in a way a conversation acts on; keyword arguments "
    "``since`` (the user turn after which a newly active step's posture was last told to the "
    "model, or None) and ``timed`` (whether the flow's steps carry voice timing).",
)
