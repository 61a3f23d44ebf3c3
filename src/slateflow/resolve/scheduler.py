"""How a session runs resolvers: one slot per resolver name, its runs started, queued or
superseded as their conflict policy says, each driven in a task of the session.

:class:`Scheduler` is the part of a :class:`~slateflow.Session` that owns its runs: the slots,
the concurrency limit, what is in flight (runs and watcher actions, for ``wait_idle``), the
watchdog over cancelled runs that ignore it, the reactive resolvers, and the delivery of
background outcomes. It is the only caller of a :class:`~slateflow.resolve.run.Run`'s
transitions.
"""

from __future__ import annotations

import heapq
import inspect
import itertools
import logging
from collections import deque
from collections.abc import Callable

import anyio

from ..errors import DispatchRejectedError, ResolverDefinitionError, WaitTimeoutError
from ..state import State
from ..state.chains import fresh_chain
from .background import BackgroundResult, Deliver, ResultFormatter, Scheduling, dress
from .clock import Clock, wait_on
from .http import hosting
from .reactions import Reaction
from .resolver import CONFLICT_POLICIES, OnConflict, Resolver
from .run import Mode, Run, traced
from .runtime import Runtime

# Waits shorter than this count as elapsed: a deadline recomputed from float clock readings can
# stay a hair in the future forever.
_EPSILON = 1e-9

__all__ = ["Scheduler", "Slot"]

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


class Scheduler:
    """The runs of one session (see the module docstring)."""

    def __init__(
        self,
        state: State,
        clock: Clock,
        runtime: Runtime,
        *,
        max_concurrency: int | None,
        cancel_grace: float,
        result_formatter: ResultFormatter,
    ) -> None:
        self.state = state
        self.clock = clock
        self.runtime = runtime
        self.cancel_grace = cancel_grace
        self.result_formatter = result_formatter
        self.max_concurrency = max_concurrency
        self.limiter: anyio.CapacityLimiter | None = None
        self.slots: dict[str, Slot] = {}
        self.count = 0  # runs in flight or queued
        self.actions = 0  # watcher actions queued or running
        self.closing = False
        self.reactions: dict[str, Reaction] = {}
        self._idle: anyio.Event | None = None
        # Cancelled runs not yet ended, by when they will be reported as ignoring it.
        self._stubborn: list[tuple[float, int, Run]] = []
        self._order = itertools.count()
        self._reaping = False
        # Bound once: every run holds one of these, and a bound method per run is an object more
        # for the garbage collector to track.
        self._on_cancel_started: Callable[[Run], None] = self._watch_cancelled
        self._on_cancel_queued: Callable[[Run], None] = self._cancel_queued

    def begin(self) -> None:
        """The session opened (on its event loop): the concurrency limit can be made."""
        if self.max_concurrency is not None:
            self.limiter = anyio.CapacityLimiter(self.max_concurrency)

    # -- submitting --------------------------------------------------------------------------

    def submit(
        self,
        resolver: Resolver,
        mode: Mode,
        on_conflict: OnConflict | None,
        deliver: Deliver | None,
        scheduling: Scheduling | None,
    ) -> Run:
        """Start (or queue) a run of ``resolver`` as its conflict policy says."""
        self.runtime.check()
        if not isinstance(resolver, Resolver):
            raise TypeError(f"expected a Resolver, got {type(resolver).__name__}")
        self.runtime.check_in_loop(f"session.{mode}() of resolver {resolver.name!r}")
        policy = resolver.on_conflict if on_conflict is None else on_conflict
        if policy not in CONFLICT_POLICIES:
            raise ResolverDefinitionError(
                f"on_conflict must be one of {list(CONFLICT_POLICIES)}, got {policy!r}"
            )
        name = resolver.name
        slot = self.slots.get(name)
        busy = slot is not None and slot.busy()
        if busy and policy == "reject":
            raise DispatchRejectedError(
                f"resolver {name!r} is already running and uses on_conflict='reject'; wait for "
                "it (session.is_running) or dispatch with another on_conflict policy"
            )
        run = Run(resolver, mode, self.state, self.clock, deliver=deliver, scheduling=scheduling)
        if busy and policy == "queue":
            assert slot is not None
            run.queue(self._on_cancel_queued)
            if slot.waiting is None:
                slot.waiting = deque()
            slot.waiting.append(run)
            self.count += 1
        else:
            run.write_running()  # raises before anything else changes if governance refuses
            if slot is None:
                slot = self.slots[name] = Slot()
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
        tg = self.runtime.tg
        assert tg is not None
        if run.status == "queued":
            self.count -= 1
        slot.active[run] = None
        slot.owners += 1
        slot.last = run
        self.count += 1
        run.begin(tg.create_task(self._drive(run, slot), name=run.name), self._on_cancel_started)

    async def _drive(self, run: Run, slot: Slot) -> None:
        # A run is new work, not a reaction to the write that dispatched it: its writes start
        # a delivery chain of their own.
        fresh_chain()
        # The runs of a session fetch through its HTTP pool (a task of their own: no reset).
        hosting(self.runtime.http)
        context = self.state.engine.context
        # A task copies the context of whoever dispatched it, maybe another resolver's fenced
        # source; this run's callbacks (deliver, subscribers) must not write as that resolver.
        token = context.push_actor(None) if context.actor() is not None else None
        try:
            with traced(run):
                try:
                    await run.execute(self.limiter)
                except BaseException:
                    # The session itself is being cancelled (its block raised, or an outer
                    # scope).
                    self._finish(run, slot, outer=True)
                    if run.deliver is not None:
                        await self._deliver(run)
                    raise
                self._finish(run, slot)
                if run.deliver is not None:
                    await self._deliver(run)
        finally:
            if token is not None:
                context.pop_actor(token)

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
        self.count -= 1
        run.notify()
        while slot.waiting and not slot.owners:
            self._start_queued(slot)
        if not slot.active and not slot.waiting and self.slots.get(run.name) is slot:
            del self.slots[run.name]
        self.check_idle()

    def _start_queued(self, slot: Slot) -> None:
        assert slot.waiting is not None
        run = slot.waiting.popleft()
        try:
            run.write_running()
        except Exception as exc:
            # The state refuses it now (a policy added meanwhile): it ends without starting.
            self.count -= 1
            run.refused(exc)
            self.runtime.report(run.resolver, exc)
            if run.deliver is not None:
                self.runtime.spawn(self._deliver, run)
            self.check_idle()
            return
        self._start(run, slot)

    def _cancel_queued(self, run: Run) -> None:
        """``run.cancel()`` on a queued run: it leaves the queue and ends without starting."""
        slot = self.slots.get(run.name)
        if slot is None or slot.waiting is None or run not in slot.waiting:
            return
        slot.waiting.remove(run)
        self._end_queued(run)
        if not slot.active and not slot.waiting:
            del self.slots[run.name]

    def _end_queued(self, run: Run) -> None:
        """End a run that never started (cancelled or superseded while queued)."""
        self.count -= 1
        run.dropped()
        if run.deliver is not None:
            self.runtime.spawn(self._deliver, run)
        self.check_idle()

    async def _deliver(self, run: Run) -> None:
        """Hand an ended background run's outcome to its ``deliver`` callback."""
        deliver = run.deliver
        assert deliver is not None
        try:
            result = BackgroundResult.of(run)
            dressed = dress(result, self.result_formatter, self.state, to_model=run.to_inbox)
            outcome = deliver(dressed)
            if inspect.isawaitable(outcome):
                # Delivered even while the session closes, but never for longer than the grace.
                with anyio.CancelScope(shield=True), self.clock.deadline(self.cancel_grace):
                    await outcome
        except Exception as exc:
            self.runtime.report(deliver, exc)

    # -- cancelled runs that ignore it -------------------------------------------------------

    def _watch_cancelled(self, run: Run) -> None:
        """A started run was cancelled: report it if it is still running ``cancel_grace`` later."""
        heapq.heappush(
            self._stubborn, (self.clock.monotonic() + self.cancel_grace, next(self._order), run)
        )
        tg = self.runtime.tg
        if not self._reaping and tg is not None:
            self._reaping = True
            tg.start_soon(self._reap, name="slateflow:cancel-watchdog")

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

    # -- control -----------------------------------------------------------------------------

    def cancel(self, name: str) -> int:
        """Cancel every run of resolver ``name`` (and stop it reacting); how many."""
        reaction = self.reactions.pop(name, None)
        if reaction is not None:
            reaction.stop()
        slot = self.slots.get(name)
        if slot is None:
            return 0
        cancelled = 0
        while slot.waiting:
            self._end_queued(slot.waiting.popleft())
            cancelled += 1
        for run in list(slot.active):
            cancelled += run.cancel()
        return cancelled

    def cancel_all(self, reason: str) -> int:
        """Cancel every run; how many."""
        total = 0
        for name, slot in list(self.slots.items()):
            for run in [*slot.active, *(slot.waiting or ())]:
                if run.cancel_reason is None:
                    run.cancel_reason = reason
            total += self.cancel(name)
        return total

    def is_running(self, name: str) -> bool:
        """Whether a run of ``name`` is in flight or queued (superseded runs do not count)."""
        slot = self.slots.get(name)
        return slot is not None and slot.busy()

    def runs(self, name: str | None = None) -> list[Run]:
        """The runs in flight or queued (of ``name``, or all), superseded ones included."""
        slots = [self.slots.get(name)] if name is not None else list(self.slots.values())
        return [
            run
            for slot in slots
            if slot is not None
            for run in (*slot.active, *(slot.waiting or ()))
        ]

    # -- idle ----------------------------------------------------------------------------------

    def action_started(self) -> None:
        """A watcher action was queued: the session is not idle until it ends."""
        self.actions += 1

    def action_done(self) -> None:
        """A watcher action ended."""
        self.actions -= 1
        self.check_idle()

    def check_idle(self) -> None:
        """Wake ``wait_idle`` when nothing is in flight any more."""
        if not self.count and not self.actions and self._idle is not None:
            self._idle.set()
            self._idle = None

    async def wait_idle(self) -> None:
        """Wait until no run is in flight or queued and no watcher action is pending (see
        ``Session.wait_idle``)."""
        while self.count or self.actions:
            if self._idle is None:
                self._idle = anyio.Event()
            if await wait_on(self.clock, self._idle, None) == "stuck":
                running = ", ".join(sorted({r.name for r in self.runs()})) or "watcher actions"
                raise WaitTimeoutError(
                    f"wait_idle: {running} can never end: every task is blocked and no timer "
                    "is due on the manual clock (complete the fake, or advance the clock)"
                )

    # -- reactive resolvers --------------------------------------------------------------------

    def _react(
        self,
        resolver: Resolver,
        mode: Mode,
        deliver: Deliver | None,
        scheduling: Scheduling | None,
    ) -> Reaction:
        reaction = self.reactions.get(resolver.name)
        if reaction is None:
            reaction = Reaction(self, resolver, mode, deliver, scheduling)
            self.reactions[resolver.name] = reaction
        else:
            reaction.retarget(resolver, mode, deliver, scheduling)
        return reaction

    def rerun(self, reaction: Reaction) -> None:
        """A reaction's debounce elapsed: run again unless the latest run saw these inputs."""
        if self.closing or self.reactions.get(reaction.resolver.name) is not reaction:
            return
        resolver = reaction.resolver
        slot = self.slots.get(resolver.name)
        last = slot.last if slot is not None else reaction.last
        if last is not None and last.status != "cancelled":
            if last.inputs is None and not last.done:
                return  # not started yet: it will read the current values
            current = {k: self.state.version(k) for k in resolver.reads}
            if last.inputs == current:
                return
        try:
            self.submit(resolver, reaction.mode, "latest", reaction.deliver, reaction.scheduling)
        except Exception as exc:
            self.runtime.report(resolver, exc)

    def stop_reacting(self) -> None:
        """The session is closing: every reactive resolver stops reacting."""
        self.closing = True
        for reaction in list(self.reactions.values()):
            reaction.stop()
        self.reactions.clear()
