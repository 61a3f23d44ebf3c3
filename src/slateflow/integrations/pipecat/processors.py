"""The two frame processors of a :class:`~slateflow.integrations.pipecat.PipecatCall`.

:class:`Steering` sits between the user aggregator and the LLM service: it opens the call with
the pipeline's ``StartFrame``, maps the caller's speech to the conversation's interruptions, and
steers every context on its way to the model (feeding the user turn it carries, writing what the
model is told now and the tools it may call). :class:`CallTap` sits after the output transport,
before the assistant aggregator: it sees what the bot actually said (and where it was cut off),
replies and tool calls in flight, a context going back up to the model after a tool (which it
steers), and the end of the pipeline; and it ends the call once the flow is over and the goodbye
was spoken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    CancelFrame,
    EndFrame,
    EndWorkerFrame,
    Frame,
    FunctionCallInProgressFrame,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    StartFrame,
    TTSTextFrame,
    UserMuteStartedFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import (
    FrameDirection,
    FrameProcessor,
    FrameProcessorSetup,
)

if TYPE_CHECKING:
    from .call import PipecatCall

__all__ = ["CallTap", "Steering"]

DOWN = FrameDirection.DOWNSTREAM
UP = FrameDirection.UPSTREAM


class Steering(FrameProcessor):  # type: ignore[misc]  # pipecat is untyped for mypy here
    """The processor before the LLM service (see the module docs)."""

    def __init__(self, call: PipecatCall) -> None:
        super().__init__(name="slateflow-steering")
        self.call = call

    async def setup(self, setup: FrameProcessorSetup) -> None:
        """pipecat's set-up; keeps the pipeline's tracing context (with
        ``enable_tracing=True``), so slateflow's spans nest under pipecat's turn span."""
        await super().setup(setup)
        self.call.tracing_context = getattr(setup, "tracing_context", None)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        call = self.call
        if isinstance(frame, StartFrame):
            await self.push_frame(frame, direction)
            for first in await call.start():
                await self.push_frame(first, DOWN)
            return
        if isinstance(frame, LLMContextFrame) and direction is DOWN:
            if not frame.speculation:
                call.activity.inference_started()
            for first in await call.steer(frame.context, speculation=frame.speculation):
                await self.push_frame(first, DOWN)
        elif isinstance(frame, InterruptionFrame):
            call.replies.interruption_steered()
        elif isinstance(frame, UserStartedSpeakingFrame):
            call.activity.user_started()
        elif isinstance(frame, UserStoppedSpeakingFrame):
            call.activity.user_stopped()
        elif isinstance(frame, UserMuteStartedFrame):
            call.activity.user_muted()
        await self.push_frame(frame, direction)

    async def push_context(self, context: LLMContext) -> None:
        """Steer ``context`` (between turns: no user words) and send it to the model."""
        self.call.activity.inference_started()
        for first in await self.call.steer(context):
            await self.push_frame(first, DOWN)
        await self.push_frame(LLMContextFrame(context=context), DOWN)


class CallTap(FrameProcessor):  # type: ignore[misc]
    """The processor after the output transport (see the module docs)."""

    def __init__(self, call: PipecatCall) -> None:
        super().__init__(name="slateflow-tap")
        self.call = call

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        call = self.call
        activity = call.activity
        end = False
        if isinstance(frame, LLMContextFrame) and direction is UP:
            # The model runs again after a tool: the flow may have moved on.
            activity.inference_started()
            for first in await call.steer(frame.context):
                await self.push_frame(first, UP)  # ahead of the context, to the LLM
        elif direction is UP:
            pass  # the output transport's upstream copies: the downstream ones count
        elif isinstance(frame, TTSTextFrame):
            activity.said(frame.text)
        elif isinstance(frame, BotStartedSpeakingFrame):
            activity.bot_started()
        elif isinstance(frame, BotStoppedSpeakingFrame):
            activity.bot_stopped()
            activity.changed()
            end = call.end_call and call.conversation.is_over
        elif isinstance(frame, LLMFullResponseStartFrame):
            activity.reply_started()
        elif isinstance(frame, LLMFullResponseEndFrame):
            # The output passes a reply's end on once its words were played: each reply
            # answers one context, even when two are spoken with no pause between them.
            words = activity.reply_ended()
            if words:
                call.replies.spoke(words)
            activity.changed()
            end = call.end_call and call.conversation.is_over and not activity.bot_speaking
        elif isinstance(frame, FunctionCallInProgressFrame):
            call.replies.acted()
        elif isinstance(frame, InterruptionFrame):
            # What the caller heard before cutting in counts; the rest never reached them.
            call.replies.interruption_tapped(activity.interrupted())
            activity.changed()
        await self.push_frame(frame, direction)
        if isinstance(frame, EndFrame | CancelFrame):
            await call.close()
        elif end:
            # The flow is over and its goodbye was spoken: hang up, flushing what is queued.
            await self.push_frame(EndWorkerFrame(reason="the call is over"), DOWN)
