"""Turns: what the caller said, what is waiting for the model, and what to tell it now.

The Session records each user turn (redacted), runs the extractors attached to it, advances the
flows it runs, and returns a :class:`TurnContext`, handed to the model in two phases (built,
then confirmed or dropped). The flow and conversation layers plug in through the small
protocols here, so this layer never imports them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

from .background import BackgroundResult, Scheduling

if TYPE_CHECKING:
    from ..state import State
    from .inbox import Inbox, ToInbox
    from .session import Session

__all__ = [
    "DEFAULT_MAX_TRANSCRIPT",
    "VOICE_TIMING_KEY",
    "Admitted",
    "Closable",
    "Conversation",
    "Governor",
    "Handover",
    "HandoverMode",
    "Runnable",
    "TellMarker",
    "Turn",
    "TurnContext",
    "TurnHook",
    "check_options",
    "delivery_line",
]

UNMET_PREFIX = "Before finishing, these still need to happen: "
VOICE_TIMING_KEY = "session:voice_timing"
"""Where the session publishes the merged voice timing of the active steps."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One line of the conversation: its ``number`` (the user turn it belongs to, from 1), the
    redacted ``text``, the clock time ``at``, and who spoke: ``speaker`` is ``"user"`` (a user
    turn) or ``"agent"`` (what the agent actually said, reported with ``agent_said``)."""

    number: int
    text: str
    at: float
    speaker: Literal["user", "agent"] = "user"


HandoverMode = Literal["auto", "explicit"]
"""What building a turn context does to the last one not confirmed: ``"auto"`` counts it as
handed to the model, ``"explicit"`` as dropped."""
DEFAULT_MAX_TRANSCRIPT = 10_000
"""Turns a call keeps in ``transcript`` (about 2 MB of typical turns)."""


def check_options(
    redact: object,
    on_delivery: object,
    on_waiting: object,
    handover: object,
    max_transcript: object,
    max_waiting: object,
) -> None:
    """Refuse bad conversation options (a session checks them at once, a Call again)."""
    if redact is not None and not callable(redact):
        raise TypeError(f"redact must be a callable taking the text, or None, got {redact!r}")
    for name, fn in (("on_delivery", on_delivery), ("on_waiting", on_waiting)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a callable or None, got {fn!r}")
    if handover not in ("auto", "explicit"):
        raise ValueError(f"handover must be 'auto' or 'explicit', got {handover!r}")
    for name, limit in (("max_transcript", max_transcript), ("max_waiting", max_waiting)):
        if type(limit) is not int or limit < 1:
            raise ValueError(f"{name} must be a positive int, got {limit!r}")


class Conversation(Protocol):
    """A session's conversation as the layers below it see it: a
    :class:`slateflow.conversation.Call` (which attaches itself with ``session.attach``).

    The session opens it, lets flows govern it and sends background results to its inbox;
    flows tell it when their active steps change; extractors read its transcript.
    """

    session: Session

    @property
    def state(self) -> State: ...
    @property
    def transcript(self) -> list[Turn]: ...
    @property
    def inbox(self) -> Inbox: ...
    @property
    def tools(self) -> tuple[str, ...]: ...
    def open(self) -> None: ...
    def govern(self, runner: Governor) -> None: ...
    def inbox_delivery(self, origin: object) -> ToInbox: ...
    def to_model(self, result: BackgroundResult, origin: object) -> Any: ...
    def steps_changed(self, since: int | None, timed: bool) -> None: ...


@runtime_checkable
class TurnHook(Protocol):
    """An extractor as the call sees it (``call.add_extractor``).

    ``_on_step_change(call, since)`` runs when a flow enters a step whose posture was handed to
    the model after user turn ``since``: it may re-read only the turns said after that.
    """

    name: str

    async def _on_turn(self, call: Conversation, turn: Turn, /) -> None: ...
    async def _on_tool(self, call: Conversation, tool: str, /) -> None: ...
    async def _on_step_change(self, call: Conversation, since: int, /) -> None: ...


TellMarker = Callable[[int], None]
"""Records that the postures of the steps speaking when a context was built reached the model,
at user turn ``n``; returned by ``Governor.told_marker`` and called when the context is handed
over."""


class Admitted(Protocol):
    """A governor's answer to ``admit(tool)`` (the flow layer's ``Admission``)."""

    @property
    def allowed(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    @property
    def violation(self) -> bool: ...
    @property
    def once(self) -> bool: ...


@runtime_checkable
class Governor(Protocol):
    """A running flow as the session sees it: it advances on turns and tool calls and says what
    the model should be told. ``FlowRunner`` and the runner of a ``FlowStack`` implement it.

    ``abort_turn`` undoes ``begin_turn`` for a turn that was cancelled or failed before the flow
    counted it; ``told_marker`` captures the steps speaking now, to record them as told when
    the context carrying their postures is handed to the model.

    ``admit(tool, *, record=True)`` is the one way to ask whether a tool may run: an
    :class:`Admitted` with the reason, recording a violation in observe mode unless
    ``record=False`` (a question, not a call), and ``once`` when the tool may succeed only once
    (``once``, ``commit``), so concurrent calls of it are held one at a time.
    """

    def begin_turn(self) -> None: ...
    def abort_turn(self) -> None: ...
    async def on_turn(self) -> None: ...
    def on_tool_ok(self, tool: str) -> None: ...
    def postures(self) -> list[str]: ...
    def grounds(self) -> list[str]: ...
    def reprompts(self) -> list[str]: ...
    def unmet_requirements(self) -> list[str]: ...
    def known_tools(self) -> list[str]: ...
    def voice_timing(self) -> Any: ...
    def told_marker(self) -> TellMarker | None: ...
    def admit(self, tool: str, *, record: bool = True) -> Admitted: ...


class Closable(Protocol):
    """What a session closes as it ends (a running flow)."""

    def close(self) -> None: ...


R_co = TypeVar("R_co", bound=Closable, covariant=True)


class Runnable(Protocol[R_co]):
    """Something ``session.run_flow`` can start (a :class:`~slateflow.Flow`): the flow layer
    sits above the session, so the session only knows this method."""

    def _run_in(self, session: Session, /, *, enforcement: Any) -> R_co: ...


def delivery_line(result: BackgroundResult) -> str:
    """How a waiting background result is put to the model: its formatted response as JSON."""
    payload = json.dumps(result.response, ensure_ascii=False, default=str, sort_keys=True)
    return f"Background result ({result.scheduling.value}) from {result.name}: {payload}"


class Handover:
    """Where a built :class:`TurnContext` stands between the session and the model.

    A context is ``"pending"`` when built: its deliveries have left the inbox, but nothing
    counts as said yet. ``confirm()`` (the loop handed it to the model) makes its deliveries
    delivered, its lines said and its steps' postures told; ``drop()`` (an interruption dropped
    it) puts its deliveries back in the inbox for the next context. Made by the session.
    """

    __slots__ = ("_settle", "deliveries", "every", "markers", "status")

    def __init__(
        self,
        every: tuple[str, ...],
        deliveries: tuple[BackgroundResult, ...],
        markers: tuple[TellMarker, ...],
        settle: Callable[[Handover, bool], None],
    ) -> None:
        self.every = every
        self.deliveries = deliveries
        self.markers = markers
        self.status: Literal["pending", "handed_over", "dropped"] = "pending"
        self._settle = settle

    def confirm(self) -> None:
        """The context reached the model."""
        self._settle(self, True)

    def drop(self) -> None:
        """The context never reached the model."""
        self._settle(self, False)


@dataclass(frozen=True)
class TurnContext:
    """What the model should be told after a user turn.

    ``postures``, ``grounds``, ``reprompts`` (a step's repair policy says the caller is stuck)
    and ``unmet`` come from the active steps of the session's flows;
    ``deliveries`` are the background results waiting for the model (each handed over exactly
    once, oldest first, with its ``scheduling``; ``silent`` ones get no line); ``tools`` are the
    tools it may call now and ``refused`` why each other known tool is refused.

    ``all_lines`` is every instruction line that applies now and ``full_prompt`` joins them: a
    loop that replaces its system prompt each turn uses it. ``lines`` leaves out what was
    already handed to the model before and ``prompt`` joins those: a loop that appends to one
    running conversation uses it (a model told the same posture twice starts to repeat itself).

    The hand-over has two phases. The context is built ``pending``; :meth:`handed_over` says
    the model got it (its deliveries count as delivered, its lines as said, its steps'
    postures as told) and :meth:`dropped` says it did not (an interruption dropped it: its
    deliveries come back in the next context). A simple loop calls neither: building the next
    context confirms this one (unless the session was made with ``handover="explicit"``).
    """

    turn: Turn
    postures: tuple[str, ...] = ()
    grounds: tuple[str, ...] = ()
    reprompts: tuple[str, ...] = ()
    unmet: tuple[str, ...] = ()
    deliveries: tuple[BackgroundResult, ...] = ()
    tools: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)
    voice_timing: dict[str, Any] | None = None
    all_lines: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()
    handover: Handover | None = field(default=None, compare=False, repr=False)

    @property
    def prompt(self) -> str:
        """The new instruction lines, one per line (empty when nothing changed)."""
        return "\n".join(self.lines)

    @property
    def full_prompt(self) -> str:
        """Every instruction line that applies now, one per line."""
        return "\n".join(self.all_lines)

    @property
    def status(self) -> Literal["pending", "handed_over", "dropped"]:
        """``"pending"`` until handed over or dropped (a context built with no session is
        ``"handed_over"``)."""
        return "handed_over" if self.handover is None else self.handover.status

    def handed_over(self) -> None:
        """Say that the model got this context. Idempotent; raises
        :class:`~slateflow.errors.SessionError` if it was already dropped."""
        if self.handover is not None:
            self.handover.confirm()

    def dropped(self) -> None:
        """Say that the model never got this context: its deliveries go back to the inbox (first,
        in order) and its lines and postures do not count as said. Idempotent; raises
        :class:`~slateflow.errors.SessionError` if it was already handed over."""
        if self.handover is not None:
            self.handover.drop()

    def __str__(self) -> str:
        return self.prompt

    def to_dict(self) -> dict[str, Any]:
        """The context as JSON-ready data, for a voice loop in another process or a log;
        each delivery is its name, scheduling and formatted response."""
        return {
            "turn": {
                "number": self.turn.number,
                "text": self.turn.text,
                "at": self.turn.at,
                "speaker": self.turn.speaker,
            },
            "postures": list(self.postures),
            "grounds": list(self.grounds),
            "reprompts": list(self.reprompts),
            "unmet": list(self.unmet),
            "deliveries": [
                {"name": d.name, "scheduling": d.scheduling.value, "response": d.response}
                for d in self.deliveries
            ],
            "tools": list(self.tools),
            "refused": dict(self.refused),
            "voice_timing": self.voice_timing,
            "lines": list(self.lines),
            "prompt": self.prompt,
            "all_lines": list(self.all_lines),
            "full_prompt": self.full_prompt,
            "status": self.status,
        }


def context_lines(
    postures: Iterable[str],
    grounds: Iterable[str],
    reprompts: Iterable[str],
    unmet: Iterable[str],
    deliveries: Iterable[BackgroundResult],
    tools: Iterable[str],
) -> list[str]:
    """Every instruction line for a turn, before repeats are dropped."""
    lines = [p for p in postures if p]
    lines += [g for g in grounds if g]
    lines += [r for r in reprompts if r]
    unmet = list(unmet)
    if unmet:
        lines.append(UNMET_PREFIX + ", ".join(unmet) + ".")
    # A silent result is handed over with the others, but the model is not told about it.
    lines += [delivery_line(d) for d in deliveries if d.scheduling is not Scheduling.SILENT]
    tools = list(tools)
    lines.append("Tools you may call now: " + (", ".join(tools) if tools else "none") + ".")
    return list(dict.fromkeys(lines))
