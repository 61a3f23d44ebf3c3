"""Turns: what the caller said, what is waiting for the model, and what to tell it now.

The Session records each user turn (redacted), runs the extractors attached to it, advances the
flows it runs, and returns a :class:`TurnContext`. The flow and conversation layers plug in
through the small protocols here, so this layer never imports them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .background import BackgroundResult, Scheduling

if TYPE_CHECKING:
    from .session import Session

__all__ = [
    "VOICE_TIMING_KEY",
    "Governor",
    "Inbox",
    "Turn",
    "TurnContext",
    "TurnHook",
    "delivery_line",
]

UNMET_PREFIX = "Before finishing, these still need to happen: "
VOICE_TIMING_KEY = "session:voice_timing"
"""Where the session publishes the merged voice timing of the active steps."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn: its ``number`` (from 1), the redacted ``text`` and the clock time ``at``."""

    number: int
    text: str
    at: float


@runtime_checkable
class TurnHook(Protocol):
    """An extractor as the session sees it (``session.add_extractor``)."""

    name: str

    async def _on_turn(self, session: Session, turn: Turn, /) -> None: ...
    async def _on_tool(self, session: Session, tool: str, /) -> None: ...
    async def _on_step_change(self, session: Session, /) -> None: ...


@runtime_checkable
class Governor(Protocol):
    """A running flow as the session sees it: it advances on turns and tool calls and says what
    the model should be told. ``FlowRunner`` and the runner of a ``FlowStack`` implement it."""

    def begin_turn(self) -> None: ...
    async def on_turn(self) -> None: ...
    def on_tool_ok(self, tool: str) -> None: ...
    def postures(self) -> list[str]: ...
    def grounds(self) -> list[str]: ...
    def reprompts(self) -> list[str]: ...
    def unmet_requirements(self) -> list[str]: ...
    def known_tools(self) -> list[str]: ...
    def refusal(self, tool: str) -> str | None: ...
    def voice_timing(self) -> Any: ...


def delivery_line(result: BackgroundResult) -> str:
    """How a waiting background result is put to the model: its formatted response as JSON."""
    payload = json.dumps(result.response, ensure_ascii=False, default=str, sort_keys=True)
    return f"Background result ({result.scheduling.value}) from {result.name}: {payload}"


@dataclass(frozen=True)
class TurnContext:
    """What the model should be told after a user turn.

    ``postures``, ``grounds``, ``reprompts`` (a step's repair policy says the caller is stuck)
    and ``unmet`` come from the active steps of the session's flows;
    ``deliveries`` are the background results waiting for the model (each handed over exactly
    once, oldest first, with its ``scheduling``; ``silent`` ones get no line); ``tools`` are the
    tools it may call now and ``refused`` why each other known tool is refused. ``lines`` is
    the instruction text for this turn, in that order, without any line that was already sent
    on the previous turn (a model told the same posture twice starts to repeat itself);
    ``prompt`` joins them.
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

    @property
    def prompt(self) -> str:
        """The new instruction lines, one per line (empty when nothing changed)."""
        return "\n".join(self.lines)

    def __str__(self) -> str:
        return self.prompt

    def to_dict(self) -> dict[str, Any]:
        """The context as JSON-ready data, for a voice loop in another process or a log;
        each delivery is its name, scheduling and formatted response."""
        return {
            "turn": {"number": self.turn.number, "text": self.turn.text, "at": self.turn.at},
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


class Inbox:
    """Background results waiting for the model; thread-safe, each taken exactly once.

    Each entry remembers who queued it (``origin``), so a flow runner can take only its own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[object, BackgroundResult]] = []

    def put(self, result: BackgroundResult, origin: object = None) -> None:
        """Queue ``result``."""
        with self._lock:
            self._items.append((origin, result))

    def take(
        self, origin: object = None, *, scheduling: Scheduling | None = None
    ) -> list[BackgroundResult]:
        """Remove and return the waiting results (of ``origin`` and ``scheduling`` if given),
        oldest first."""
        with self._lock:
            taken: list[BackgroundResult] = []
            kept: list[tuple[object, BackgroundResult]] = []
            for item in self._items:
                o, r = item
                if (origin is None or o is origin) and (
                    scheduling is None or r.scheduling is scheduling
                ):
                    taken.append(r)
                else:
                    kept.append(item)
            self._items = kept
        return taken

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
