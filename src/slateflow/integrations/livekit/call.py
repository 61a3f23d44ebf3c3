"""One call of a LiveKit ``AgentSession`` governed by slateflow: :class:`LiveKitCall`.

The call owns a :class:`~slateflow.Session` (opened when its agent enters, closed with the
LiveKit session) and the :class:`~slateflow.Conversation` over it; :attr:`LiveKitCall.agent` is
the :class:`~slateflow.integrations.livekit.SlateflowAgent` to start, which steers each reply
(:mod:`.agent`). :meth:`LiveKitCall.attach` watches the LiveKit session:

- ``user_state_changed``: the caller speaking is an interruption (results are held, nothing is
  said over them); stopping ends it, and the turn that follows carries what was held.
- each reply's speech handle: its words are what the agent said (the context it was steered by
  counts as handed over); a reply cut off before a word drops its context (its results are told
  again); ``interruptible=False`` on the active step holds the floor for the reply.
- a background result waiting for the model is told once the session is idle
  (``session.wait_for_idle()``) and the line stayed quiet for ``idle_grace`` seconds: a reply
  with no caller turn (``generate_reply``), steered like any other.
- the flow over and its goodbye spoken: the session shuts down (``end_call=False`` leaves it to
  you).

Tools come from the :class:`~slateflow.integrations.tools.Toolbox` as LiveKit raw function
tools: admitted by the flows atomically, run once, recorded; a refusal or failure raises
``ToolError(reason)``, which LiveKit hands the model as the tool's error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from livekit.agents import AgentSession, RunContext
from livekit.agents.llm import ToolError, function_tool

from ...conversation import VOICE_TIMING_KEY, Conversation, TurnContext, TurnHook
from ...flow import Flow, FlowRunner, FlowStack, StackRunner, VoiceTiming
from ...resolve import BackgroundResult, Clock, Scheduling, Session
from ...state import State
from ..tools import Toolbox
from .agent import SlateflowAgent

if TYPE_CHECKING:
    from livekit.agents.voice.speech_handle import SpeechHandle

__all__ = ["LiveKitCall"]

log = logging.getLogger("slateflow.integrations.livekit")

_FAILED = {"invalid", "error", "timeout", "failed", "refused"}


class LiveKitCall:
    """One call: a session, its conversation, the flow, and the agent LiveKit runs.

    ``flow`` (a ``Flow`` or ``FlowStack``) starts when the agent enters. ``toolbox`` holds the
    call's tools (the agent offers them as LiveKit function tools); ``extractors`` read the
    caller's words; ``state`` (default: a new one on ``clock``) may be a durable
    ``State.open(path)``. ``instructions`` are the agent's standing instructions. ``idle_grace``:
    seconds the line must stay quiet before a waiting result is told. ``agent_options`` go to
    the agent (``stt=``, ``tts=``, ...); other keywords to the
    :class:`~slateflow.Conversation`.
    """

    def __init__(
        self,
        flow: Flow | FlowStack | None,
        *,
        toolbox: Toolbox | None = None,
        extractors: Iterable[TurnHook] = (),
        state: State | None = None,
        clock: Clock | None = None,
        instructions: str = "",
        idle_grace: float = 0.4,
        end_call: bool = True,
        agent_options: dict[str, Any] | None = None,
        **conversation_options: Any,
    ) -> None:
        if toolbox is not None and not isinstance(toolbox, Toolbox):
            raise TypeError(f"toolbox must be a Toolbox, got {toolbox!r}")
        if not 0 <= idle_grace < float("inf"):
            raise ValueError(f"idle_grace must be a number of seconds >= 0, got {idle_grace!r}")
        self.flow = flow
        self.toolbox = toolbox
        self.idle_grace = idle_grace
        self.end_call = end_call
        self.state = state if state is not None else State(clock=clock)
        self.session = Session(self.state, clock=clock)
        conversation_options.setdefault("tools", toolbox.names if toolbox is not None else ())
        # Each reply's speech handle says whether its words were spoken: the call concludes
        # the contexts itself, even after the next one was built.
        conversation_options.setdefault("handover", "manual")
        conversation_options.setdefault("on_waiting", self._waiting)
        self.conversation = Conversation(self.session, **conversation_options)
        for extractor in extractors:
            self.conversation.add_extractor(extractor)
        tools = self.conversation.tools
        if flow is not None and tools:
            flow.compile(tools=tools)  # a misspelt tool name fails here, not mid-call
        self.runner: FlowRunner | StackRunner | None = None
        self.agent = SlateflowAgent(
            self, instructions=instructions, tools=self.livekit_tools(), **(agent_options or {})
        )
        """The agent to start: ``await session.start(call.agent, room=...)``."""
        self.livekit: AgentSession | None = None
        self._told: dict[str, TurnContext] = {}
        self._user_speaking = False
        self._telling: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._ended = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------------

    def attach(self, session: AgentSession) -> None:
        """Watch ``session`` (before ``session.start``): the caller's speech, and its close."""
        self.livekit = session
        session.on("user_state_changed", self._user_state)
        session.on("close", self._on_close)

    async def start(self) -> None:
        """Open the session and start the flow (the agent does, when it enters)."""
        if self._started:
            return
        self._started = True
        await self.session.start()
        if self.flow is not None:
            self.runner = self.conversation.run_flow(self.flow)

    @property
    def ended(self) -> bool:
        """Whether the call's session closed."""
        return self._closed

    async def wait_ended(self, timeout: float | None = None) -> None:
        """Wait until the call's session closed (the LiveKit session closed, or the call hung
        up after the goodbye); raises ``TimeoutError`` after ``timeout`` seconds."""
        await asyncio.wait_for(self._ended.wait(), timeout)

    async def close(self) -> None:
        """Close the session (the LiveKit session closed). Safe to call twice."""
        if not self._started or self._closed:
            return
        self._closed = True
        if self._telling is not None:
            self._telling.cancel()
        try:
            await self.session.aclose()
        finally:
            self._ended.set()

    def _on_close(self, event: Any) -> None:
        asyncio.get_running_loop().create_task(self.close())

    # -- turns and steering ----------------------------------------------------------------------

    async def turn(self, text: str, message_id: str) -> TurnContext:
        """Feed the caller's turn (once per message id) and keep what it tells the model."""
        told = await self.conversation.user_turn(text, message_id=message_id)
        self._told[message_id] = told
        if len(self._told) > 256:
            self._told.pop(next(iter(self._told)))
        return told

    def was_fed(self, message_id: str) -> bool:
        """Whether the caller's message ``message_id`` was fed as a turn."""
        return message_id in self._told

    def told_for(self, message_id: str) -> TurnContext:
        """What the model is told for the reply to message ``message_id``."""
        return self._told[message_id]

    def offered(self, told: TurnContext) -> set[str]:
        """The tools to offer the model now: the admitted ones, and any the conversation does
        not know (a LiveKit toolset of yours: the flows do not govern it)."""
        known = set(self.conversation.tools)
        allowed = set(told.tools)
        return allowed | {name for name in self._agent_tool_names() if name not in known}

    def _agent_tool_names(self) -> list[str]:
        names = []
        for tool in self.agent.tools:
            info = getattr(tool, "info", None)
            name = getattr(info, "name", None) or getattr(tool, "id", None)
            if isinstance(name, str):
                names.append(name)
        return names

    @staticmethod
    def speech_handle() -> SpeechHandle | None:
        """The speech handle of the reply being generated (None outside one)."""
        with contextlib.suppress(Exception):
            from livekit.agents.voice.agent_activity import _SpeechHandleContextVar

            return _SpeechHandleContextVar.get(None)
        return None

    def track(self, told: TurnContext, handle: SpeechHandle | None) -> None:
        """Conclude ``told`` when its reply's speech is done: spoken (or a tool called) counts
        as handed over; cut off before a word, it is dropped (its results are told again)."""
        if told.status != "pending":
            return
        if handle is None:
            told.handed_over()
            return

        def done(handle: SpeechHandle) -> None:
            if told.status != "pending":
                return
            words = " ".join(
                item.text_content or ""
                for item in handle.chat_items
                if getattr(item, "role", None) == "assistant"
            ).strip()
            acted = any(
                getattr(item, "type", None) == "function_call" for item in handle.chat_items
            )
            if words:
                self.conversation.agent_said(words, context=told)
            elif acted or not handle.interrupted:
                told.handed_over()
            else:
                told.dropped()
            self._after_reply()

        handle.add_done_callback(done)

    def pace(self, handle: SpeechHandle | None) -> None:
        """Apply the active steps' voice timing to the reply being generated."""
        timing = self.timing()
        if handle is not None and timing is not None and timing.interruptible is False:
            handle.allow_interruptions = False  # a read-back or a disclosure is said whole

    def timing(self) -> VoiceTiming | None:
        """The voice timing the conversation publishes now."""
        value: Any = self.state.get(VOICE_TIMING_KEY)
        return VoiceTiming.model_validate(value) if isinstance(value, dict) else None

    # -- the caller, the idle line and the end ---------------------------------------------------

    def _user_state(self, event: Any) -> None:
        speaking = event.new_state == "speaking"
        if speaking == self._user_speaking:
            return
        self._user_speaking = speaking
        if speaking:
            self.conversation.begin_interruption()
        else:
            self.conversation.end_interruption(turn_follows=True)

    def _waiting(self, result: BackgroundResult) -> None:
        """The conversation's ``on_waiting``: tell it once the session is idle and quiet."""
        if self._telling is None or self._telling.done():
            self._telling = asyncio.get_running_loop().create_task(self._tell_when_idle())

    async def _tell_when_idle(self) -> None:
        session = self.livekit
        while session is not None and not self._closed:
            with contextlib.suppress(Exception):
                await session.wait_for_idle()
            await self.session.clock.sleep(self.idle_grace)
            waiting = [
                r for r in self.conversation.inbox.peek() if r.scheduling is not Scheduling.SILENT
            ]
            if not waiting or self._closed:
                return
            if self._user_speaking or session.agent_state != "listening":
                continue  # something happened meanwhile: wait for the next quiet moment
            handle = session.generate_reply()  # no caller turn: steered between turns
            with contextlib.suppress(Exception):
                await handle
            return

    def _after_reply(self) -> None:
        if self.end_call and self.conversation.is_over and self.livekit is not None:
            self.livekit.shutdown()  # the goodbye was spoken: hang up

    # -- tools -----------------------------------------------------------------------------------

    def livekit_tools(self) -> list[Any]:
        """The toolbox's tools as LiveKit raw function tools (all of them: ``llm_node`` offers
        only the admitted ones, so the agent's tool list never changes mid-call and LiveKit's
        preemptive replies stay valid)."""
        if self.toolbox is None:
            return []
        made = []
        for tool in self.toolbox:
            spec = tool.spec()
            schema = {
                "name": spec.name,
                "description": spec.description,
                "parameters": dict(spec.parameters),
            }
            made.append(function_tool(self._handler(spec.name), raw_schema=schema))
        return made

    def _handler(self, name: str) -> Any:
        async def handler(raw_arguments: dict[str, Any], context: RunContext) -> Any:
            call = getattr(context, "function_call", None)
            assert self.toolbox is not None
            outcome = await self.toolbox.call(
                self.conversation,
                name,
                dict(raw_arguments or {}),
                call_id=getattr(call, "call_id", None),
            )
            if outcome.status in _FAILED:
                raise ToolError(outcome.content)  # the model hears why
            return outcome.content

        handler.__name__ = name
        return handler

    def __repr__(self) -> str:
        flow = "no flow" if self.flow is None else getattr(self.flow, "name", "a flow stack")
        return f"<LiveKitCall {flow}: {self.conversation!r}>"
