"""Who is talking and what is in flight on a pipecat call, and what to do when the line is quiet.

The line is *quiet* when the caller is not speaking, the bot is not speaking, no reply is being
generated, no tool call is running and no turn is being steered. :class:`Activity` keeps that
account from the frames the call's processors see, and acts on it:

- a background result waiting for the model is told once the line has been quiet for
  ``idle_grace`` seconds (an ``interrupt`` result at once), without polling: the conversation's
  ``on_waiting`` and every change of activity re-check;
- a step's ``reprompt_after_ms`` asks again after that much silence since the bot stopped;
- a step's ``filler_after_ms`` says the filler once while a tool runs longer than that.

Timers run in the call's session, on its clock.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from pipecat.frames.frames import TTSSpeakFrame

from ...conversation import VOICE_TIMING_KEY
from ...flow import DEFAULT_REPROMPT, VoiceTiming
from ...resolve import BackgroundResult, Scheduling

if TYPE_CHECKING:
    from .call import PipecatCall

__all__ = ["Activity"]

log = logging.getLogger("slateflow.integrations.pipecat")


class _Timer:
    """One pending action after a delay on the session's clock; starting it again replaces it."""

    __slots__ = ("_call", "_scope")

    def __init__(self, call: PipecatCall) -> None:
        self._call = call
        self._scope: anyio.CancelScope | None = None

    @property
    def armed(self) -> bool:
        return self._scope is not None

    def start(self, delay: float, action: Callable[[], Awaitable[None]]) -> None:
        self.cancel()
        runtime = self._call.session.runtime
        if not runtime.open:
            return
        scope = self._scope = anyio.CancelScope()
        runtime.spawn(self._run, scope, delay, action)

    def cancel(self) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.cancel()

    async def _run(
        self, scope: anyio.CancelScope, delay: float, action: Callable[[], Awaitable[None]]
    ) -> None:
        with scope:
            await self._call.session.clock.sleep(delay)
            if self._scope is scope:
                self._scope = None
            try:
                await action()
            except Exception:
                log.exception("slateflow pipecat: a timed action failed")


class Activity:
    """The activity on one call's line (see the module docs)."""

    def __init__(self, call: PipecatCall, *, idle_grace: float, filler: str) -> None:
        if not 0 <= idle_grace < float("inf"):
            raise ValueError(f"idle_grace must be a number of seconds >= 0, got {idle_grace!r}")
        self.call = call
        self.idle_grace = idle_grace
        self.filler = filler
        self.user_speaking = False
        self.bot_speaking = False
        self.responding = False
        """Whether the model's reply is being generated (between its start and end frames)."""
        self.tools: set[str] = set()
        self.words: list[str] = []
        """What the bot said of the reply it is speaking, so far."""
        self._idle = _Timer(call)
        self._reprompt = _Timer(call)
        self._filler = _Timer(call)
        self._silence = _Timer(call)
        self._reprompted = False
        self._closed = False

    @property
    def quiet(self) -> bool:
        """Nobody talking, nothing being generated or run."""
        return not (self.user_speaking or self.bot_speaking or self.responding or self.tools)

    @property
    def pending_action(self) -> bool:
        """Whether something is about to happen on a quiet line: a result to tell (its grace
        running, or waiting for one), a reprompt or a filler due."""
        if self._idle.armed or self._filler.armed or self._reprompt.armed or self._silence.armed:
            return True
        return self.quiet and not self.call.replies.waiting and bool(self._audible())

    def _audible(self) -> list[BackgroundResult]:
        return [
            r for r in self.call.conversation.inbox.peek() if r.scheduling is not Scheduling.SILENT
        ]

    def timing(self) -> VoiceTiming | None:
        """The voice timing the call's active steps publish now."""
        value: Any = self.call.state.get(VOICE_TIMING_KEY)
        return VoiceTiming.model_validate(value) if isinstance(value, dict) else None

    # -- what the processors report ------------------------------------------------------------

    def user_started(self) -> None:
        self.user_speaking = True
        self._reprompted = False
        self._reprompt.cancel()
        self.call.conversation.begin_interruption()
        self.changed()

    def user_stopped(self) -> None:
        self.user_speaking = False
        self.call.conversation.end_interruption(turn_follows=True)
        self.changed()

    def user_muted(self) -> None:
        """The caller was muted (the bot holds the floor): what they say from now on is not
        heard, so their speech ends here and no turn follows it."""
        if self.user_speaking:
            self.user_speaking = False
            self.call.conversation.end_interruption(turn_follows=False)
            self.changed()

    def reply_started(self) -> None:
        self.responding = True
        self.words.clear()

    def inference_started(self) -> None:
        """A context is on its way to the model: nothing is told meanwhile (its reply will
        carry what waits, or the next quiet moment will)."""
        self._idle.cancel()
        self._reprompt.cancel()

    def reply_ended(self) -> str:
        """A reply ended (its words were played): what it said (taken)."""
        self.responding = False
        words = self.spoken()
        if not words and self.call.replies.waiting and not self._silence.armed:
            # A reply with no words and no tool call leaves its context pending: once the
            # line stays quiet for the grace, the model had it and chose to say nothing.
            self._silence.start(self.idle_grace, self._said_nothing)
        return words

    def bot_started(self) -> None:
        self.bot_speaking = True
        self._reprompt.cancel()
        self._silence.cancel()

    def said(self, text: str) -> None:
        self.words.append(text)

    def bot_stopped(self) -> None:
        """The bot stopped speaking: the caller's silence starts counting for a reprompt."""
        self.bot_speaking = False
        timing = self.timing()
        if timing is not None and timing.reprompt_after_ms is not None and not self._reprompted:
            self._reprompt.start(timing.reprompt_after_ms / 1000, self._ask_again)

    def spoken(self) -> str:
        """The words of the current reply said so far (taken)."""
        # TTS text comes in pieces: joined with the spaces they carry, or one between
        # sentences when they carry none.
        spaced = all(not w or w[:1].isspace() for w in self.words[1:])
        words = ("" if spaced else " ").join(self.words).strip()
        self.words.clear()
        return words

    def interrupted(self) -> str:
        """An interruption: the reply in flight is cancelled; what was said of it (taken)."""
        self.responding = False
        self.bot_speaking = False
        self._idle.cancel()
        return self.spoken()

    def tool_started(self, call_id: str) -> None:
        self.tools.add(call_id)
        self._silence.cancel()
        timing = self.timing()
        if timing is not None and timing.filler_after_ms is not None and not self._filler.armed:
            self._filler.start(timing.filler_after_ms / 1000, self._fill)

    def tool_ended(self, call_id: str) -> None:
        self.tools.discard(call_id)
        if not self.tools:
            self._filler.cancel()
        self.changed()

    def waiting(self, result: BackgroundResult) -> None:
        """The conversation's ``on_waiting``: a result started waiting for the model."""
        self.changed()

    def close(self) -> None:
        self._closed = True
        for timer in (self._idle, self._reprompt, self._filler, self._silence):
            timer.cancel()

    # -- acting on it ------------------------------------------------------------------------

    def changed(self) -> None:
        """Activity changed: a waiting result may be told after the grace (at once when
        urgent)."""
        if self._closed or not self.quiet or self.call.replies.waiting:
            return  # busy, or the model has not answered its last context yet
        waiting = self._audible()
        if not waiting:
            return
        urgent = any(r.scheduling is Scheduling.INTERRUPT for r in waiting)
        self._idle.start(0.0 if urgent else self.idle_grace, self._tell_waiting)

    async def _tell_waiting(self) -> None:
        if self.quiet and not self.call.replies.waiting and not self._closed:
            await self.call.tell_now()

    async def _said_nothing(self) -> None:
        if self.quiet and not self.words:
            self.call.replies.acted()
            self.changed()

    async def _ask_again(self) -> None:
        if not self.quiet or self._closed or self._reprompted:
            return
        self._reprompted = True  # once per silence: the caller's next words reset it
        timing = self.timing()
        line = (timing.reprompt if timing is not None else None) or DEFAULT_REPROMPT
        self.call.context.add_message({"role": "developer", "content": line})
        await self.call.tell_now()

    async def _fill(self) -> None:
        if self.tools and not self._closed:
            await self.call.steering.push_frame(TTSSpeakFrame(self.filler))
