"""How a session runs resolvers: one slot per resolver name, its runs started, queued or
superseded as their conflict policy says, each driven in a task of the session.

A :class:`~slateflow.Session` is built from this part (``RunSlots``) and its own lifecycle,
control and conversation plumbing; nothing here holds state of its own (the methods run on the
session).
"""

from __future__ import annotations

import heapq
import inspect
import logging
from collections import deque
from collections.abc import Callable, Iterator

import anyio
from anyio.abc import TaskGroup

from ..errors import DispatchRejectedError, ResolverDefinitionError
from ..state import State
from ..state.chains import fresh_chain
from .background import BackgroundResult, Deliver, Scheduling
from .clock import Clock
from .inbox import ToInbox
from .reactions import Reaction
from .resolver import CONFLICT_POLICIES, OnConflict, Resolver
from .run import Mode, Run, error_message

# Waits shorter than this count as elapsed: a deadline recomputed from float clock readings can
# stay a hair in the future forever.
_EPSILON = 1e-9

__all__ = ["RunSlots", "Slot"]

log = logging.getLogger("slateflow.resolve")


class Slot:
    """The runs of one resolver name: those started (``active``) and those queued behind them."""

    __slots__ = ("active", "last", "owners", "waiting")

    def __init__(self) -> None:
        # Started and not ended, including superseded runs still winding down.
        self.active: dict[Run, None] = {}  # an ordered set: O(1) removal for parallel fan-outs
        self.owners = 0  # active runs that own the keys (not superseded)
        # Most names never queue: the (large) deque is made on first use.
        self.waiting: deque[Run] | None = None
        self.last: Run | None = None

    def busy(self) -> bool:
        """Whether the name is running or has runs queued (superseded runs do not count)."""
        return bool(self.waiting) or self.owners > 0


class RunSlots:
    """The run scheduling of a :class:`~slateflow.Session` (see the module docstring)."""

    # The Session's, which this part works through.
    state: State
    clock: Clock
    cancel_grace: float
    _slots: dict[str, Slot]
    _count: int
    _tg: TaskGroup | None
    _limiter: anyio.CapacityLimiter | None
    _stubborn: list[tuple[float, int, Run]]
    _order: Iterator[int]
    _reaping: bool
    _on_cancel_started: Callable[[Run], None]
    _on_cancel_queued: Callable[[Run], None]
    _check_usable: Callable[[], TaskGroup]
    _check_idle: Callable[[], None]
    _report: Callable[[object, Exception], None]
    dress: Callable[..., BackgroundResult]
    _react: Callable[[Resolver, Mode, Deliver | None, Scheduling | None], Reaction]

    def _watch_cancelled(self, run: Run) -> None:
        """A started run was cancelled: report it if it is still running ``cancel_grace`` later."""
        heapq.heappush(
            self._stubborn, (self.clock.monotonic() + self.cancel_grace, next(self._order), run)
        )
        if not self._reaping and self._tg is not None:
            self._reaping = True
            self._tg.start_soon(self._reap, name="slateflow:cancel-watchdog")

    async def _reap(self) -> None:
        """Wait for cancelled runs to end; log each that outlives its grace (it is waited for:
        no task outlives the session)."""
        heap = self._stubborn
        try:
            while heap:
                deadline, _, run = heap[0]
                if run.done:
                    heapq.heappop(heap)
                    continue
                wait = deadline - self.clock.monotonic()
                if wait > _EPSILON:
                    with self.clock.deadline(wait) as scope:
                        await run.wait(raise_error=False)
                    if not scope.cancel_called:
                        continue  # it ended in time
                heapq.heappop(heap)
                if run.done:
                    continue
                run.ignored_cancel = True
                log.warning(
                    "resolver %r ignored cancellation (%s) for %gs and is still running; the "
                    "session waits for it. Do not catch cancellation in a source.",
                    run.name,
                    run.cancel_reason,
                    self.cancel_grace,
                )
        finally:
            self._reaping = False

    def _submit(
        self,
        resolver: Resolver,
        mode: Mode,
        on_conflict: OnConflict | None,
        deliver: Deliver | None,
        scheduling: Scheduling | None,
    ) -> Run:
        self._check_usable()
        if not isinstance(resolver, Resolver):
            raise TypeError(f"expected a Resolver, got {type(resolver).__name__}")
        policy = resolver.on_conflict if on_conflict is None else on_conflict
        if policy not in CONFLICT_POLICIES:
            raise ResolverDefinitionError(
                f"on_conflict must be one of {list(CONFLICT_POLICIES)}, got {policy!r}"
            )
        name = resolver.name
        slot = self._slots.get(name)
        busy = slot is not None and slot.busy()
        if busy and policy == "reject":
            raise DispatchRejectedError(
                f"resolver {name!r} is already running and uses on_conflict='reject'; wait for "
                "it (session.is_running) or dispatch with another on_conflict policy"
            )
        run = Run(resolver, mode, self.state, self.clock, deliver=deliver, scheduling=scheduling)
        run.to_inbox = isinstance(deliver, ToInbox)
        if busy and policy == "queue":
            assert slot is not None
            run.status = "queued"
            if slot.waiting is None:
                slot.waiting = deque()
            slot.waiting.append(run)
            run._on_cancel = self._on_cancel_queued
            self._count += 1
        else:
            run.write_running()  # raises before anything else changes if governance refuses
            if slot is None:
                slot = self._slots[name] = Slot()
            if policy == "latest":
                self._supersede(slot)
            self._start(run, slot)
        if resolver.reactive:
            self._react(resolver, mode, deliver, scheduling).last = run
        return run

    def _supersede(self, slot: Slot) -> None:
        for old in slot.active:
            if not old.superseded:
                old.superseded = True
                slot.owners -= 1
                old.cancel("superseded")
        while slot.waiting:
            old = slot.waiting.popleft()
            old.superseded = True
            old.cancel_reason = "superseded"
            self._end_queued(old)

    def _start(self, run: Run, slot: Slot) -> None:
        assert self._tg is not None
        if run.status == "queued":
            self._count -= 1
            run.status = "running"
        run._on_cancel = self._on_cancel_started
        slot.active[run] = None
        slot.owners += 1
        slot.last = run
        self._count += 1
        run._handle = self._tg.create_task(self._drive(run, slot), name=run.name)

    async def _drive(self, run: Run, slot: Slot) -> None:
        # A run is new work, not a reaction to the write that dispatched it: its writes start
        # a delivery chain of their own.
        fresh_chain()
        state = self.state
        # A task copies the context of whoever dispatched it, maybe another resolver's fenced
        # source; this run's callbacks (deliver, subscribers) must not write as that resolver.
        token = state.engine.push_actor(None) if state.engine.actor() is not None else None
        try:
            try:
                await run.execute(self._limiter)
            except BaseException:
                # The session itself is being cancelled (its block raised, or an outer scope).
                self._finish(run, slot, outer=True)
                if run.deliver is not None:
                    await self._deliver(run)
                raise
            self._finish(run, slot)
            if run.deliver is not None:
                await self._deliver(run)
        finally:
            if token is not None:
                state.engine.pop_actor(token)

    def _finish(self, run: Run, slot: Slot, *, outer: bool = False) -> None:
        """Bookkeeping and the terminal write of an ended run (synchronous, so nothing
        interleaves between deciding who owns the keys and writing them)."""
        del slot.active[run]
        if not run.superseded:
            slot.owners -= 1
        if outer:
            run.finish_cancelled("session closed", write=False)
        if not run.superseded:
            # In parallel mode the status stays "running" while another run is in flight.
            run.write_outcome(status=not slot.owners)
        self._count -= 1
        run.notify()
        while slot.waiting and not slot.owners:
            self._start_queued(slot)
        if not slot.active and not slot.waiting and self._slots.get(run.name) is slot:
            del self._slots[run.name]
        self._check_idle()

    def _start_queued(self, slot: Slot) -> None:
        assert slot.waiting is not None
        run = slot.waiting.popleft()
        try:
            run.write_running()
        except Exception as exc:
            # The state refuses it now (a policy added meanwhile): it ends without starting.
            run.exception = exc
            run.error = error_message(exc)
            run.status = "error"
            run._on_cancel = None
            self._count -= 1
            run.notify()
            self._report(run.resolver, exc)
            if run.deliver is not None and self._tg is not None:
                self._tg.start_soon(self._deliver, run)
            self._check_idle()
            return
        self._start(run, slot)

    def _cancel_queued(self, run: Run) -> None:
        """``run.cancel()`` on a queued run: it leaves the queue and ends without starting."""
        slot = self._slots.get(run.name)
        if slot is None or slot.waiting is None or run not in slot.waiting:
            return
        slot.waiting.remove(run)
        self._end_queued(run)
        if not slot.active and not slot.waiting:
            del self._slots[run.name]

    def _end_queued(self, run: Run) -> None:
        """End a run that never started (cancelled or superseded while queued)."""
        if run.cancel_reason is None:
            run.cancel_reason = "cancelled"
        run.status = "cancelled"
        run._on_cancel = None
        self._count -= 1
        run.notify()
        if run.deliver is not None and self._tg is not None:
            self._tg.start_soon(self._deliver, run)
        self._check_idle()

    async def _deliver(self, run: Run) -> None:
        assert run.deliver is not None
        try:
            result = self.dress(run.background_result(), to_model=isinstance(run.deliver, ToInbox))
            outcome = run.deliver(result)
            if inspect.isawaitable(outcome):
                # Delivered even while the session closes, but never for longer than the grace.
                with anyio.CancelScope(shield=True), self.clock.deadline(self.cancel_grace):
                    await outcome
        except Exception as exc:
            self._report(run.deliver, exc)
