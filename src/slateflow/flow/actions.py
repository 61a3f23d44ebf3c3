"""What a flow's steps do: ``on_enter`` actions started through the session, and step signals.

An entered step's ``on_enter`` resolver is started on the session's event loop, in its mode:
``dispatch`` and ``background`` at once, ``call`` runs one after another in the runner's call
lane (which ``on_turn`` waits for). The signals of :mod:`slateflow.flow.signals` go to their
receivers with the runner as sender; a raising receiver is logged and the flow goes on.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio

from ..errors import FlowError, SlateError
from ..resolve.sections import entered, inside
from .definition import Flow
from .steps import OnEnter, Step

if TYPE_CHECKING:
    from ..resolve.background import Deliver
    from ..resolve.session import Session

__all__ = ["Actions", "check_actions", "in_flow_action", "send"]

log = logging.getLogger("slateflow.flow")


def check_actions(flow: Flow, session: Session | None) -> None:
    """Refuse to run a flow with ``on_enter`` actions without a session to run them in."""
    if session is None:
        for s in flow.steps:
            if s.on_enter is not None:
                raise FlowError(
                    f"flow {flow.name!r}: step {s.id!r} has an on_enter action, which needs "
                    "a session to run in; start the flow with flow.start(session) (or a "
                    "conversation's run_flow)"
                )


def send(signal: Any, sender: object, flow: str, **kwargs: Any) -> None:
    """Send ``signal`` from ``sender`` (a runner) to each receiver, isolating failures."""
    if not signal.receivers:
        return
    for receiver in signal.receivers_for(sender):
        try:
            receiver(sender, flow=flow, **kwargs)
        except Exception:
            log.exception("flow %r: a %s receiver failed; the flow goes on", flow, signal.name)


_ACTIONS = object()  # the section call-mode actions run in


def in_flow_action() -> bool:
    """Whether the running code is a flow's call-mode ``on_enter`` action (or a task it
    started): a turn may be waiting for it, so it must not wait for a turn."""
    return inside(_ACTIONS)


class Actions:
    """Starts one runner's ``on_enter`` actions through its session."""

    __slots__ = ("_calls", "_closed", "_scope", "deliver", "lane", "name", "session", "steps")

    def __init__(
        self, name: str, steps: Sequence[Step], session: Session | None, deliver: Deliver | None
    ) -> None:
        self.name = name
        self.steps = steps
        self.session = session
        self.deliver = deliver  # where background outcomes go when the action names no deliver
        self._calls: list[OnEnter] = []
        self._closed = False
        self.lane: anyio.Event | None = None
        """Set while call-mode actions run; ``on_turn`` waits for it."""
        # Cancelled by close() (and so at session exit): a call-mode run must not keep the
        # session's block waiting.
        self._scope: anyio.CancelScope | None = None

    def fire(self, i: int) -> None:
        """Start step ``i``'s ``on_enter`` action soon, on the session's loop."""
        if self.session is not None:
            self.session.runtime.soon(self._start, i)

    def _start(self, i: int) -> None:
        step = self.steps[i]
        action = step.on_enter
        session = self.session
        if action is None or session is None or self._closed:
            return
        try:
            if action.mode == "dispatch":
                session.dispatch(action.resolver)
            elif action.mode == "background":
                deliver = action.deliver if action.deliver is not None else self.deliver
                session.background(action.resolver, deliver, action.scheduling)
            else:
                self._calls.append(action)
                if self.lane is None:
                    self.lane = anyio.Event()
                    session.runtime.spawn(self._run_calls)
        except Exception:
            log.exception(
                "flow %r: step %r could not start resolver %r",
                self.name,
                step.id,
                action.resolver.name,
            )

    async def _run_calls(self) -> None:
        session = self.session
        assert session is not None
        try:
            with anyio.CancelScope() as self._scope:
                if self._closed:
                    return
                while self._calls and not self._closed:
                    action = self._calls.pop(0)
                    with contextlib.suppress(SlateError), entered(_ACTIONS):
                        # Its error is in '<name>:error' for the flow to see: nothing to raise.
                        await session.call(action.resolver)
        finally:
            lane, self.lane = self.lane, None
            if lane is not None:
                lane.set()

    async def idle(self) -> None:
        """Wait until no call-mode action is running or queued."""
        while self.lane is not None:
            await self.lane.wait()

    def close(self) -> None:
        """Drop queued call-mode actions and cancel the lane (started runs are the session's)."""
        self._closed = True
        self._calls.clear()
        if self._scope is not None:
            self._scope.cancel()
