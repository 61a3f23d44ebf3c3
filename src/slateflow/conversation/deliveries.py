"""How background results reach the model between and during turns, and barge-in.

A background result travels one way: the run ends, the session hands it to the ``deliver``
callback the conversation gave (``conversation.deliver``), and it waits in the inbox for the
next context, or goes to ``on_delivery`` at once when it is urgent (``interrupt``) and the
caller is silent. While the caller talks over the agent (between ``begin_interruption`` and
``end_interruption``) urgent results are held for the turn that follows. :class:`Deliveries`
is the part of a :class:`~slateflow.conversation.Conversation` that does this.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import anyio

from ..errors import WaitTimeoutError
from ..resolve import BackgroundResult, Deliver, Scheduling, Session
from ..resolve.clock import wait_on
from .inbox import Inbox, ToConversation, record_delivered, undelivered

__all__ = ["Deliveries"]


class Deliveries:
    """One conversation's inbox, its hooks (``on_delivery``, ``on_waiting``) and the
    interruption state. ``busy()`` says whether a turn is being built (its context takes what
    waits)."""

    def __init__(
        self,
        session: Session,
        on_delivery: Deliver | None,
        on_waiting: Deliver | None,
        limit: int,
        busy: Callable[[], bool],
        hold_for: float = 2.0,
    ) -> None:
        self.session = session
        self.state = session.state
        self.runtime = session.runtime
        self.on_delivery = on_delivery
        self.on_waiting = on_waiting
        self.busy = busy
        self.inbox = Inbox(self._landed, limit=limit)
        self.deliver: Deliver = ToConversation(self.inbox, self._urgent)
        self.interrupting = False
        # An interruption ended and the caller's turn is on its way: interrupt results wait
        # for that turn's context instead of being spoken before it.
        self.hold = False
        self.hold_for = hold_for
        """Seconds (of the session's clock) a hold waits for the turn that ends an
        interruption; with no words by then, what it held is delivered as after noise."""
        self._hold_scope: anyio.CancelScope | None = None
        # A hold still running when the session closes must not keep it open.
        session.on_close(self._stop_expiry)
        self._waiting: list[anyio.Event] = []
        # Results a previous process committed for the model but never handed over wait again.
        for result in undelivered(self.state, session.result_formatter):
            self.inbox.put(result)

    def _quiet(self) -> bool:
        return not self.interrupting and not self.hold

    def _urgent(self, result: BackgroundResult) -> Any:
        """An ``interrupt`` result goes to ``on_delivery`` now while the caller is not talking
        (None: it waits in the inbox)."""
        if self.on_delivery is None or not self._quiet():
            return None
        return self._push(result)

    async def _push(self, result: BackgroundResult) -> None:
        assert self.on_delivery is not None
        if not self._quiet():
            # Interrupted again before this push ran: hold it for the end of that one.
            self.inbox.put(result)
            return
        if await self._call(self.on_delivery, result):
            record_delivered(self.state, [result])
        else:
            self.inbox.put(result)  # not handed over: the next context carries it

    async def wait(self, timeout: float | None) -> list[BackgroundResult]:
        """Wait until an audible result waits and the caller is quiet; those waiting."""
        clock = self.session.clock
        deadline = None if timeout is None else clock.monotonic() + timeout
        while True:
            waiting = self.audible()
            if waiting and self._quiet():
                return waiting
            event = anyio.Event()
            self._waiting.append(event)
            left = None if deadline is None else max(deadline - clock.monotonic(), 0.0)
            outcome = await wait_on(clock, event, left)
            if outcome != "set":
                running = ", ".join(r.name for r in self.session.runs()) or "none"
                how = f" for {timeout}s" if timeout is not None else ""
                why = "; every task is blocked and no timer is due" if outcome == "stuck" else ""
                raise WaitTimeoutError(
                    f"waited{how} for a background result to hand to the model; none landed "
                    f"(running: {running}){why}"
                )

    def audible(self) -> list[BackgroundResult]:
        """The waiting results the model is to be told of (not the silent ones)."""
        return [r for r in self.inbox.peek() if r.scheduling is not Scheduling.SILENT]

    def _landed(self, result: BackgroundResult) -> None:
        """The inbox got a result (any thread): tell whoever waits for one, on the loop."""
        if result.scheduling is not Scheduling.SILENT:
            self.runtime.soon(self._held_or_told)

    def _held_or_told(self) -> None:
        if self.hold and not self.interrupting and self._hold_scope is None:
            self._start_expiry()  # held for a turn that may never come
        self.tell_waiting()

    def tell_waiting(self) -> None:
        """Wake the waits and ``on_waiting`` for what waits, unless a turn will take it."""
        if self.busy() or not self._quiet():
            # A turn is being built (its context takes them; checked again after), the caller
            # is talking, or their turn is coming: it will take them.
            return
        waiting = self.audible()
        if not waiting:
            return
        events, self._waiting = self._waiting, []
        for event in events:
            event.set()
        if self.on_waiting is not None:
            for result in waiting:
                self.runtime.spawn(self._call, self.on_waiting, result)

    async def _call(self, fn: Deliver, result: BackgroundResult) -> bool:
        """Call a hook of the loop's (sync or async); its failure is reported, never raised."""
        try:
            outcome = fn(result)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception as exc:
            self.runtime.report(fn, exc)
            return False
        return True

    def begin_interruption(self) -> None:
        """The caller started talking over the agent (see ``Conversation``)."""
        self.interrupting = True
        self.runtime.soon(self._stop_expiry)  # a hold ends with this interruption's end

    def end_interruption(self, turn_follows: bool) -> None:
        """The caller stopped talking (see ``Conversation.end_interruption``)."""
        self.interrupting = False
        if turn_follows:
            self.hold = True  # user_turn clears it once its context took them
            # ...unless no words come: then the hold expires (a turn never strands them). The
            # timer runs only while something is held: most holds end in a turn, holding none.
            if self.audible():
                self.runtime.soon(self._start_expiry)
            return
        self.release()

    def release(self) -> None:
        """End a hold: what it held goes to ``on_delivery`` (urgent results) and the waits
        and ``on_waiting`` are told (any thread)."""
        self.hold = False
        self.runtime.soon(self._stop_expiry)
        if self.on_delivery is not None:
            self.runtime.soon(self._flush_interrupts)
        self.runtime.soon(self.tell_waiting)

    def turn_took_hold(self) -> None:
        """A user turn's context took what the hold kept (on the loop)."""
        self.hold = False
        self._stop_expiry()

    def _start_expiry(self) -> None:
        self._stop_expiry()
        if self.hold and self.runtime.running:
            scope = self._hold_scope = anyio.CancelScope()
            self.runtime.spawn(self._expire, scope)

    def _stop_expiry(self) -> None:
        scope, self._hold_scope = self._hold_scope, None
        if scope is not None:
            scope.cancel()

    async def _expire(self, scope: anyio.CancelScope) -> None:
        with scope:
            await self.session.clock.sleep(self.hold_for)
            if self._hold_scope is scope:
                self._hold_scope = None
            if self.hold and not self.interrupting and not self.busy():
                self.release()

    def _flush_interrupts(self) -> None:
        if not self._quiet():
            return  # interrupted again before this ran: they wait for that one to end
        for result in self.inbox.take(scheduling=Scheduling.INTERRUPT):
            self.runtime.spawn(self._push, result)
