"""One call of a pipecat pipeline governed by slateflow: :class:`PipecatCall`.

The call owns a :class:`~slateflow.Session` (opened with the pipeline's ``StartFrame``, closed
with its ``EndFrame`` or ``CancelFrame``) and the :class:`~slateflow.Conversation` over it. Its
steering processor, before the LLM, feeds each whole user turn (the user aggregator's messages,
not STT segments) to ``conversation.user_turn`` and writes what the model is told now into the
``LLMContext``: a developer message per turn (``strategy="developer"``, the default), or the
system instruction replaced with every line that applies (``strategy="system"``); and the tools
it may call now (``advertise="admitted"``: only those the flows admit, as pipecat
``FunctionSchema``\\ s, so every provider's format works). Its tap, after the output, sees what
was spoken and when the line is quiet (:mod:`.activity`).

Tool calls go through the :class:`~slateflow.integrations.tools.Toolbox` (one catch-all
handler): admitted by the flows atomically, run once, recorded; a refusal or failure is the
tool's result in words, so the model hears the reason. pipecat then runs the model again with
the result: that context passes the tap on its way up, and is steered there (the flow may have
moved on). Background results of flow steps reach the model in a developer message when the
line is quiet (pipecat's async-tool protocol carries a result to a *tool call* id, and these
results answer no tool call); a tool named in ``async_tools`` runs as a pipecat async tool
instead, its result delivered through that protocol.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import Frame, LLMUpdateSettingsFrame
from pipecat.processors.aggregators.llm_context import NOT_GIVEN, LLMContext
from pipecat.services.settings import LLMSettings

from ...conversation import Conversation, TurnContext, TurnHook
from ...errors import UsageError
from ...flow import Flow, FlowRunner, FlowStack, StackRunner
from ...resolve import Clock, Session
from ...state import State
from ..tools import Toolbox
from .activity import Activity
from .processors import CallTap, Steering
from .replies import Replies

if TYPE_CHECKING:
    from pipecat.services.llm_service import FunctionCallParams, LLMService

__all__ = ["PipecatCall"]

log = logging.getLogger("slateflow.integrations.pipecat")

Strategy = Literal["developer", "system"]
_KEEP_FED = 512  # user messages remembered as fed (their ids must not be reused meanwhile)


class PipecatCall:
    """One call: a session, its conversation, the flow, and the processors a pipeline needs.

    ``flow`` (a ``Flow`` or ``FlowStack``) starts with the pipeline; ``context`` is the
    ``LLMContext`` the pipeline's aggregators share. ``toolbox`` holds the call's tools
    (:meth:`register_tools` hands them to the LLM service). ``extractors`` read the caller's
    words. ``state`` (default: a new one on ``clock``) may be a durable ``State.open(path)``.
    ``system`` is the agent's standing instruction, set as the LLM service's system instruction
    (with ``strategy="system"`` the flow's lines follow it there, replaced each turn).
    ``idle_grace``: seconds the line must be quiet before a waiting result is told;
    ``filler``: what is said while a tool runs past its step's ``filler_after_ms``.
    ``end_call=False`` leaves hanging up to you (``conversation.is_over``). Other keywords go
    to the :class:`~slateflow.Conversation`.
    """

    def __init__(
        self,
        flow: Flow | FlowStack | None,
        context: LLMContext,
        *,
        toolbox: Toolbox | None = None,
        extractors: Iterable[TurnHook] = (),
        state: State | None = None,
        clock: Clock | None = None,
        system: str | None = None,
        strategy: Strategy = "developer",
        advertise: Literal["admitted", "all"] = "admitted",
        async_tools: Iterable[str] = (),
        idle_grace: float = 0.4,
        filler: str = "One moment, please.",
        end_call: bool = True,
        **conversation_options: Any,
    ) -> None:
        if not isinstance(context, LLMContext):
            raise TypeError(f"PipecatCall needs the pipeline's LLMContext, got {context!r}")
        if strategy not in ("developer", "system"):
            raise UsageError(f"strategy must be 'developer' or 'system', got {strategy!r}")
        if advertise not in ("admitted", "all"):
            raise UsageError(f"advertise must be 'admitted' or 'all', got {advertise!r}")
        if toolbox is not None and not isinstance(toolbox, Toolbox):
            raise TypeError(f"toolbox must be a Toolbox, got {toolbox!r}")
        self.flow = flow
        self.context = context
        self.toolbox = toolbox
        self.system = system
        self.strategy: Strategy = strategy
        self.advertise = advertise
        self.async_tools = frozenset(async_tools)
        self.end_call = end_call
        self.state = state if state is not None else State(clock=clock)
        self.session = Session(self.state, clock=clock)
        self.activity = Activity(self, idle_grace=idle_grace, filler=filler)
        """Who is talking and what is in flight: when the line is quiet (see :mod:`.activity`)."""
        conversation_options.setdefault("tools", toolbox.names if toolbox is not None else ())
        conversation_options.setdefault("on_waiting", self.activity.waiting)
        # The tap confirms a context when its words were spoken (or a tool was called from
        # it) and drops it when an interruption cut it off before any, even after the next
        # turn's context was built (the tap hears later than the steering writes).
        conversation_options.setdefault("handover", "manual")
        self.conversation = Conversation(self.session, **conversation_options)
        for extractor in extractors:
            self.conversation.add_extractor(extractor)
        tools = self.conversation.tools
        if flow is not None and tools:
            flow.compile(tools=tools)  # now, where the mistake is made, not at the StartFrame
        self.runner: FlowRunner | StackRunner | None = None
        """The flow's runner, once the pipeline started."""
        self.steering = Steering(self)
        """The processor to put before the LLM service."""
        self.tracing_context: Any = None
        """pipecat's tracing context of the pipeline (set when it starts): with
        ``enable_tracing=True``, slateflow's spans nest under pipecat's turn span."""
        self.tap = CallTap(self)
        """The processor to put after the output transport (before the assistant aggregator)."""
        self.replies = Replies(self.conversation, self._forget)
        """Which context each reply was spoken from (see :mod:`.replies`)."""
        self._fed: deque[Mapping[str, Any]] = deque(maxlen=_KEEP_FED)
        self._fed_ids: set[int] = set()
        self._instruction: str | None = None  # the system instruction last sent
        self._started = False
        self._closed = False

    # -- the pipeline's life -------------------------------------------------------------------

    async def start(self) -> list[Frame]:
        """Open the session and start the flow (the steering processor calls it with the
        pipeline's ``StartFrame``); returns the frames to send the model (the standing system
        instruction). Called twice, it does nothing."""
        if self._started:
            return []
        self._started = True
        await self.session.start()
        if self.flow is not None:
            self.runner = self.conversation.run_flow(self.flow)
        if self.system is None:
            return []
        self._instruction = self.system
        return [self.instruction_frame(self.system)]

    @property
    def ended(self) -> bool:
        """Whether the pipeline ended (or was cancelled) and the session closed."""
        return self._closed

    async def close(self) -> None:
        """Close the session (the pipeline ended or was cancelled). Safe to call twice."""
        if not self._started or self._closed:
            return
        self._closed = True
        self.activity.close()
        await self.session.aclose()

    # -- tools -----------------------------------------------------------------------------------

    def register_tools(self, llm: LLMService[Any]) -> None:
        """Register the call's tools with ``llm``: one handler for every call the model makes
        (a tool the flows refuse, or one that does not exist, is answered in words too)."""
        if self.toolbox is None:
            raise UsageError("register_tools needs the call's tools: PipecatCall(..., toolbox=...)")
        llm.register_function(None, self._call_tool)
        for name in self.async_tools:
            if name not in self.toolbox:
                raise UsageError(
                    f"async_tools names {name!r}, which the toolbox does not hold "
                    f"({', '.join(self.toolbox.names)})"
                )
            llm.register_function(name, self._call_tool, cancel_on_interruption=False)

    async def _call_tool(self, params: FunctionCallParams) -> None:
        self.activity.tool_started(params.tool_call_id)
        try:
            assert self.toolbox is not None
            outcome = await self.toolbox.call(
                self.conversation,
                params.function_name,
                dict(params.arguments),
                call_id=params.tool_call_id,
            )
            await params.result_callback(outcome.content)
        finally:
            self.activity.tool_ended(params.tool_call_id)

    def tool_schemas(self, names: Iterable[str]) -> list[FunctionSchema]:
        """pipecat schemas of the toolbox's tools named in ``names`` (others are skipped)."""
        schemas: list[FunctionSchema] = []
        if self.toolbox is None:
            return schemas
        for name in names:
            if name not in self.toolbox:
                continue
            spec = self.toolbox[name].spec()
            parameters = dict(spec.parameters)
            properties = parameters.get("properties") or {}
            required = parameters.get("required") or []
            schemas.append(
                FunctionSchema(
                    name=spec.name,
                    description=spec.description,
                    properties=dict(properties) if isinstance(properties, Mapping) else {},
                    required=list(required) if isinstance(required, list) else [],
                )
            )
        return schemas

    # -- steering ----------------------------------------------------------------------------

    async def steer(self, context: LLMContext, *, speculation: bool = False) -> list[Frame]:
        """Feed the user turn this context carries (if any) and write what the model is told
        now into it; returns the frames to send the model first (a new system instruction).
        The steering processor calls it for every context on its way to the LLM, the tap for
        a context going back up after a tool. A speculative context (a reply started before
        the turn is final) is steered from :meth:`~slateflow.Conversation.preview`: nothing is
        fed or recorded until the turn is confirmed."""
        with _in_turn_span(self.tracing_context):
            return await self._steer(context, speculation)

    async def _steer(self, context: LLMContext, speculation: bool) -> list[Frame]:
        turn = self._new_user_turn(context)
        if speculation:
            text = turn[0] if turn is not None else ""
            return self.apply(context, self.conversation.preview(text), track=False)
        if turn is None:
            told = await self.conversation.context_between_turns()
        else:
            text, message_id, messages = turn
            told = await self.conversation.user_turn(text, message_id=message_id)
            for message in messages:  # taken: these messages are fed
                self._fed.append(message)
                self._fed_ids.add(id(message))
            if len(self._fed_ids) > 2 * len(self._fed):
                self._fed_ids = {id(m) for m in self._fed}
        return self.apply(context, told)

    def _new_user_turn(
        self, context: LLMContext
    ) -> tuple[str, str, list[Mapping[str, Any]]] | None:
        """The user messages not fed yet, as one turn: their text, an id and the messages.
        A turn cut off before it was taken is fed again with the words said after it."""
        fresh = [
            m
            for m in context.get_messages()
            if isinstance(m, Mapping) and m.get("role") == "user" and id(m) not in self._fed_ids
        ]
        texts = [text for m in fresh if (text := _text(m))]
        if not texts:
            for m in fresh:  # an empty user message (an image, silence): nothing to feed
                self._fed.append(m)
                self._fed_ids.add(id(m))
            return None
        return " ".join(texts), f"pipecat:{id(fresh[-1])}:{len(fresh)}", fresh

    def apply(self, context: LLMContext, told: TurnContext, *, track: bool = True) -> list[Frame]:
        """Write ``told`` into ``context`` (the lines as the strategy says, and the tools the
        model may call now); returns the frames to send the model first."""
        frames: list[Frame] = []
        message: dict[str, Any] | None = None
        if self.strategy == "developer":
            # Two contexts can be written before the model answers either (a tool's result
            # and the caller's next words): the model reads both, so a line is written once.
            carried = self.replies.carried() if track else set()
            lines = [line for line in told.lines if line not in carried]
            if lines:
                message = {"role": "developer", "content": "\n".join(lines)}
                context.add_message(message)
        else:
            instruction = "\n\n".join(p for p in (self.system, told.full_prompt) if p)
            if instruction != self._instruction:
                self._instruction = instruction
                frames.append(self.instruction_frame(instruction))
        names = told.tools if self.advertise == "admitted" else self._all_tools()
        schemas = self.tool_schemas(names)
        context.set_tools(ToolsSchema(standard_tools=schemas) if schemas else NOT_GIVEN)
        if track:
            self.replies.written(told, message)
        return frames

    def _forget(self, message: dict[str, Any]) -> None:
        """Take ``message`` (a dropped context's lines) out of the ``LLMContext``."""
        messages = self.context.get_messages()
        if any(m is message for m in messages):
            self.context.set_messages([m for m in messages if m is not message])

    def instruction_frame(self, instruction: str) -> LLMUpdateSettingsFrame:
        """The frame that makes ``instruction`` the LLM service's system instruction."""
        return LLMUpdateSettingsFrame(delta=LLMSettings(system_instruction=instruction))

    def _all_tools(self) -> tuple[str, ...]:
        return self.toolbox.names if self.toolbox is not None else ()

    async def tell_now(self) -> None:
        """Write what the model is told now into the context and run the model (a waiting
        result, a reprompt): the steering processor pushes the context to the LLM."""
        await self.steering.push_context(self.context)

    def __repr__(self) -> str:
        flow = "no flow" if self.flow is None else getattr(self.flow, "name", "a flow stack")
        return f"<PipecatCall {flow}: {self.conversation!r}>"


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        parts = [
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        ]
        return " ".join(p for p in parts if p).strip()
    return ""


@contextmanager
def _in_turn_span(tracing_context: Any) -> Iterator[None]:
    """Make pipecat's current turn span the OpenTelemetry parent while steering (pipecat
    passes its spans' parents explicitly, so nothing is current in a processor's task)."""
    turn = tracing_context.get_turn_context() if tracing_context is not None else None
    if turn is None:
        yield
        return
    from opentelemetry import context as otel_context

    token = otel_context.attach(turn)
    try:
        yield
    finally:
        otel_context.detach(token)
