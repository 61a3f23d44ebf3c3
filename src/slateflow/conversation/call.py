"""The Call: one conversation over a Session, the object a voice or chat loop talks to.

A :class:`~slateflow.Session` runs resolvers (modes, scheduling, retries, timeouts, its tasks).
A :class:`Call` is the conversation over it: user turns and what the model is told at each
(a :class:`~slateflow.resolve.TurnContext`, handed over in two phases), what the agent said,
the extractors that read the turns, the flows that govern them (with their digressions), tool
admission, the inbox of background results, interruptions (barge-in) and voice timing. It
reaches the session only through its public runtime (``session.loop``, ``dispatch``,
``background``): an adapter for pipecat or LiveKit needs this page and nothing else.

``call = Call(session)`` attaches to the session (one Call per session); ``session.conversation``
is the same object, created with the session's conversation options when nobody made one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from ..errors import SessionError
from ..resolve.background import BackgroundResult, Deliver
from ..resolve.inbox import DEFAULT_INBOX_LIMIT, Inbox, ToInbox
from ..resolve.session import Session
from ..resolve.turns import Governor, Runnable, Turn, TurnContext, TurnHook
from ..state import State
from ..state.redaction import redact as redact_transcript
from .dialog import DEFAULT_MAX_TRANSCRIPT, Dialog, HandoverMode
from .tools import ToolClaim, ToolDesk, ToolResult

__all__ = ["Call"]


class Call:
    """One conversation over a :class:`~slateflow.Session` (see the module docstring).

    ``redact`` cleans each user turn before anything reads it (default: card numbers, codes,
    e-mails and long digit runs masked; ``None`` keeps the words as heard). ``tools`` names the
    agent's tools, for the turn context. ``on_delivery`` receives ``interrupt`` background
    results the moment they land (unless the user is interrupting); everything else waits for
    the next context, and ``on_waiting`` is told each time a result starts waiting between
    turns. ``handover``: what building a context does to the last one not confirmed
    (``"auto"``: handed over, ``"explicit"``: dropped). ``transcript`` keeps the last
    ``max_transcript`` turns; at most ``max_waiting`` results wait for the model.
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
    ) -> None:
        if not isinstance(session, Session):
            raise TypeError(f"Call needs a Session, got {type(session).__name__}")
        names = [tools] if isinstance(tools, str) else list(tools)
        self.session = session
        self._dialog = Dialog(
            session,
            self,
            redact=redact,
            tools=tuple(dict.fromkeys(names)),
            on_delivery=on_delivery,
            on_waiting=on_waiting,
            handover=handover,
            max_transcript=max_transcript,
            max_waiting=max_waiting,
        )
        self._desk = ToolDesk(self._dialog)
        session.attach(self)
        if session.loop.open:
            self._dialog.open()

    @classmethod
    def of(cls, session: Session) -> Call:
        """The call of ``session``: the one attached, else one made with the conversation
        options given to the session (``session.conversation``, typed)."""
        conversation = session.conversation
        if not isinstance(conversation, Call):
            raise SessionError(f"this session's conversation is not a Call: {conversation!r}")
        return conversation

    @property
    def state(self) -> State:
        """The session's State."""
        state: State = self.session.state
        return state

    # -- turns -------------------------------------------------------------------------------

    async def user_turn(self, text: str) -> TurnContext:
        """Handle what the user just said and return what the model should be told now.

        In order: the text is redacted and recorded (:attr:`transcript`, ``turn:user`` and
        ``session:turn``); the extractors run; the flows advance (waiting for their call-mode
        actions); the context is built (pending until handed over, see
        :class:`~slateflow.resolve.TurnContext`); the ``turn:`` and ``temp:`` keys are
        cleared. Turns are handled one at a time, in order. A turn that is cancelled (a
        barge-in cancels its task) or raises is not taken: its turn keys are cleared, it leaves
        the transcript (see :attr:`cancelled_turns`) and the flows do not count it.
        """
        return await self._dialog.user_turn(text)

    def context_now(self) -> TurnContext:
        """What the model should be told now, between turns (a background result landed while
        the model is idle, say); nothing is recorded and no extractor runs."""
        return self._dialog.context_now()

    def agent_said(self, text: str) -> Turn:
        """Record what the agent actually said (up to where the caller cut it off): it joins
        the transcript and the context it was spoken from counts as handed over."""
        return self._dialog.agent_said(text)

    @property
    def transcript(self) -> list[Turn]:
        """The conversation so far, redacted, oldest first (user and agent turns)."""
        return self._dialog.transcript

    @property
    def cancelled_turns(self) -> list[Turn]:
        """User turns that were cancelled or failed before they completed (not taken)."""
        return self._dialog.cancelled_turns

    def add_extractor(self, extractor: TurnHook) -> None:
        """Run ``extractor`` on this call's user turns, as its triggers say (in the order
        added, each reading the redacted transcript)."""
        if not isinstance(extractor, TurnHook):
            raise TypeError(
                f"add_extractor takes an extractor (Extract(...).build() or an LLMExtractor), "
                f"got {extractor!r}"
            )
        hooks = self._dialog.hooks
        if extractor in hooks:
            raise SessionError(f"extractor {extractor.name!r} is already added to this call")
        hooks.append(extractor)

    def run_flow(self, flow: Runnable[Any], *, enforcement: Any = "enforce") -> Any:
        """Run ``flow`` (a ``Flow`` or a ``FlowStack``) in this call's session; it governs the
        turns (postures, grounds, tools) and closes with the session."""
        return self.session.run_flow(flow, enforcement=enforcement)

    # -- tools -------------------------------------------------------------------------------

    @property
    def tools(self) -> tuple[str, ...]:
        """The agent's tools, for the turn context."""
        return self._dialog.tools

    @property
    def redact(self) -> Callable[[str], str] | None:
        """What cleans each user turn before anything reads it (None: nothing)."""
        return self._dialog.redact

    def admit(self, tool: str, *, record: bool = True) -> ToolClaim:
        """May the model call ``tool`` now? Every flow must admit it (the first refusal wins,
        with its reason); in observe mode a breach is admitted, flagged ``violation`` and
        recorded by its flow (``record=False``: a question, not a call)."""
        return self._dialog.admit(tool, record=record)

    def claim(self, tool: str) -> AbstractAsyncContextManager[ToolClaim]:
        """Admit a call of ``tool`` atomically: ``async with call.claim("book") as claim:``;
        a once-only tool is held until the block ends, which reports the tool as successful
        unless ``claim.fail()`` was called (an exception reports nothing)."""
        return self._desk.claim(tool)

    async def call_tool(
        self, tool: str, fn: Callable[..., Any], arguments: Mapping[str, Any] | None = None
    ) -> ToolResult:
        """Run ``fn(**arguments)`` as a call of ``tool`` under :meth:`claim`; identical
        concurrent calls share one execution."""
        return await self._desk.call(tool, fn, arguments)

    async def tool_ok(self, tool: str) -> None:
        """Report that ``tool`` ran successfully: the flows advance and extractors with
        ``Trigger.after_tool()`` run."""
        await self._dialog.tool_ok(tool)

    # -- deliveries and interruptions --------------------------------------------------------

    @property
    def inbox(self) -> Inbox:
        """Background results waiting for the model."""
        return self._dialog.inbox

    @property
    def on_delivery(self) -> Deliver | None:
        """Receives ``interrupt`` background results the moment they land."""
        return self._dialog.on_delivery

    @on_delivery.setter
    def on_delivery(self, value: Deliver | None) -> None:
        if value is not None and not callable(value):
            raise TypeError(f"on_delivery must be a callable or None, got {value!r}")
        self._dialog.on_delivery = value

    def take_deliveries(self) -> list[BackgroundResult]:
        """The background results waiting for the model, oldest first; each is handed out
        once."""
        return self._dialog.inbox.take()

    def redeliver(self, *results: BackgroundResult) -> None:
        """Hand ``results`` to the model again (it never heard them: the bot was cut off)."""
        self._dialog.redeliver(results)

    async def wait_for_delivery(self, timeout: float | None = None) -> list[BackgroundResult]:
        """Wait until a background result waits for the model (the caller not talking) and
        return those waiting, left in place; raises ``WaitTimeoutError`` after ``timeout``."""
        return await self._dialog.wait_for_delivery(timeout)

    @property
    def interrupting(self) -> bool:
        """Whether the user is interrupting (between the two interruption calls)."""
        return self._dialog.interrupting

    def begin_interruption(self) -> None:
        """The user started talking over the agent: ``interrupt`` results landing now are held
        until :meth:`end_interruption`. Callable from any thread."""
        self._dialog.begin_interruption()

    def end_interruption(self, *, turn_follows: bool = True) -> None:
        """The user stopped talking: held results go into the next turn's context, or with
        ``turn_follows=False`` (noise, a cough) to ``on_delivery`` now."""
        self._dialog.end_interruption(turn_follows)

    # -- voice timing ------------------------------------------------------------------------

    def publish_timing(self) -> None:
        """Merge the voice timing of every active step and publish it at
        ``session:voice_timing`` (removed when no active step has any)."""
        self._dialog.publish_timing()

    # -- what the session and the flows ask of their conversation ----------------------------

    def open(self) -> None:
        """The session opened (results a previous process never handed over wait again)."""
        self._dialog.open()

    def govern(self, runner: Governor) -> None:
        """Let a running flow govern this call's turns (``session.run_flow`` does this)."""
        self._dialog.governors.append(runner)

    def inbox_delivery(self, origin: object) -> ToInbox:
        """A ``deliver`` callback sending a result to this call's inbox, tagged ``origin``."""
        return self._dialog.inbox_delivery(origin)

    def to_model(self, result: BackgroundResult, origin: object = None) -> Any:
        """Where a background result with no ``deliver`` of its own goes: the inbox, or
        ``on_delivery`` for an ``interrupt`` one while the caller is not talking."""
        return self._dialog.to_model(result, origin)

    def steps_changed(self, since: int | None, timed: bool) -> None:
        """A flow changed its active steps (any thread); see ``Trigger.on_step_change``."""
        self._dialog.steps_changed(since, timed)

    def __repr__(self) -> str:
        turns = sum(1 for t in self._dialog.transcript if t.speaker == "user")
        return f"<Call: {turns} user turns, {len(self._dialog.inbox.peek())} waiting>"
