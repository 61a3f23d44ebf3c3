"""The machinery of a :class:`~slateflow.conversation.Call`: turns, contexts, deliveries.

A :class:`Dialog` holds what the Call owns: the transcript, the extractors and flows that read
it, the inbox of background results, interruptions, voice timing and the two-phase hand-over of
each turn context. The Call is its public face; the Session it runs over keeps the resolver
tasks and is reached through ``session.loop``.

Every exit path of a turn is handled: a turn that is cancelled (a barge-in cancels the task that
runs it) or fails is not taken. Its ``turn:`` and ``temp:`` keys are cleared, it leaves the
transcript (kept in ``cancelled_turns``), ``session:turn`` goes back, and the flows do not count
it; what its extractors already wrote stays, since the caller did say it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal

import anyio

from ..errors import SessionError, WaitTimeoutError
from ..resolve.background import BackgroundResult, Deliver, Scheduling
from ..resolve.clock import wait_on
from ..resolve.inbox import DEFAULT_INBOX_LIMIT, Inbox, ToInbox
from ..resolve.turns import (
    DEFAULT_MAX_TRANSCRIPT,
    VOICE_TIMING_KEY,
    Governor,
    Handover,
    HandoverMode,
    Turn,
    TurnContext,
    TurnHook,
    check_options,
    context_lines,
    delivery_line,
)
from ..state.scopes import end_turn
from .tools import ToolClaim

if TYPE_CHECKING:
    from ..resolve.session import Session
    from .call import Call

__all__ = ["DEFAULT_MAX_TRANSCRIPT", "DELIVERED_KEY", "Dialog", "HandoverMode"]

log = logging.getLogger("slateflow.resolve")

DELIVERED_KEY = "session:delivered"
"""On a durable State: per resolver, the seq of the last background result handed to the model
(a result committed after it is handed over again when a restarted session opens)."""


def _count(value: object) -> int:
    return value if type(value) is int and value > 0 else 1


def _closed(runner: object) -> bool:
    return bool(getattr(runner, "closed", False))


class Dialog:
    """The turns and deliveries of one Session; made by the Session (see the module docs)."""

    def __init__(
        self,
        session: Session,
        call: Call,
        *,
        redact: Callable[[str], str] | None,
        tools: tuple[str, ...],
        on_delivery: Deliver | None,
        on_waiting: Deliver | None,
        handover: HandoverMode,
        max_transcript: int = DEFAULT_MAX_TRANSCRIPT,
        max_waiting: int = DEFAULT_INBOX_LIMIT,
    ) -> None:
        check_options(redact, on_delivery, on_waiting, handover, max_transcript, max_waiting)
        self.session = session
        self.call = call  # what extractors are given: they read its transcript
        self.state = session.state
        self.redact = redact
        self.tools = tools
        self.on_delivery = on_delivery
        self.on_waiting = on_waiting
        self.handover: HandoverMode = handover
        self.transcript: list[Turn] = []
        self.cancelled_turns: list[Turn] = []
        self.max_transcript = max_transcript
        self.inbox = Inbox(self._landed, limit=max_waiting)
        self.hooks: list[TurnHook] = []
        self.governors: list[Governor] = []
        self.lock: anyio.Lock | None = None
        self.interrupting = False
        # An interruption ended and the caller's turn is on its way: interrupt results wait
        # for that turn's context instead of being spoken before it.
        self._hold = False
        self._last_lines: frozenset[str] = frozenset()
        self._pending: Handover | None = None
        self._timing: Any = None
        self._waiting: list[anyio.Event] = []
        self._base = 0  # the turns a recovered call had before this session, or dropped

    # -- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        """Called as the session opens: results a previous process never handed over wait."""
        # No checkpoint when nobody holds it: a turn must not yield to the loop just to start.
        self.lock = anyio.Lock(fast_acquire=True)
        # A recovered (durable) State remembers how many turns the call had: keep counting.
        before = self.state.get("session:turn")
        self._base = before if type(before) is int and before > 0 else 0
        self._recover()

    def _live(self) -> list[Governor]:
        return [g for g in self.governors if not _closed(g)]

    def user_turns(self, after: int = 0) -> list[Turn]:
        """The user turns of the transcript numbered above ``after``, oldest first."""
        return [t for t in self.transcript if t.speaker == "user" and t.number > after]

    def _keep(self, turns: list[Turn], turn: Turn) -> None:
        """Append ``turn`` to ``turns``, dropping the oldest past ``max_transcript``."""
        turns.append(turn)
        over = len(turns) - self.max_transcript
        if over > 0:
            for old in turns[:over]:
                if old.speaker == "user":
                    self._base = max(self._base, old.number)  # numbering goes on
            del turns[:over]

    def _number(self) -> int:
        for turn in reversed(self.transcript):
            if turn.speaker == "user":
                return turn.number
        return self._base

    # -- turns -------------------------------------------------------------------------------

    async def user_turn(self, text: str) -> TurnContext:
        session = self.session
        session.loop.check()
        if not isinstance(text, str):
            raise TypeError(f"user_turn takes the transcript text, got {type(text).__name__}")
        assert self.lock is not None
        async with self.lock:
            # The loop moved on: the last context was used (or, explicitly, was not). Settled
            # before this turn's words are read, so a "yes" to a read-back it carried counts.
            self._settle_previous()
            await self._settle_clock()
            state = self.state
            clean = self.redact(text) if self.redact is not None else text
            turn = Turn(self._number() + 1, clean, session.clock.time())
            before = state.get("session:turn")
            self._keep(self.transcript, turn)
            governors = self._live()
            begun: list[Governor] = []
            counted: list[Governor] = []
            taken = False
            try:
                with state.transaction():
                    state.set("session:turn", turn.number, source="session", writer="turn")
                    state.set("turn:user", clean, source="session", writer="turn")
                for governor in governors:
                    governor.begin_turn()
                    begun.append(governor)
                for hook in list(self.hooks):
                    await self._hook(hook, hook._on_turn(self.call, turn))
                for governor in governors:
                    await governor.on_turn()
                    counted.append(governor)
                self.publish_timing()
                await self._settle_clock()  # background work that needs no time lands now
                context = self._context(turn)
                self._hold = False
                taken = True
            finally:
                if not taken:
                    self._drop_turn(turn, before, [g for g in begun if g not in counted])
                # On every exit path: a turn key must never act on the next turn.
                end_turn(state)
        self._tell_waiting()
        return context

    def _drop_turn(self, turn: Turn, before: Any, uncounted: list[Governor]) -> None:
        """A turn that did not complete is not taken (see the module docs)."""
        if turn in self.transcript:
            self.transcript.remove(turn)
        self._keep(self.cancelled_turns, turn)
        for governor in uncounted:
            try:
                governor.abort_turn()
            except Exception as exc:
                self.session.loop.report(governor, exc)
        try:
            if before is None:
                self.state.remove("session:turn", None, source="session", writer="turn")
            else:
                self.state.set("session:turn", before, source="session", writer="turn")
        except Exception as exc:  # a closed store: the turn is still not taken in memory
            log.error("slateflow session: could not roll back session:turn: %s", exc)

    async def _settle_clock(self) -> None:
        # Under a manual clock (tests), work that needs no time (a background lookup that
        # answers at once) runs before the turn looks: a test sees what production would.
        settle = getattr(self.session.clock, "settle", None)
        if settle is not None:
            await settle()

    def context_now(self) -> TurnContext:
        self.session.loop.check()
        turn = self.transcript[-1] if self.transcript else Turn(0, "", self.session.clock.time())
        self.publish_timing()
        return self._context(turn)

    def agent_said(self, text: str) -> Turn:
        self.session.loop.check()
        if not isinstance(text, str):
            raise TypeError(f"agent_said takes the text the agent said, got {type(text).__name__}")
        clean = self.redact(text) if self.redact is not None else text
        turn = Turn(self._number(), clean, self.session.clock.time(), "agent")
        self._keep(self.transcript, turn)
        pending = self._pending
        if pending is not None and pending.status == "pending":
            pending.confirm()  # the agent spoke from it: the model had it
        return turn

    async def tool_ok(self, tool: str) -> None:
        self.session.loop.check()
        if type(tool) is not str or not tool:
            raise TypeError(f"tool_ok takes the tool's name, got {tool!r}")
        for governor in self._live():
            governor.on_tool_ok(tool)
        assert self.lock is not None
        async with self.lock:
            for hook in list(self.hooks):
                await self._hook(hook, hook._on_tool(self.call, tool))
        self.publish_timing()

    def admit(self, tool: str, *, record: bool = True) -> ToolClaim:
        """Whether every flow admits a call of ``tool`` now (the first refusal wins); in observe
        mode an admitted breach is recorded by its flow (unless ``record=False``) and flagged
        ``violation``; ``once`` when a flow lets it succeed only once."""
        self.session.loop.check()
        flagged = ""
        once = False
        for governor in self._live():
            admission = governor.admit(tool, record=record)
            once = once or admission.once
            if not admission.allowed:
                return ToolClaim(tool, False, admission.reason, once=once)
            if admission.violation and not flagged:
                flagged = admission.reason
        return ToolClaim(tool, True, flagged, violation=bool(flagged), once=once)

    def refusal(self, tool: str) -> str | None:
        """Why a flow refuses ``tool`` now, or None (observe mode refuses nothing)."""
        claim = self.admit(tool, record=False)
        return None if claim.allowed else claim.reason

    async def _hook(self, hook: TurnHook, work: Any) -> None:
        try:
            await work
        except Exception as exc:
            # One broken extractor must not cost the caller their turn.
            log.error("slateflow session: extractor %r failed", hook.name, exc_info=exc)
            self.session.loop.report(hook, exc)

    # -- the context and its hand-over --------------------------------------------------------

    def _settle_previous(self) -> None:
        """The loop moved on from the last context: in "auto" it used it, in "explicit" (not
        confirmed) it did not."""
        previous = self._pending
        if previous is not None and previous.status == "pending":
            self._settle(previous, self.handover == "auto")

    def _context(self, turn: Turn) -> TurnContext:
        self._settle_previous()
        governors = self._live()
        postures = [p for g in governors for p in g.postures()]
        grounds = [x for g in governors for x in g.grounds()]
        reprompts = [x for g in governors for x in g.reprompts()]
        unmet = [u for g in governors for u in g.unmet_requirements()]
        markers = tuple(m for g in governors if (m := g.told_marker()) is not None)
        known = dict.fromkeys(self.tools)
        for g in governors:
            known.update(dict.fromkeys(g.known_tools()))
        refused: dict[str, str] = {}
        for tool in known:
            reason = self.refusal(tool)
            if reason is not None:
                refused[tool] = reason
        tools = [t for t in known if t not in refused]
        deliveries = tuple(self.inbox.take())
        every = tuple(context_lines(postures, grounds, reprompts, unmet, deliveries, tools))
        # A new result is news even when its text matches last turn's (a re-poll's answer).
        news = {delivery_line(d) for d in deliveries}
        lines = [line for line in every if line in news or line not in self._last_lines]
        handover = Handover(every, deliveries, markers, self._settle)
        self._pending = handover
        timing = self._timing
        return TurnContext(
            turn,
            tuple(postures),
            tuple(grounds),
            tuple(reprompts),
            tuple(unmet),
            deliveries,
            tuple(tools),
            refused,
            timing.model_dump(mode="json", exclude_none=True) if timing is not None else None,
            every,
            tuple(lines),
            handover,
        )

    def _settle(self, handover: Handover, confirmed: bool) -> None:
        """Confirm (the model got it) or drop (it did not) a context's hand-over, once."""
        want: Literal["handed_over", "dropped"] = "handed_over" if confirmed else "dropped"
        if handover.status != "pending":
            if handover.status == want:
                return
            raise SessionError(
                f"this turn context was already {handover.status.replace('_', ' ')}; a context "
                "is handed over or dropped once (in handover='explicit', building the next "
                "context drops the last one)"
            )
        handover.status = want
        if self._pending is handover:
            self._pending = None
        if not confirmed:
            self.inbox.restore(handover.deliveries)
            return
        self._last_lines = frozenset(handover.every)
        number = self._number()
        for marker in handover.markers:
            try:
                marker(number)
            except Exception as exc:
                self.session.loop.report(marker, exc)
        self._record_delivered(handover.deliveries)

    def redeliver(self, results: Iterable[BackgroundResult]) -> None:
        given = list(results)
        for result in given:
            if not isinstance(result, BackgroundResult):
                raise TypeError(
                    f"redeliver takes the BackgroundResults the model did not hear, got {result!r}"
                )
        self._forget_delivered(given)
        self.inbox.restore(given)

    # -- what is waiting for the model ----------------------------------------------------------

    def to_model(self, result: BackgroundResult, origin: object = None) -> Any:
        """Where a background result with no ``deliver`` of its own goes."""
        if (
            result.scheduling is Scheduling.INTERRUPT
            and self.on_delivery is not None
            and not self.interrupting
            and not self._hold
        ):
            return self._push(result)
        self.inbox.put(result, origin)
        return None

    def inbox_delivery(self, origin: object) -> ToInbox:
        return ToInbox(self.to_model, origin)

    async def _push(self, result: BackgroundResult) -> None:
        assert self.on_delivery is not None
        if self.interrupting or self._hold:
            # Interrupted again before this push ran: hold it for the end of that one.
            self.inbox.put(result)
            return
        if await self._call(self.on_delivery, result):
            self._record_delivered([result])
        else:
            self.inbox.put(result)  # not handed over: the next context carries it

    def begin_interruption(self) -> None:
        self.interrupting = True

    def end_interruption(self, turn_follows: bool) -> None:
        self.interrupting = False
        if turn_follows:
            self._hold = True  # user_turn clears it once its context took them
            return
        self._hold = False
        if self.on_delivery is not None:
            self.session.loop.soon(self._flush_interrupts)  # a voice loop may call from any thread
        self.session.loop.soon(self._tell_waiting)

    def _flush_interrupts(self) -> None:
        if self.interrupting or self._hold:
            return  # interrupted again before this ran: they wait for that one to end
        for result in self.inbox.take(scheduling=Scheduling.INTERRUPT):
            self.session.loop.spawn(self._push, result)

    def _landed(self, result: BackgroundResult) -> None:
        """The inbox got a result (any thread): tell whoever waits for one, on the loop."""
        if result.scheduling is not Scheduling.SILENT:
            self.session.loop.soon(self._tell_waiting)

    def _tell_waiting(self) -> None:
        if self.lock is not None and self.lock.locked():
            return  # a turn is being built: its context takes them (checked again after)
        waiting = [r for r in self.inbox.peek() if r.scheduling is not Scheduling.SILENT]
        if not waiting or self.interrupting or self._hold:
            return  # the caller is talking, or their turn is coming: it will take them
        events, self._waiting = self._waiting, []
        for event in events:
            event.set()
        if self.on_waiting is not None:
            for result in waiting:
                self.session.loop.spawn(self._call_waiting, result)

    async def _call_waiting(self, result: BackgroundResult) -> None:
        assert self.on_waiting is not None
        await self._call(self.on_waiting, result)

    async def _call(self, fn: Deliver, result: BackgroundResult) -> bool:
        """Call a hook of the loop's (sync or async); its failure is reported, never raised."""
        try:
            outcome = fn(result)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception as exc:
            self.session.loop.report(fn, exc)
            return False
        return True

    async def wait_for_delivery(self, timeout: float | None) -> list[BackgroundResult]:
        session = self.session
        session.loop.check()
        clock = session.clock
        deadline = None if timeout is None else clock.monotonic() + timeout
        while True:
            waiting = [r for r in self.inbox.peek() if r.scheduling is not Scheduling.SILENT]
            if waiting and not self.interrupting and not self._hold:
                return waiting
            event = anyio.Event()
            self._waiting.append(event)
            left = None if deadline is None else max(deadline - clock.monotonic(), 0.0)
            outcome = await wait_on(clock, event, left)
            if outcome != "set":
                running = ", ".join(r.name for r in session.runs()) or "none"
                how = f" for {timeout}s" if timeout is not None else ""
                why = "; every task is blocked and no timer is due" if outcome == "stuck" else ""
                raise WaitTimeoutError(
                    f"waited{how} for a background result to hand to the model; none landed "
                    f"(running: {running}){why}"
                )

    # -- durable deliveries ----------------------------------------------------------------------

    def _record_delivered(self, results: Iterable[BackgroundResult]) -> None:
        if self.state.store is None:
            return
        done = {r.name: r.seq for r in results if r.seq}
        if not done:
            return

        def merged(seen: Any) -> dict[str, int]:
            out = dict(seen) if isinstance(seen, dict) else {}
            for name, seq in done.items():
                out[name] = max(int(out.get(name, 0)), seq)
            return out

        try:
            self.state.modify(DELIVERED_KEY, {}, merged, source="session", writer="delivery")
        except Exception as exc:
            log.error("slateflow session: could not record deliveries: %s", exc)

    def _forget_delivered(self, results: list[BackgroundResult]) -> None:
        if self.state.store is None or not any(r.seq for r in results):
            return

        def back(seen: Any) -> dict[str, int]:
            out = dict(seen) if isinstance(seen, dict) else {}
            for r in results:
                if r.seq and int(out.get(r.name, 0)) >= r.seq:
                    out[r.name] = r.seq - 1
            return out

        self.state.modify(DELIVERED_KEY, {}, back, source="session", writer="delivery")

    def _recover(self) -> None:
        """On a durable State: put back the background results a previous process committed
        but never handed to the model, oldest first (each exactly once: handing one over
        records it)."""
        state = self.state
        if state.store is None:
            return
        seen = state.get(DELIVERED_KEY, {})
        delivered = seen if isinstance(seen, dict) else {}
        found: list[BackgroundResult] = []
        for key in state.keys(prefix=""):
            if not key.endswith(":status"):
                continue
            entry = state.entry(key)
            if entry is None or entry.value not in ("done", "error"):
                continue
            meta = entry.provenance.meta or {}
            name = key[: -len(":status")]
            if not meta.get("inbox") or int(delivered.get(name, 0)) >= entry.seq:
                continue
            done = entry.value == "done"
            try:
                scheduling = Scheduling(str(meta.get("scheduling", "when_idle")))
            except ValueError:
                scheduling = Scheduling.WHEN_IDLE
            result = BackgroundResult(
                name=name,
                status="completed" if done else "error",
                value=state.get(f"{name}:result") if done else None,
                error=None if done else state.get(f"{name}:error"),
                scheduling=scheduling,
                attempts=_count(meta.get("attempt", meta.get("attempts"))),
                seq=entry.seq,
            )
            found.append(self.session.dress(result))
        for result in sorted(found, key=lambda r: r.seq):
            self.inbox.put(result)

    # -- step changes and voice timing ---------------------------------------------------------

    def steps_changed(self, since: int | None, timed: bool) -> None:
        """A flow changed its active steps (any thread): ``since`` is the user turn after which
        the newly active steps' postures were handed to the model (None: never told)."""
        if timed or (since is not None and self.hooks):
            self.session.loop.soon(self.session.loop.spawn, self._after_step_change, since, timed)

    async def _after_step_change(self, since: int | None, timed: bool) -> None:
        session = self.session
        if not session.loop.open:
            return
        if timed:
            self.publish_timing()
        if since is None or not self.hooks or self.lock is None:
            return
        async with self.lock:
            for hook in list(self.hooks):
                await self._hook(hook, hook._on_step_change(self.call, since))
            # Between turns, a re-read's turn-scoped keys belong to no turn: a stale
            # "turn:topic" must not start a digression at the next one.
            if self.state.keys("turn:") or self.state.keys("temp:"):
                end_turn(self.state)

    def publish_timing(self) -> None:
        merged: Any = None
        for governor in self._live():
            timing = governor.voice_timing()
            if timing is not None:
                merged = timing if merged is None else merged.merge(timing)
        self._timing = merged
        state = self.state
        key = VOICE_TIMING_KEY
        if merged is None:
            if state.contains(key):
                state.remove(key, source="session", writer="voice_timing")
            return
        value = merged.model_dump(mode="json", exclude_none=True)
        if state.get(key) != value:  # written on change only: readers react to changes
            state.set(key, value, source="session", writer="voice_timing")
