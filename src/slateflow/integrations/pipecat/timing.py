"""A step's voice timing, mapped onto pipecat's turn strategies.

- ``interruptible=False`` → :class:`FloorHold`, a user mute strategy: while the bot speaks
  from such a step (a read-back, a disclosure) the caller's speech does not cut it off.
- ``end_of_speech_ms`` → :class:`PacedSpeechTimeout`, pipecat's speech-timeout stop strategy
  whose pause follows the active steps (the base ``user_speech_timeout`` when none sets one).
- ``reprompt_after_ms`` and ``filler_after_ms`` are the call's own idle timers (see
  :mod:`slateflow.integrations.pipecat.activity`).

Both strategies read the timing the conversation publishes at ``session:voice_timing``::

    user_params = LLMUserAggregatorParams(
        user_mute_strategies=[FloorHold(call)],
        user_turn_strategies=UserTurnStrategies(stop=[PacedSpeechTimeout(call)]),
    )
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipecat.frames.frames import BotStartedSpeakingFrame, BotStoppedSpeakingFrame, Frame
from pipecat.turns.user_mute.base_user_mute_strategy import BaseUserMuteStrategy
from pipecat.turns.user_stop.speech_timeout_user_turn_stop_strategy import (
    SpeechTimeoutUserTurnStopStrategy,
)

if TYPE_CHECKING:
    from .call import PipecatCall

__all__ = ["FloorHold", "PacedSpeechTimeout"]


class FloorHold(BaseUserMuteStrategy):  # type: ignore[misc]
    """Mute the caller while the bot speaks from a step with ``interruptible=False``."""

    def __init__(self, call: PipecatCall) -> None:
        super().__init__()
        self.call = call
        self._bot_speaking = False

    async def process_frame(self, frame: Frame) -> bool:
        await super().process_frame(frame)
        if isinstance(frame, BotStartedSpeakingFrame):
            self._bot_speaking = True
        elif isinstance(frame, BotStoppedSpeakingFrame):
            self._bot_speaking = False
        if not (self._bot_speaking or self.call.activity.bot_speaking):
            return False
        timing = self.call.activity.timing()
        return timing is not None and timing.interruptible is False


class PacedSpeechTimeout(SpeechTimeoutUserTurnStopStrategy):  # type: ignore[misc]
    """pipecat's speech-timeout end of turn, with the pause the active steps ask for
    (``end_of_speech_ms``), else ``user_speech_timeout``."""

    def __init__(self, call: PipecatCall, *, user_speech_timeout: float = 0.6, **kwargs: Any):
        super().__init__(user_speech_timeout=user_speech_timeout, **kwargs)
        self.call = call
        self.base_timeout = user_speech_timeout

    @property
    def pause(self) -> float:
        """The pause that ends the caller's turn now, in seconds."""
        timing = self.call.activity.timing()
        if timing is not None and timing.end_of_speech_ms is not None:
            return timing.end_of_speech_ms / 1000
        return self.base_timeout

    async def handle_user_turn_started(self) -> None:
        # Set before the turn is timed: the step active when the caller starts decides.
        self._user_speech_timeout = self.pause
        await super().handle_user_turn_started()
