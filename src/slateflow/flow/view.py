"""What a running flow says: the reads of a :class:`~slateflow.flow.runner.FlowRunner`.

Everything here reads the runner's marking (under its lock) and the State, and changes
nothing: where the flow stands (steps, verdicts, completion, explanations), what the model is
told (postures, grounds, reprompts, timing, the tools it knows), and the waits for the flow to
get somewhere. The runner itself (:mod:`~slateflow.flow.runner`) takes the inputs.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from ..errors import FlowError, SlateError
from ..resolve.background import BackgroundResult
from ..resolve.clock import SYSTEM_CLOCK
from ..state import State
from .admission import Tools
from .compiled import CompiledFlow
from .definition import Flow
from .explain import FlowExplanation, explain
from .guards import Marking
from .machine import Machine, Verdict
from .timing import DEFAULT_REPROMPT, VoiceTiming
from .waits import Waits

if TYPE_CHECKING:
    from ..resolve.session import Session

__all__ = ["RunnerView"]

log = logging.getLogger("slateflow.flow")


class RunnerView:
    """The read side of a flow runner (see the module docstring); ``FlowRunner`` is one."""

    flow: Flow
    state: State
    session: Session | None
    name: str
    tools: Tools
    _machine: Machine
    _plan: CompiledFlow
    _lock: threading.RLock
    _closed: bool
    _waits: Waits

    # -- where the flow stands ---------------------------------------------------------------

    @property
    def active_steps(self) -> list[str]:
        """The ids of the active steps (reachable and not done), in flow order."""
        with self._lock:
            return list(self._machine.active_ids.ids)

    @property
    def done_steps(self) -> list[str]:
        """The ids of the done steps, in flow order."""
        with self._lock:
            return list(self._machine.done_ids.ids)

    @property
    def marking(self) -> Marking:
        """The done steps and the successful tool calls so far."""
        with self._lock:
            return self._machine.mark()

    @property
    def is_complete(self) -> bool:
        """Whether the flow is complete: every ``require``-d step done and, if the flow has
        terminal steps, one of them reached (with neither, every step done)."""
        return self._machine.complete

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (the runner no longer advances)."""
        return self._closed

    def unmet_requirements(self) -> list[str]:
        """The ``require``-d steps not done yet, in the order the constraints name them."""
        with self._lock:
            done = self._machine.done
            return [self.flow.steps[i].id for i in self._plan.required if not done[i]]

    def verdict(self, step: str) -> Verdict:
        """Where ``step`` stands: pending, active, done or skipped."""
        i = self._index(step)
        with self._lock:
            return self._machine.verdict(i)

    def explain(self) -> FlowExplanation:
        """Where the flow is and why: what each active step waits for, what keeps the next
        steps from starting, which tools are allowed or refused (and why), what is unmet."""
        with self._lock, self.state.engine.outside_transaction():
            return explain(self._machine, self.tools, self.state)

    def take_deliveries(self) -> list[BackgroundResult]:
        """Background results of ``on_enter`` actions with no ``deliver``, oldest first; taking
        them empties the queue."""
        return [] if self.session is None else self.session.conversation.inbox.take(self)

    def _index(self, step: str) -> int:
        i = self._plan.ids.get(step) if isinstance(step, str) else None
        if i is None:
            raise FlowError(
                f"flow {self.name!r} has no step {step!r}; its steps: "
                + ", ".join(s.id for s in self.flow.steps)
            )
        return i

    def _check_open(self) -> None:
        if self._closed:
            raise FlowError(f"flow {self.name!r}: the runner is closed; start the flow again")

    # -- what the model is told --------------------------------------------------------------

    @property
    def is_over(self) -> bool:
        """Whether the flow is complete and its closing words were handed to the model (the
        moment a call may end without cutting them off): ``flow:{name}:over``."""
        return self._machine.over

    @property
    def told_steps(self) -> list[str]:
        """The steps whose posture reached the model since they were last entered, in flow
        order (``flow:{name}:told``)."""
        with self._lock:
            return [self.flow.steps[i].id for i in sorted(self._machine.told)]

    def postures(self) -> list[str]:
        """The active steps' postures (instructions for the model), in flow order; once the
        flow is complete, those of the terminal steps it ended on."""
        with self._lock:
            return [rt.step.posture for rt in self._machine.speaking() if rt.step.posture]

    def grounds(self) -> list[str]:
        """The active steps' grounds rendered from the State now (chosen like
        :meth:`postures`); blank lines are dropped."""
        with self._lock:
            rts = self._machine.speaking()
        lines = []
        for ground in [rt.step.ground for rt in rts if rt.step.ground is not None]:
            try:
                lines.append(ground.render(self.state))
            except SlateError as exc:
                # A key made secret after the flow started: the line is left out, not the turn.
                log.error("flow %r: a ground could not be rendered: %s", self.name, exc)
        return [line for line in lines if line.strip()]

    def voice_timing(self) -> VoiceTiming | None:
        """The merged :class:`VoiceTiming` of the active steps (None when none has any)."""
        if not self._plan.timed:
            return None
        with self._lock:
            speaking = self._machine.speaking()  # a closing terminal step's timing applies too
        merged: VoiceTiming | None = None
        for rt in speaking:
            timing = rt.step.timing
            if timing is not None:
                merged = timing if merged is None else merged.merge(timing)
        return merged

    def reprompts(self) -> list[str]:
        """What to tell the model for each active step its repair policy says to reprompt: the
        step's ``timing.reprompt`` text, else :data:`DEFAULT_REPROMPT`."""
        with self._lock:
            due = [i for i in self._plan.repairs if self._machine.reprompt_due(i)]
        timings = [self.flow.steps[i].timing for i in due]
        return [DEFAULT_REPROMPT if t is None else t.reprompt_text for t in timings]

    def known_tools(self) -> list[str]:
        """Every tool this flow knows: the ones it names, and the ones given to ``compile``."""
        return list(self._plan.universe)

    # -- waiting -----------------------------------------------------------------------------

    async def wait_for_step(self, step: str, timeout: float | None = None) -> Verdict:
        """Wait until ``step`` is reached (active or done) and return its verdict.

        Raises :class:`WaitTimeoutError` after ``timeout`` seconds (on the session's clock, so
        a manual clock in tests) with the runner's explanation.
        """
        i = self._index(step)
        m = self._machine

        def reached() -> bool:
            return m.active[i] or m.done[i]

        await self._waits.until(reached, timeout, f"step {step!r} to be reached", self._clock())
        return self.verdict(step)

    async def wait_complete(self, timeout: float | None = None) -> None:
        """Wait until the flow is complete; raises :class:`WaitTimeoutError` after ``timeout``."""
        m = self._machine
        await self._waits.until(lambda: m.complete, timeout, "the flow to complete", self._clock())

    def _clock(self) -> Any:
        return self.session.clock if self.session is not None else SYSTEM_CLOCK
