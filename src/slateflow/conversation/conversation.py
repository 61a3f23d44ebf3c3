"""The Conversation: one call over a Session, the object a voice or chat loop talks to.

A :class:`~slateflow.Session` runs resolvers. A :class:`Conversation` is the call over it:
user turns and what the model is told at each (a :class:`~slateflow.conversation.TurnContext`,
handed over in two phases), what the agent said, the extractors that read the turns, the flows
that govern them (``run_flow``), tool admission, the inbox of background results, interruptions
(barge-in) and voice timing. It reaches the session only through its public API; an adapter for
pipecat or LiveKit needs this page and nothing else.

A background result travels one way: the run ends, the session hands it to the ``deliver``
callback the conversation gave (``conversation.deliver``), and it waits in the inbox for the
next context, or goes to ``on_delivery`` at once when it is urgent and the caller is silent
(:mod:`slateflow.conversation.deliveries`).

A turn that is cancelled (a barge-in cancels the task that runs it) or fails is not taken: its
``turn:`` and ``temp:`` keys are cleared, it leaves the transcript (kept in
``cancelled_turns``), ``session:turn`` goes back, and the flows do not count it; what its
extractors already wrote stays, since the caller did say it.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from threading import get_ident
from typing import Any, overload

import anyio

from .. import tracing
from ..errors import SessionError, WaitTimeoutError
from ..flow import Admission, Flow, FlowRunner, FlowStack, StackRunner, signals
from ..flow.actions import in_flow_action
from ..flow.brief import merge_timing
from ..resolve import BackgroundResult, Deliver, Session
from ..resolve.clock import jumping, wait_on
from ..resolve.sections import Serial, open_sections
from ..state import State
from ..state.provenance import Stamp
from .context import (
    DEFAULT_HOLD,
    DEFAULT_MAX_TRANSCRIPT,
    VOICE_TIMING_KEY,
    HandoverMode,
    Turn,
    TurnContext,
    check_hold,
    check_options,
    end_turn,
    publish_timing,
    roll_back_turn,
)
from .deliveries import Deliveries
from .handover import Contexts
from .inbox import DEFAULT_INBOX_LIMIT, Inbox, redeliver
from .protocols import Governor, TurnHook
from .redaction import mask_spans
from .redaction import redact as redact_transcript
from .tools import ToolClaim, ToolDesk, ToolResult, admit_all
from .turn_ids import TurnIds

__all__ = ["Conversation"]

log = logging.getLogger("slateflow.conversation")

_TURN = Stamp("session", "turn", None, None)

# One conversation per session: a second one would count the same turns again.
_conversations: weakref.WeakKeyDictionary[Session, Conversation] = weakref.WeakKeyDictionary()


class Conversation:
    """One call over a :class:`~slateflow.Session` (see the module docstring).

    ``redact`` cleans each user turn before anything reads it (default: card numbers, codes,
    e-mails and long digit runs masked; ``None`` keeps the words as heard). ``tools`` names the
    agent's tools, for the turn context. ``on_delivery`` receives ``interrupt`` background
    results the moment they land (unless the user is interrupting); everything else waits for
    the next context, and ``on_waiting`` is told each time a result starts waiting between
    turns. ``handover``: what building a context does to the last one not confirmed
    (``"auto"``: handed over, ``"explicit"``: dropped). ``transcript`` keeps the last
    ``max_transcript`` turns; at most ``max_waiting`` results wait for the model.

    One conversation per session. Its methods are called from the thread running the session's
    event loop, except the interruption calls, which a voice loop may make from any thread.
    """

    def __init__(
        self,
        session: Session,
        *,
        redact: Callable[[str], str] | None = redact_transcript,
        tools: Iterable[str] = (),
        on_delivery: Deliver | None = None,
        on_waiting: Deliver | None = None,
        handover: HandoverMode = "auto",
        max_transcript: int = DEFAULT_MAX_TRANSCRIPT,
        max_waiting: int = DEFAULT_INBOX_LIMIT,
        hold_for: float = DEFAULT_HOLD,
    ) -> None:
        if not isinstance(session, Session):
            raise TypeError(f"Conversation needs a Session, got {type(session).__name__}")
        check_options(redact, on_delivery, on_waiting, handover, max_transcript, max_waiting)
        check_hold(hold_for)
        other = _conversations.get(session)
        if other is not None:
            raise SessionError(
                "this session already has a conversation; a session carries one call: make "
                "another Session (over its own State) for another call"
            )
        _conversations[session] = self
        self.session = session
        self.state: State = session.state
        self.redact = redact
        self.tools = tuple(dict.fromkeys([tools] if isinstance(tools, str) else tools))
        self.max_transcript = max_transcript
        self._runtime = session.runtime
        self._lock = Serial(self._runtime.spawn)
        self._deliveries = Deliveries(
            session, on_delivery, on_waiting, max_waiting, self._lock.lock.locked, hold_for
        )
        self.inbox: Inbox = self._deliveries.inbox
        """Background results waiting for the model."""
        self.deliver: Deliver = self._deliveries.deliver
        """The ``deliver`` callback that brings a background result to this conversation:
        ``session.background(resolver, conversation.deliver)``."""
        # Under a manual clock (tests), work that needs no time (a background lookup that
        # answers at once) runs before a turn looks: a test sees what production would.
        self._settle: Callable[[], Awaitable[None]] | None = getattr(session.clock, "settle", None)
        self._transcript: list[Turn] = []
        self._cancelled: list[Turn] = []
        self._hooks: list[TurnHook] = []
        self._flows: list[Governor] = []
        self._desk = ToolDesk(self.admit, self._tool_done, self._tool_hooks)
        # A recovered (durable) State remembers how many turns the call had: keep counting.
        before = self.state.get("session:turn")
        self._base = before if type(before) is int and before > 0 else 0
        self._turn_key: int | None = before if type(before) is int else None
        self._timing: Any = self.state.get(VOICE_TIMING_KEY)  # what was last published
        self._contexts = Contexts(
            self.state, self.inbox, self._runtime, handover, self._number, self._publish
        )
        self._turns = TurnIds()
        self._over = anyio.Event()
        signals.steps_changed.connect(self._steps_changed)
        signals.flow_over.connect(self._flow_over)
        session.on_close(self._closed)

    @property
    def handover(self) -> HandoverMode:
        """What building a context does to the last one not confirmed: ``"auto"`` hands it
        over, ``"explicit"`` drops it."""
        return self._contexts.mode

    @classmethod
    def of(cls, session: Session) -> Conversation:
        """The conversation over ``session``, typed, for code that has only the session at
        hand (a watcher, a fixture, a framework callback). Raises
        :class:`~slateflow.errors.SessionError` when the session carries none."""
        found = _conversations.get(session)
        if found is None:
            raise SessionError(
                f"{session!r} carries no conversation; make one with Conversation(session)"
            )
        return found

    def _closed(self) -> None:
        signals.steps_changed.disconnect(self._steps_changed)
        signals.flow_over.disconnect(self._flow_over)

    # -- turns -------------------------------------------------------------------------------

    async def user_turn(self, text: str, *, message_id: str | None = None) -> TurnContext:
        """Handle what the user just said and return what the model should be told now.

        In order: the text is redacted and recorded (:attr:`transcript`, ``turn:user`` and
        ``session:turn``); the extractors run; the flows advance (waiting for their call-mode
        actions); the context is built (pending until handed over, see
        :class:`~slateflow.conversation.TurnContext`); the ``turn:`` and ``temp:`` keys are
        cleared. Turns are handled one at a time, in order. A turn that is cancelled (a
        barge-in cancels its task) or raises is not taken: its turn keys are cleared, it leaves
        the transcript (see :attr:`cancelled_turns`) and the flows do not count it.

        ``message_id`` (the framework's id of the user message) makes the call idempotent: the
        same id again returns the first call's context (waiting for it if it is still being
        handled) and handles nothing twice; a turn that was not taken may be fed again.
        """
        tracer = tracing.current
        with nullcontext() if tracer is None else tracer.turn(self, self._number() + 1):
            if message_id is None:
                return await self._user_turn(text)
            return await self._turns.once(message_id, lambda: self._user_turn(text))

    async def _user_turn(self, text: str) -> TurnContext:
        runtime = self._runtime
        if not runtime.accepting or get_ident() != runtime.thread:
            runtime.check()  # raises: the session is not open, or this is not its thread
        if not isinstance(text, str):
            raise TypeError(f"user_turn takes the transcript text, got {type(text).__name__}")
        if open_sections() and (self._lock.held_here() or in_flow_action()):
            raise SessionError(
                "user_turn was called from inside a turn (a flow action, an extractor or a "
                "hook), which would wait for itself; the caller's next words are a new turn "
                "of the voice loop"
            )
        async with self._lock:
            # The loop moved on: the last context was used (or, explicitly, was not). Settled
            # before this turn's words are read, so a "yes" to a read-back it carried counts.
            self._contexts.conclude_previous()
            if self._settle is not None:
                await self._settle()
            state = self.state
            number = self._number() + 1
            clean = self._clean(text)
            turn = Turn(number, clean, self.session.clock.time())
            before = self._turn_key
            self._keep(self._transcript, turn)
            flows = self._live()
            begun: list[Governor] = []
            counted: list[Governor] = []
            taken = False
            try:
                # The conversation's own keys, as the runtime writes its keys (one batch).
                writes = {"session:turn": turn.number, "turn:user": clean}
                state.engine.commit_owned(writes, (), _TURN, "turn", trusted=True)
                self._turn_key = turn.number
                for flow in flows:
                    flow.begin_turn()
                    begun.append(flow)
                for hook in list(self._hooks):
                    await self._hook(hook, hook.on_turn(self, turn))
                for flow in flows:
                    await flow.on_turn()
                    counted.append(flow)
                if self._lock.left:  # tools its actions ran: their hooks, before we look
                    await self._lock.drain()
                if self._settle is not None:
                    await self._settle()  # background work that needs no time lands now
                context = self._contexts.take(turn, flows, self.tools)
                self._deliveries.turn_took_hold()
                taken = True
            finally:
                if not taken:
                    self._drop_turn(turn, before, [g for g in begun if g not in counted])
                # On every exit path: a turn key must never act on the next turn.
                end_turn(state)
        self._deliveries.tell_waiting()
        return context

    def _clean(self, text: str) -> str:
        """The turn as recorded: what secret fields read masked, then redacted."""
        spans: list[tuple[int, int, str]] = []
        for hook in self._hooks:
            read = getattr(hook, "read_secrets", None)
            if read is not None:
                try:
                    spans += read(self.state, text)
                except Exception as exc:
                    log.error(
                        "slateflow conversation: extractor %r failed", hook.name, exc_info=exc
                    )
                    self._runtime.report(hook, exc)
        masked = mask_spans(text, spans) if spans else text
        return self.redact(masked) if self.redact is not None else masked

    def _drop_turn(self, turn: Turn, before: Any, uncounted: list[Governor]) -> None:
        """A turn that did not complete is not taken (see the module docs)."""
        if turn in self._transcript:
            self._transcript.remove(turn)
        self._keep(self._cancelled, turn)
        for flow in uncounted:
            try:
                flow.abort_turn()
            except Exception as exc:
                self._runtime.report(flow, exc)
        if roll_back_turn(self.state, before):
            self._turn_key = before

    def context_now(self) -> TurnContext:
        """What the model should be told now, between turns (a background result landed while
        the model is idle, say); nothing is recorded and no extractor runs. Called while a
        turn is being handled, it takes what that turn's context would (use
        :meth:`context_between_turns`, which waits for the turn)."""
        self._runtime.check()
        return self._contexts.take(self._last_turn(), self._live(), self.tools)

    async def context_between_turns(self) -> TurnContext:
        """:meth:`context_now`, once no turn is being handled (it waits for one in flight, so
        a framework's idle callback never takes what the turn's context is to carry)."""
        self._runtime.check()
        if self._lock.held_here() or in_flow_action():
            return self.context_now()  # called from inside a turn's own work
        async with self._lock:
            return self.context_now()

    def context_for(self, *results: BackgroundResult) -> TurnContext:
        """A context carrying ``results`` (handed to ``on_delivery``, say) before anything
        else waiting: pending like any context, so dropping it (the model never said it)
        puts them back in the inbox."""
        self._runtime.check()
        for result in results:
            if not isinstance(result, BackgroundResult):
                raise TypeError(f"context_for takes BackgroundResults, got {result!r}")
        self.inbox.restore(results)
        return self._contexts.take(self._last_turn(), self._live(), self.tools)

    def preview(self, text: str) -> TurnContext:
        """What ``user_turn(text)`` would tell the model if the turn moved nothing (no value
        recognised, no step changed), built without writing or recording anything: the
        waiting results stay waiting, the last context stays pending. A framework that starts
        a reply before the turn is final (LiveKit's preemptive generation) compares it with
        the real turn's context: equal lines and tools mean the early reply stands."""
        self._runtime.check()
        if not isinstance(text, str):
            raise TypeError(f"preview takes the transcript text, got {type(text).__name__}")
        turn = Turn(self._number() + 1, self._clean(text), self.session.clock.time())
        return self._contexts.preview(turn, self._live(), self.tools)

    def _last_turn(self) -> Turn:
        return self._transcript[-1] if self._transcript else Turn(0, "", self.session.clock.time())

    def agent_said(self, text: str, *, context: TurnContext | None = None) -> Turn:
        """Record what the agent actually said (up to where the caller cut it off): it joins
        the transcript and the context it was spoken from counts as handed over: ``context``
        when given (a voice loop that knows which reply it was), else the last one built."""
        self._runtime.check()
        if not isinstance(text, str):
            raise TypeError(f"agent_said takes the text the agent said, got {type(text).__name__}")
        clean = self.redact(text) if self.redact is not None else text
        turn = Turn(self._number(), clean, self.session.clock.time(), "agent")
        self._keep(self._transcript, turn)
        if context is not None:
            if context.status == "pending":
                context.handed_over()
            return turn
        pending = self._contexts.pending
        if pending is not None and pending.status == "pending":
            pending.confirm()  # the agent spoke from it: the model had it
        return turn

    @property
    def transcript(self) -> list[Turn]:
        """The conversation so far, redacted, oldest first (user and agent turns)."""
        return self._transcript

    @property
    def cancelled_turns(self) -> list[Turn]:
        """User turns that were cancelled or failed before they completed (not taken)."""
        return self._cancelled

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
        for turn in reversed(self._transcript):
            if turn.speaker == "user":
                return turn.number
        return self._base

    def add_extractor(self, extractor: TurnHook) -> None:
        """Run ``extractor`` on this conversation's user turns, as its triggers say (in the
        order added, each reading the redacted transcript)."""
        if not isinstance(extractor, TurnHook):
            raise TypeError(
                f"add_extractor takes an extractor (Extract(...).build() or an LLMExtractor), "
                f"got {extractor!r}"
            )
        if extractor in self._hooks:
            raise SessionError(f"extractor {extractor.name!r} is already added")
        self._hooks.append(extractor)

    async def _hook(self, hook: TurnHook, work: Any) -> None:
        try:
            await work
        except Exception as exc:
            # One broken extractor must not cost the caller their turn.
            log.error("slateflow conversation: extractor %r failed", hook.name, exc_info=exc)
            self._runtime.report(hook, exc)

    # -- flows -------------------------------------------------------------------------------

    @overload
    def run_flow(self, flow: Flow, *, enforcement: Any = "enforce") -> FlowRunner: ...
    @overload
    def run_flow(self, flow: FlowStack, *, enforcement: Any = "enforce") -> StackRunner: ...

    def run_flow(
        self, flow: Flow | FlowStack, *, enforcement: Any = "enforce"
    ) -> FlowRunner | StackRunner:
        """Run ``flow`` (a ``Flow`` or a ``FlowStack``) in the session, governing this
        conversation's turns: its postures, grounds and tools shape every context, its
        background actions deliver here, and it closes with the session. Returns its runner.

        ``enforcement`` is ``"enforce"`` (refuse tools the flow does not admit) or
        ``"observe"`` (admit them and record violations). When the conversation was given its
        ``tools``, every tool name the flow uses must be among them (a misspelt ``allow=``
        would otherwise never admit its tool): a
        :class:`~slateflow.errors.FlowDefinitionError` names the ones that are not.
        """
        self._check_tools(flow)
        if isinstance(flow, FlowStack):
            runner: FlowRunner | StackRunner = flow.start(
                self.session, enforcement=enforcement, deliver=self.deliver, tools=self.tools
            )
        elif isinstance(flow, Flow):
            runner = flow.start(self.session, enforcement=enforcement, deliver=self.deliver)
        else:
            raise TypeError(f"run_flow takes a Flow or a FlowStack, got {flow!r}")
        self._flows.append(runner)
        return runner

    def _check_tools(self, flow: Flow | FlowStack) -> None:
        if not self.tools:
            return  # nothing to check against: the agent's tools were not named
        flow.compile(tools=self.tools)

    def _live(self) -> list[Governor]:
        return [g for g in self._flows if not g.closed]

    # -- tools -------------------------------------------------------------------------------

    def admit(self, tool: str, *, record: bool = True) -> Admission:
        """May the model call ``tool`` now? Every flow must admit it (the first refusal wins,
        with its reason); in observe mode a breach is admitted, flagged ``violation`` and
        recorded by its flow (``record=False``: a question, not a call)."""
        self._runtime.check()
        return admit_all(self._live(), tool, record)

    def claim(self, tool: str) -> AbstractAsyncContextManager[ToolClaim]:
        """Admit a call of ``tool`` atomically: ``async with conversation.claim("book") as
        claim:``; a once-only tool is held until the block ends, which reports the tool as
        successful unless ``claim.fail()`` was called (an exception reports nothing)."""
        return self._desk.claim(tool)

    async def run_tool(
        self,
        tool: str,
        fn: Callable[..., Any],
        arguments: Mapping[str, Any] | None = None,
        *,
        call_id: str | None = None,
    ) -> ToolResult:
        """Run ``fn(**arguments)`` as a call of ``tool`` under :meth:`claim`; identical
        concurrent calls share one execution. Under a ``ManualClock`` it waits as the kit's
        waits do (a tool sleeping on it does not hang the test; see ``Session.call``).
        ``call_id``: the model's id of this tool call (traces carry it)."""
        tracer = tracing.current
        with nullcontext() if tracer is None else tracer.tool(tool, call_id):
            async with jumping(self.session.clock, f"tool {tool!r}"):
                return await self._desk.run(tool, fn, arguments)

    async def tool_ok(self, tool: str) -> None:
        """Report that ``tool`` ran successfully: the flows advance and extractors with
        ``Trigger.after_tool()`` run."""
        self._runtime.check()
        if type(tool) is not str or not tool:
            raise TypeError(f"tool_ok takes the tool's name, got {tool!r}")
        self._tool_done(tool)
        await self._tool_hooks(tool)

    def _tool_done(self, tool: str) -> None:
        for flow in self._live():
            flow.on_tool_ok(tool)

    async def _tool_hooks(self, tool: str) -> None:
        # Never waits: the turn holding the lock may wait for the action that ran this tool.
        await self._lock.run_or_leave(lambda: self._on_tool(tool))

    async def _on_tool(self, tool: str) -> None:
        for hook in list(self._hooks):
            await self._hook(hook, hook.on_tool(self, tool))
        self.publish_timing()

    # -- background results and interruptions (slateflow.conversation.deliveries) -----------

    def take_deliveries(self) -> list[BackgroundResult]:
        """The background results waiting for the model, oldest first; each is handed out
        once (a loop that builds no contexts hands them over itself)."""
        return self.inbox.take()

    def redeliver(self, *results: BackgroundResult) -> None:
        """Hand ``results`` to the model again (it never heard them: the bot was cut off)."""
        redeliver(self.state, self.inbox, results)

    async def wait_for_delivery(self, timeout: float | None = None) -> list[BackgroundResult]:
        """Wait until a background result waits for the model (the caller not talking) and
        return those waiting, left in place; raises ``WaitTimeoutError`` after ``timeout``."""
        self._runtime.check()
        return await self._deliveries.wait(timeout)

    @property
    def interrupting(self) -> bool:
        """Whether the user is interrupting (between the two interruption calls)."""
        return self._deliveries.interrupting

    def begin_interruption(self) -> None:
        """The user started talking over the agent: ``interrupt`` results landing now are held
        until :meth:`end_interruption`. Callable from any thread."""
        self._deliveries.begin_interruption()

    def end_interruption(self, *, turn_follows: bool = True) -> None:
        """The user stopped talking: held results go into the next turn's context, or with
        ``turn_follows=False`` (noise, a cough) to ``on_delivery`` now. A turn that does not
        come within ``hold_for`` seconds (the session's clock) releases them as after noise
        (``on_delivery``, ``on_waiting``). Callable from any thread."""
        self._deliveries.end_interruption(turn_follows)

    # -- the end of the call -----------------------------------------------------------------

    @property
    def is_over(self) -> bool:
        """Whether the call is over: every flow this conversation runs is complete and its
        closing words were handed to the model (hang up once they are spoken, not when a
        key flips inside a tool). False while no flow runs."""
        flows = self._flows
        return bool(flows) and all(flow.is_over for flow in flows)

    async def wait_over(self, timeout: float | None = None) -> None:
        """Wait until :attr:`is_over` (on the session's clock); raises
        :class:`~slateflow.errors.WaitTimeoutError` after ``timeout`` seconds."""
        self._runtime.check()
        while not self.is_over:
            self._over = event = anyio.Event() if self._over.is_set() else self._over
            outcome = await wait_on(self.session.clock, event, timeout)
            if outcome != "set" and not self.is_over:
                flows = ", ".join(repr(getattr(f, "name", f)) for f in self._flows) or "none"
                how = f" {timeout}s" if timeout is not None else ""
                raise WaitTimeoutError(
                    f"waited{how} for the call to be over; its flows ({flows}) are not "
                    "complete with their closing words handed to the model"
                )

    def _flow_over(self, runner: object, **_: Any) -> None:
        if runner in self._flows:
            self._runtime.soon(self._over.set)

    # -- step changes and voice timing -------------------------------------------------------

    def _steps_changed(self, runner: object, *, since: int | None, timed: bool, **_: Any) -> None:
        """A flow of this conversation's session changed its active steps (any thread):
        ``since`` is the user turn after which the newly active steps' postures were handed
        to the model (None: never told)."""
        if getattr(runner, "session", None) is not self.session:
            return
        if timed or (since is not None and self._hooks):
            self._runtime.soon(self._runtime.spawn, self._after_step_change, since, timed)

    async def _after_step_change(self, since: int | None, timed: bool) -> None:
        if not self._runtime.open:
            return
        if timed:
            self.publish_timing()
        if since is None or not self._hooks:
            return
        async with self._lock:
            for hook in list(self._hooks):
                await self._hook(hook, hook.on_step_change(self, since))
            # Between turns, a re-read's turn-scoped keys belong to no turn: a stale
            # "turn:topic" must not start a digression at the next one.
            if self.state.keys("turn:") or self.state.keys("temp:"):
                end_turn(self.state)

    def publish_timing(self) -> None:
        """Merge the voice timing of every flow's speaking steps and publish it at
        ``session:voice_timing`` (removed when none has any)."""
        merged = merge_timing(flow.brief().timing for flow in self._live())
        self._publish(merged.model_dump(mode="json", exclude_none=True) if merged else None)

    def _publish(self, value: dict[str, Any] | None) -> None:
        if value != self._timing:  # written on change only: readers react to changes
            publish_timing(self.state, value)
            self._timing = value

    def __repr__(self) -> str:
        turns = sum(1 for t in self._transcript if t.speaker == "user")
        return f"<Conversation: {turns} user turns, {len(self.inbox)} waiting>"
