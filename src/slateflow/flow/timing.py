"""Voice timing per step: how the conversation sounds while a step is active.

A flow decides what may happen; a :class:`VoiceTiming` decides the pacing. A conversation
merges the timing of every active step (the most cautious setting wins) and publishes it in the
State, where the voice loop reads it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DEFAULT_REPROMPT", "VoiceTiming"]

DEFAULT_REPROMPT = (
    "The user has not answered. Briefly repeat or rephrase your last question, and do not add "
    "anything new."
)
"""What the model is told on a reprompt when a timing sets no ``reprompt`` text."""


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


class VoiceTiming(BaseModel):
    """Voice pacing for one step; an unset field (None) leaves the voice loop's own default.

    - ``reprompt_after_ms``: ask again after this much silence from the caller (``reprompt``
      is what the model is told then, default :data:`DEFAULT_REPROMPT`).
    - ``filler_after_ms``: cue a filler ("one moment...") when a tool runs longer than this.
    - ``interruptible``: False holds the floor for the model (disclosures, read-backs).
    - ``end_of_speech_ms``: how long a pause ends the caller's turn.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    reprompt_after_ms: int | None = Field(default=None, ge=0)
    reprompt: str | None = None
    filler_after_ms: int | None = Field(default=None, ge=0)
    interruptible: bool | None = None
    end_of_speech_ms: int | None = Field(default=None, ge=0)

    def merge(self, other: VoiceTiming) -> VoiceTiming:
        """The timing of two steps active at once, taking the more cautious setting of each:
        the shorter reprompt and filler waits, the longer end-of-speech pause, no barge-in if
        either forbids it; the reprompt text comes from ``self`` when set."""
        if other.interruptible is False or self.interruptible is False:
            interruptible: bool | None = False
        else:
            interruptible = (
                self.interruptible if self.interruptible is not None else (other.interruptible)
            )
        return VoiceTiming(
            reprompt_after_ms=_least(self.reprompt_after_ms, other.reprompt_after_ms),
            reprompt=self.reprompt if self.reprompt is not None else other.reprompt,
            filler_after_ms=_least(self.filler_after_ms, other.filler_after_ms),
            interruptible=interruptible,
            end_of_speech_ms=_most(self.end_of_speech_ms, other.end_of_speech_ms),
        )

    @property
    def holds_floor(self) -> bool:
        """Whether the caller cannot barge in while the model speaks."""
        return self.interruptible is False

    @property
    def reprompt_text(self) -> str:
        """What to tell the model when reprompting."""
        return self.reprompt if self.reprompt is not None else DEFAULT_REPROMPT

    @property
    def is_empty(self) -> bool:
        """Whether nothing is set."""
        return self == VoiceTiming()
