"""Steps: the nodes of a flow, the edges between them, and what a step starts when entered."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import FlowDefinitionError, TemplateError
from ..resolve.background import Deliver, Scheduling
from ..resolve.resolver import Resolver
from ..resolve.run import Mode
from ..state.keys import unprintable
from .ground import Ground
from .guard_base import Guard
from .repair import RepairPolicy
from .timing import VoiceTiming

__all__ = ["ANY_TOOL", "Edge", "Join", "OnEnter", "Step", "edge", "run"]

Join = Literal["all", "any"]
_MODES: tuple[Mode, ...] = ("call", "dispatch", "background")


@dataclass(frozen=True, slots=True)
class Edge:
    """A dependency on step ``step``; with ``when``, a conditional branch.

    A branch is latched once taken: after its target step has been entered, ``when`` turning
    false again does not make the step vanish (a "retrying" step stays while the retry runs).
    With ``live=True`` the step is active only while ``when`` holds. A reset of either step
    re-opens the branch.
    """

    step: str
    when: Guard | None = None
    live: bool = False

    def __post_init__(self) -> None:
        if type(self.step) is not str or not self.step.strip():
            raise FlowDefinitionError(f"edge(step) needs a step id, got {self.step!r}")
        if self.when is not None and not isinstance(self.when, Guard):
            raise FlowDefinitionError(
                f"edge({self.step!r}, when=...) takes a guard, got {self.when!r}"
            )
        if type(self.live) is not bool:
            raise FlowDefinitionError(f"edge({self.step!r}): live must be True or False")
        if self.live and self.when is None:
            raise FlowDefinitionError(
                f"edge({self.step!r}, live=True) needs a when= guard: only a condition can be live"
            )


def edge(step: str, when: Guard | None = None, *, live: bool = False) -> Edge:
    """An ``after`` entry: follow on from ``step`` once it is done and ``when`` holds.

    ``Step("confirm", after=[edge("check", when=eq("availability:result.open", True))])`` takes
    the branch only when the slot is open; a sibling step takes the other branch. The branch is
    latched once its step is entered (``when`` turning false later leaves it active);
    ``live=True`` keeps it active only while ``when`` holds.
    """
    return Edge(step, when, live)


@dataclass(frozen=True, slots=True)
class OnEnter:
    """Run ``resolver`` when a step is entered: built by :func:`run`."""

    resolver: Resolver
    mode: Mode = "dispatch"
    scheduling: Scheduling = Scheduling.WHEN_IDLE
    deliver: Deliver | None = None


def run(
    resolver: Resolver,
    mode: Mode = "dispatch",
    *,
    scheduling: Scheduling | str = Scheduling.WHEN_IDLE,
    deliver: Deliver | None = None,
) -> OnEnter:
    """An ``on_enter`` action: start ``resolver`` in the runner's session each time the step
    is entered, in ``mode`` (the modes of :class:`~slateflow.resolve.Session`).

    - ``"dispatch"``: fire and forget; guards see ``<name>:result`` when it lands.
    - ``"background"``: the same, and the outcome is delivered for the model with the
      ``scheduling`` hint: to ``deliver`` if given, else to the runner's own ``deliver`` (a
      conversation's, when it runs the flow: the result waits in its inbox for the next
      context); with neither, the outcome is only in the State.
    - ``"call"``: run at once in the runner's own task, one after another; ``await
      runner.on_turn()`` waits for these runs, so the next turn sees their results.
    """
    if not isinstance(resolver, Resolver):
        raise FlowDefinitionError(f"run() takes a Resolver, got {resolver!r}")
    if mode not in _MODES:
        raise FlowDefinitionError(
            f"run({resolver.name!r}, mode={mode!r}): mode must be one of {list(_MODES)}"
        )
    try:
        hint = Scheduling(scheduling)
    except ValueError:
        raise FlowDefinitionError(
            f"run({resolver.name!r}): scheduling must be one of "
            f"{[s.value for s in Scheduling]}, got {scheduling!r}"
        ) from None
    if deliver is not None and not callable(deliver):
        raise FlowDefinitionError(f"run({resolver.name!r}): deliver must be callable")
    return OnEnter(resolver, mode, hint, deliver)


ANY_TOOL = "*"
"""``Step(allow="*")``: the step admits any tool (its ``deny`` and the constraints still bind)."""


def _tools(value: Iterable[str] | None, step: str, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    if ANY_TOOL in items:
        if what != "allow" or len(items) > 1:
            raise FlowDefinitionError(
                f"step {step!r}: '*' (any tool) stands alone, and only in allow; got {what}="
                f"{items!r}"
            )
        return (ANY_TOOL,)
    for tool in items:
        if type(tool) is not str or not tool:
            raise FlowDefinitionError(f"step {step!r}: {what} holds tool names, got {tool!r}")
        if why := unprintable(tool):
            raise FlowDefinitionError(
                f"step {step!r}: tool name {tool!r} in {what} would print like another: {why}"
            )
    return tuple(dict.fromkeys(items))


class Step:
    """One step of a flow: when it may start, when it is done, and what holds while it is active.

    - ``after``: step ids or :func:`edge` entries; ``join="all"`` (default) needs every one,
      ``join="any"`` one of them. A step with no ``after`` starts with the flow.
    - ``gate``: a further guard that must hold for the step to be active.
    - ``done``: the guard that completes it (required unless ``terminal``); once done, a step
      stays done until a ``reset`` constraint re-opens it.
    - ``terminal``: done as soon as it is reachable (an ending such as "goodbye").
    - ``ends``: entering it ends the flow (a hand-off to a person, say): every other step stops
      being active and none starts again; this step's posture, ground and tools apply until it
      is done, and then the flow is complete (whatever ``require`` asks). Usually reachable
      from anywhere (no ``after``) behind a ``gate``; the other steps need no condition of
      their own to give way to it.
    - ``posture``: the instruction for the model while active; ``ground``: a fact line rendered
      from the State (see :class:`Ground`).
    - ``allow`` / ``deny``: the tools the model may / may not call while it is active. A step
      without ``allow`` admits no tool but the flow's ``ambient`` ones (a hand-off tool is
      not offered from the first turn); ``allow="*"`` admits any tool, as an explicit choice.
    - ``on_enter``: :func:`run` a resolver each time the step is entered.
    - ``repair``: a :class:`RepairPolicy` (reprompt, then escalate, when the caller is stuck).
    - ``timing``: the :class:`VoiceTiming` that applies while the step is active.
    - ``summary``: what the step achieves, in words for the model ("book the new
      appointment"): a required step not done yet is named by it in the "Before finishing"
      line (without one, by its id in words: ``book_slot`` as "book slot").

    Malformed arguments raise :class:`FlowDefinitionError` naming the step; problems between
    steps (unknown ids, cycles) are reported by ``Flow.build()``.
    """

    __slots__ = (
        "after",
        "allow",
        "deny",
        "done",
        "ends",
        "gate",
        "ground",
        "id",
        "join",
        "on_enter",
        "posture",
        "repair",
        "summary",
        "terminal",
        "timing",
    )

    def __init__(
        self,
        id: str,
        *,
        after: Iterable[str | Edge] | str | Edge = (),
        join: Join = "all",
        gate: Guard | None = None,
        done: Guard | None = None,
        posture: str | None = None,
        ground: str | Ground | None = None,
        allow: Iterable[str] | None = None,
        deny: Iterable[str] | None = None,
        terminal: bool = False,
        ends: bool = False,
        on_enter: OnEnter | None = None,
        repair: RepairPolicy | None = None,
        timing: VoiceTiming | None = None,
        summary: str | None = None,
    ) -> None:
        if type(id) is not str or not id.strip():
            raise FlowDefinitionError(f"a step id is a non-empty string, got {id!r}")
        if why := unprintable(id):
            raise FlowDefinitionError(f"step id {id!r} would print like another step's: {why}")
        self.id = id
        entries = [after] if isinstance(after, str | Edge) else list(after)
        edges: list[Edge] = []
        for entry in entries:
            if isinstance(entry, str):
                edges.append(Edge(entry))
            elif isinstance(entry, Edge):
                edges.append(entry)
            else:
                raise FlowDefinitionError(
                    f"step {id!r}: after holds step ids or edge(...), got {entry!r}"
                )
        self.after: tuple[Edge, ...] = tuple(edges)
        if join not in ("all", "any"):
            raise FlowDefinitionError(f"step {id!r}: join must be 'all' or 'any', got {join!r}")
        self.join: Join = join
        for name, guard in (("gate", gate), ("done", done)):
            if guard is not None and not isinstance(guard, Guard):
                raise FlowDefinitionError(f"step {id!r}: {name} must be a guard, got {guard!r}")
        self.gate = gate
        self.done = done
        if posture is not None and type(posture) is not str:
            raise FlowDefinitionError(f"step {id!r}: posture must be a str, got {posture!r}")
        self.posture = posture
        if ground is None or isinstance(ground, Ground):
            self.ground = ground
        elif isinstance(ground, str):
            try:
                self.ground = Ground(ground)
            except TemplateError as exc:
                raise FlowDefinitionError(f"step {id!r}: ground: {exc}") from None
        else:
            raise FlowDefinitionError(f"step {id!r}: ground must be a str, got {ground!r}")
        self.allow = _tools(allow, id, "allow")
        self.deny = _tools(deny, id, "deny")
        if type(terminal) is not bool:
            raise FlowDefinitionError(f"step {id!r}: terminal must be True or False")
        self.terminal = terminal
        if type(ends) is not bool:
            raise FlowDefinitionError(f"step {id!r}: ends must be True or False")
        self.ends = ends
        if on_enter is not None and not isinstance(on_enter, OnEnter):
            raise FlowDefinitionError(
                f"step {id!r}: on_enter takes run(resolver, mode), got {on_enter!r}"
            )
        self.on_enter = on_enter
        if repair is not None and not isinstance(repair, RepairPolicy):
            raise FlowDefinitionError(f"step {id!r}: repair takes a RepairPolicy, got {repair!r}")
        if repair is not None and repair.escalate_to == id:
            raise FlowDefinitionError(f"step {id!r}: repair cannot escalate to the step itself")
        self.repair = repair
        if timing is not None and not isinstance(timing, VoiceTiming):
            raise FlowDefinitionError(f"step {id!r}: timing takes a VoiceTiming, got {timing!r}")
        self.timing = timing
        if summary is not None and (type(summary) is not str or not summary.strip()):
            raise FlowDefinitionError(f"step {id!r}: summary is a non-empty str, got {summary!r}")
        self.summary = summary

    @property
    def said_as(self) -> str:
        """How the step is named to the model: its ``summary``, else its id in words."""
        if self.summary is not None:
            return self.summary
        return " ".join(self.id.replace("_", " ").replace("-", " ").replace(":", " ").split())

    def guards(self) -> list[tuple[str, Guard]]:
        """Every guard of the step with where it sits: ``gate``, ``done``, ``after[i].when``."""
        found: list[tuple[str, Guard]] = []
        for i, e in enumerate(self.after):
            if e.when is not None:
                found.append((f"after[{i}].when", e.when))
        if self.gate is not None:
            found.append(("gate", self.gate))
        if self.done is not None:
            found.append(("done", self.done))
        return found

    def _key(self) -> tuple[Any, ...]:
        return (
            self.id,
            self.after,
            self.join,
            self.gate,
            self.done,
            self.posture,
            self.ground,
            self.allow,
            self.deny,
            self.terminal,
            self.ends,
            self.on_enter,
            self.repair,
            self.timing,
            self.summary,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Step):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        deps = ", ".join(e.step for e in self.after)
        kind = "ending " if self.ends else "terminal " if self.terminal else ""
        return f"<{kind}Step {self.id!r}" + (f" after {deps}" if deps else "") + ">"
