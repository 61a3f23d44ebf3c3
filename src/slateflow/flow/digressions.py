"""Digressions: side conversations a :class:`FlowStack` lets take the floor from its main flow.

A :class:`Digression` names the guard that starts it, its own flow, and what the main flow does
after it (``then``); a :class:`FlowStack` is a main flow with its digressions, run by
:class:`~slateflow.flow.stack.StackRunner` (``stack.start(session)``, or a conversation's
``run_flow(stack)``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import FlowDefinitionError
from .definition import Flow
from .guard_base import Guard

if TYPE_CHECKING:
    from ..resolve.background import Deliver
    from ..resolve.session import Session
    from .stack import StackRunner

__all__ = ["Digression", "FlowStack", "Then"]

Then = Literal["previous", "restart", "terminate"]
"""What the main flow does once a digression completes: goes on where it was (``previous``),
starts over keeping the State (``restart``), or the conversation ends (``terminate``)."""
_THENS: tuple[Then, ...] = ("previous", "restart", "terminate")


@dataclass(frozen=True, slots=True)
class Digression:
    """A side conversation: its ``name``, the guard that starts it (``when``, checked at each
    turn while the main flow drives), its ``flow``, and what the main flow does ``then``, once
    it completes: ``"previous"`` (go on where it was), ``"restart"`` or ``"terminate"``.
    """

    name: str
    when: Guard
    flow: Flow
    then: Then = "previous"

    def __post_init__(self) -> None:
        if type(self.name) is not str or not self.name:
            raise FlowDefinitionError(f"a digression name is a non-empty string, got {self.name!r}")
        where = f"digression {self.name!r}"
        if not isinstance(self.when, Guard):
            raise FlowDefinitionError(f"{where}: when takes a guard, got {self.when!r}")
        if not isinstance(self.flow, Flow):
            raise FlowDefinitionError(f"{where}: flow takes a Flow, got {self.flow!r}")
        if self.then not in _THENS:
            raise FlowDefinitionError(
                f"{where}: then must be one of {list(_THENS)}, got {self.then!r}"
            )


class FlowStack:
    """A main flow and its digressions, run with ``stack.start(session)`` or a conversation's
    ``run_flow(stack)``.

    Digressions are tried in the order given; each needs a flow whose name differs from the
    main flow's and from the others' (they publish their own ``flow:{name}:...`` keys).
    """

    def __init__(self, main: Flow, digressions: Iterable[Digression] = ()) -> None:
        if not isinstance(main, Flow):
            raise FlowDefinitionError(f"FlowStack needs a main Flow, got {main!r}")
        self.main = main
        self.digressions: tuple[Digression, ...] = ()
        for d in digressions:
            self._add(d)

    def _add(self, d: Digression) -> None:
        if not isinstance(d, Digression):
            raise FlowDefinitionError(f"FlowStack takes Digression objects, got {d!r}")
        names = {self.main.name} | {x.flow.name for x in self.digressions}
        if d.name in {x.name for x in self.digressions}:
            raise FlowDefinitionError(f"digression {d.name!r} is defined twice")
        if d.flow.name in names:
            raise FlowDefinitionError(
                f"digression {d.name!r}: its flow is named {d.flow.name!r} like another flow "
                "of the stack; give it its own name"
            )
        self.digressions += (d,)

    def digression(
        self,
        name: str,
        *,
        when: Guard,
        flow: Flow,
        then: Then = "previous",
    ) -> FlowStack:
        """Add a digression (see :class:`Digression`); returns the stack."""
        self._add(Digression(name, when, flow, then))
        return self

    @property
    def flows(self) -> list[Flow]:
        """The main flow, then each digression's flow."""
        return [self.main, *(d.flow for d in self.digressions)]

    def compile(self, tools: Iterable[str] | None = None) -> FlowStack:
        """Compile the main flow and every digression's flow (``FlowDefinitionError`` lists
        the problems of the first that has any)."""
        names = None if tools is None else list(tools)
        for flow in self.flows:
            flow.compile(names)
        return self

    def start(
        self,
        session: Session,
        *,
        enforcement: Any = "enforce",
        deliver: Deliver | None = None,
        tools: Iterable[str] = (),
    ) -> StackRunner:
        """Run the stack over the session's State until the session closes (see
        ``Flow.start``); ``tools`` names the agent's tools besides the flows' own (a refusal
        while a digression speaks lists what is available). Returns its
        :class:`~slateflow.flow.stack.StackRunner`."""
        from .stack import StackRunner  # the runner builds on this module: imported when run

        return StackRunner(
            self,
            session.state,
            session=session,
            enforcement=enforcement,
            deliver=deliver,
            tools=tools,
        )

    def __repr__(self) -> str:
        names = ", ".join(d.name for d in self.digressions)
        return f"<FlowStack {self.main.name!r} + [{names}]>"
