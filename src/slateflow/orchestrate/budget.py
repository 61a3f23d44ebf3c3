"""WorkflowBudget: a shared ledger of what a workflow's model calls used, and its limits.

Check before each model call (``budget.check()``), record after (``budget.record(tokens=...,
cost=...)``). The cap is soft: calls already in flight when the limit is reached may overshoot
it; the next ``check()`` says no. The ledger also counts steps and watches for loops (the same
call, by name and input, repeated) and for time running out, and emits :mod:`lifecycle events
<slateflow.orchestrate.events>` for each: on the blinker signal :data:`budget_event`, to
``on_event`` callbacks, and into the State when it has one (``workflow:{name}:event``, so the
journal keeps them all).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import deque
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from blinker import Signal
from pydantic import BaseModel, ConfigDict

from ..errors import OrchestrationError, SlateError
from ..resolve.clock import SYSTEM_CLOCK, Clock
from ..state import State
from .events import (
    BudgetWarning,
    CostIncurred,
    LoopDetected,
    StepLimitApproaching,
    StepLimitReached,
    TimeoutApproaching,
    TimeoutReached,
)

__all__ = ["BudgetSnapshot", "WorkflowBudget", "budget_event", "money"]

log = logging.getLogger("slateflow.orchestrate")

budget_event = Signal("slateflow.budget_event")
"""Sent with ``sender=budget, event=...`` for every lifecycle event a budget emits."""

_WARN_AT = Decimal("0.8")


class BudgetSnapshot(BaseModel):
    """A view of the ledger at one moment. ``remaining_*`` never goes below 0 (an overshoot
    shows in ``consumed_*``); ``exhausted`` is what the next ``check()`` answers against."""

    model_config = ConfigDict(frozen=True)

    consumed_tokens: int
    limit_tokens: int | None
    remaining_tokens: int | None
    consumed_cost: Decimal
    limit_cost: Decimal | None
    remaining_cost: Decimal | None
    steps: int
    exhausted: bool


def money(value: object, what: str) -> Decimal:
    """``value`` (a number or decimal string) as a finite ``Decimal`` >= 0; anything else
    raises ``OrchestrationError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal | str):
        raise OrchestrationError(f"{what} must be an amount (a number or decimal string)")
    try:
        amount = Decimal(str(value))
    except ArithmeticError:
        raise OrchestrationError(f"{what} must be an amount, got {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise OrchestrationError(f"{what} must be a finite amount >= 0, got {value!r}")
    return amount


def _count(value: object, what: str, minimum: int = 0) -> int:
    if type(value) is not int or value < minimum:
        raise OrchestrationError(f"{what} must be a whole number >= {minimum}, got {value!r}")
    return value


class WorkflowBudget:
    """The ledger of one workflow, shared by all its steps (safe from any thread).

    - ``limit_tokens`` / ``limit_cost``: the caps ``check()`` enforces (None: no cap).
    - ``max_steps``: steps recorded with ``record_step``; ``timeout``: seconds from the first
      ``start()`` (on ``clock``) that ``check_time()`` measures.
    - ``loop_limit``: how many identical consecutive calls (same name and input) are allowed
      before ``loop_detected``.
    - Warnings (``budget_warning``, ``step_limit_approaching``, ``timeout_approaching``) fire
      once each, at ``warn_at`` (80 %) of their limit.
    """

    def __init__(
        self,
        *,
        limit_tokens: int | None = None,
        limit_cost: float | Decimal | str | None = None,
        max_steps: int | None = None,
        timeout: float | None = None,
        loop_limit: int | None = None,
        warn_at: float | Decimal | str = _WARN_AT,
        workflow: str = "workflow",
        state: State | None = None,
        clock: Clock | None = None,
        on_event: Callable[[Any], Any] | None = None,
    ) -> None:
        self.limit_tokens = None if limit_tokens is None else _count(limit_tokens, "limit_tokens")
        self.limit_cost = None if limit_cost is None else money(limit_cost, "limit_cost")
        self.max_steps = None if max_steps is None else _count(max_steps, "max_steps", 1)
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise OrchestrationError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.timeout = timeout
        self.loop_limit = None if loop_limit is None else _count(loop_limit, "loop_limit", 1)
        self.warn_at = money(warn_at, "warn_at")
        if self.warn_at > 1:
            raise OrchestrationError(f"warn_at is a fraction of the limit <= 1, got {warn_at!r}")
        if type(workflow) is not str or not workflow:
            raise OrchestrationError(f"workflow must be a non-empty name, got {workflow!r}")
        self.workflow = workflow
        self.state = state
        self.clock = clock if clock is not None else SYSTEM_CLOCK
        self.on_event = on_event
        self.events: list[Any] = []
        """Every event emitted, oldest first."""
        self._lock = threading.Lock()
        self._tokens = 0
        self._cost = Decimal(0)
        self._steps = 0
        self._started: float | None = None
        self._warned: set[str] = set()
        self._recent: deque[tuple[str, str]] = deque(maxlen=(loop_limit or 1) + 1)

    # -- tokens and cost ---------------------------------------------------------------------

    def _exhausted(self) -> bool:
        return (self.limit_tokens is not None and self._tokens >= self.limit_tokens) or (
            self.limit_cost is not None and self._cost >= self.limit_cost
        )

    def check(self) -> bool:
        """Whether another model call may start: False once a limit is reached."""
        with self._lock:
            return not self._exhausted()

    def record(
        self, *, tokens: int = 0, cost: float | Decimal | str = 0, operator: str = ""
    ) -> None:
        """Add what a finished call used (an overshoot is kept: the cap is soft). Emits
        ``cost_incurred`` for a cost, and ``budget_warning`` once past ``warn_at`` of a limit."""
        used = _count(tokens, "tokens")
        amount = money(cost, "cost")
        events: list[Any] = []
        with self._lock:
            self._tokens += used
            self._cost += amount
            if amount:
                events.append(
                    CostIncurred(
                        operator=operator or self.workflow, cost=amount, cumulative=self._cost
                    )
                )
            for name, spent, limit in (
                ("cost", self._cost, self.limit_cost),
                ("tokens", Decimal(self._tokens), self._limit_tokens()),
            ):
                if limit is not None and spent >= limit * self.warn_at and name not in self._warned:
                    self._warned.add(name)
                    events.append(BudgetWarning(workflow=self.workflow, spent=spent, limit=limit))
        self._emit(events)

    def _limit_tokens(self) -> Decimal | None:
        return None if self.limit_tokens is None else Decimal(self.limit_tokens)

    # -- steps and loops ------------------------------------------------------------------------

    def record_step(self, name: str, input: Any = None, *, operator: str = "") -> bool:
        """Count one step (a tool or sub-agent call named ``name`` with ``input``); returns
        whether the workflow may go on (False at the step limit or in a loop). Emits
        ``step_limit_approaching``, ``step_limit_reached`` and ``loop_detected``."""
        digest = hashlib.sha256(json.dumps(input, sort_keys=True, default=str).encode()).hexdigest()
        who = operator or self.workflow
        events: list[Any] = []
        with self._lock:
            self._steps += 1
            steps = self._steps
            go_on = True
            if self.max_steps is not None:
                if steps >= self.max_steps:
                    go_on = False
                    if "steps" not in self._warned:
                        self._warned.add("steps")
                        events.append(StepLimitReached(operator=who, total_sub_dispatches=steps))
                elif steps >= self.max_steps * self.warn_at and "steps_near" not in self._warned:
                    self._warned.add("steps_near")
                    events.append(
                        StepLimitApproaching(operator=who, current=steps, max=self.max_steps)
                    )
            self._recent.append((name, digest))
            if self.loop_limit is not None:
                run = 0
                for call in reversed(self._recent):
                    if call != (name, digest):
                        break
                    run += 1
                if run > self.loop_limit:
                    go_on = False
                    events.append(
                        LoopDetected(
                            operator=who,
                            operator_name=name,
                            consecutive_count=run,
                            max=self.loop_limit,
                        )
                    )
        self._emit(events)
        return go_on

    # -- time -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the clock for ``timeout`` (again: no effect)."""
        with self._lock:
            if self._started is None:
                self._started = self.clock.monotonic()

    def check_time(self, *, operator: str = "") -> bool:
        """Whether time is left (True without a ``timeout``); emits ``timeout_approaching``
        once past ``warn_at`` of it and ``timeout_reached`` when it is up."""
        if self.timeout is None:
            return True
        events: list[Any] = []
        who = operator or self.workflow
        with self._lock:
            if self._started is None:
                self._started = self.clock.monotonic()
            elapsed = self.clock.monotonic() - self._started
            ms, max_ms = int(elapsed * 1000), int(self.timeout * 1000)
            left = elapsed < self.timeout
            if not left and "time" not in self._warned:
                self._warned.add("time")
                events.append(TimeoutReached(operator=who, elapsed=ms))
            elif (
                left
                and elapsed >= self.timeout * float(self.warn_at)
                and ("time_near" not in self._warned)
            ):
                self._warned.add("time_near")
                events.append(TimeoutApproaching(operator=who, elapsed=ms, max_duration=max_ms))
        self._emit(events)
        return left

    # -- reading ----------------------------------------------------------------------------------

    def snapshot(self) -> BudgetSnapshot:
        """The ledger now."""
        with self._lock:
            return BudgetSnapshot(
                consumed_tokens=self._tokens,
                limit_tokens=self.limit_tokens,
                remaining_tokens=None
                if self.limit_tokens is None
                else max(self.limit_tokens - self._tokens, 0),
                consumed_cost=self._cost,
                limit_cost=self.limit_cost,
                remaining_cost=None
                if self.limit_cost is None
                else max(self.limit_cost - self._cost, Decimal(0)),
                steps=self._steps,
                exhausted=self._exhausted(),
            )

    # -- emitting ---------------------------------------------------------------------------------

    def _emit(self, events: list[Any]) -> None:
        for event in events:
            self.events.append(event)
            if self.state is not None:
                try:
                    self.state.set(
                        f"workflow:{self.workflow}:event",
                        event.model_dump(mode="json", by_alias=True),
                        source="orchestration",
                        writer=self.workflow,
                    )
                except SlateError as exc:
                    log.error("budget %r: an event could not be written: %s", self.workflow, exc)
            receivers: list[Callable[[Any], Any]] = [] if self.on_event is None else [self.on_event]
            if budget_event.receivers:
                receivers += [_bound(r, self) for r in budget_event.receivers_for(self)]
            for receiver in receivers:
                try:
                    receiver(event)
                except Exception:
                    log.exception("budget %r: an event receiver failed", self.workflow)

    def __repr__(self) -> str:
        s = self.snapshot()
        return (
            f"<WorkflowBudget {self.workflow!r}: {s.consumed_tokens} tokens, "
            f"{s.consumed_cost} spent{', exhausted' if s.exhausted else ''}>"
        )


def _bound(receiver: Callable[..., Any], budget: WorkflowBudget) -> Callable[[Any], Any]:
    def send(event: Any) -> Any:
        return receiver(budget, event=event)

    return send
