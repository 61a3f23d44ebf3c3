"""What a running flow says now: one :class:`Brief` answers everything a conversation asks of
its flows when it builds a turn's context.

A conversation asks each flow that governs it for its brief once per context: the speaking
steps' postures, grounds and reprompt lines, the unmet requirements, the tools the flow knows
and why each refused one is refused, the merged voice timing, and a marker that records the
speaking steps as told once the context reaches the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .timing import DEFAULT_REPROMPT, VoiceTiming

__all__ = ["Brief", "TellMarker", "merge_timing"]

TellMarker = Callable[[int], None]
"""Records that the postures of the steps speaking when a context was built reached the model,
at user turn ``n``; a :class:`Brief` carries one, called when the context is handed over."""


@dataclass(frozen=True, slots=True)
class Brief:
    """What a running flow says now (``runner.brief(tools)``).

    ``postures``, ``grounds`` and ``reprompts`` are the speaking steps' lines for the model (the
    active steps, or once the flow is complete the terminal steps it ended on); ``unmet`` the
    required steps not done yet, as told to the model (each step's ``summary``, else its id
    in words). ``tools`` is every tool the flow knows, with the ones it was
    asked about; ``refused`` says why each of those it refuses now is refused (in observe mode
    nothing is refused). ``timing`` is the speaking steps' merged :class:`VoiceTiming`.
    ``told`` records the speaking steps as told at a user turn (None when no step speaks).
    ``closing`` is true when they are the call's closing words: handing them over ends the call
    (``flow:over``).
    """

    postures: tuple[str, ...] = ()
    grounds: tuple[str, ...] = ()
    reprompts: tuple[str, ...] = ()
    unmet: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    refused: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    timing: VoiceTiming | None = None
    told: TellMarker | None = field(default=None, compare=False)
    closing: bool = False

    @property
    def lines(self) -> tuple[str, ...]:
        """Postures, grounds and reprompts, in that order, blank ones left out."""
        return tuple(x for x in (*self.postures, *self.grounds, *self.reprompts) if x)


def merge_timing(timings: Iterable[VoiceTiming | None]) -> VoiceTiming | None:
    """The timings merged, the most cautious setting of each winning (None when none is set)."""
    merged: VoiceTiming | None = None
    for timing in timings:
        if timing is not None:
            merged = timing if merged is None else merged.merge(timing)
    return merged


def reprompt_text(timing: VoiceTiming | None) -> str:
    """What the model is told when a step with this timing reprompts."""
    return DEFAULT_REPROMPT if timing is None else timing.reprompt_text
