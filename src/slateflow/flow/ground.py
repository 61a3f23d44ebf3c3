"""Grounds: a step's fact line, rendered from the State each time the model is told about it.

A ground is a prompt template (``{key}``, ``{key.path}``, ``{key?default}``, ``{{ }}``) with one
addition for steering: ``{key?yes:no}`` renders ``yes`` when the value is truthy and ``no``
otherwise. Because a ground is read every turn of a live conversation, a missing key renders as
nothing instead of raising; a line that renders blank is dropped by the runner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import FlowError, TemplateError
from ..resolve.template import MISSING, Placeholder, Template, spell, walk_path

if TYPE_CHECKING:
    from ..state import State
    from .definition import Flow

__all__ = ["Ground", "check_grounds", "truthy"]


def truthy(value: Any) -> bool:
    """Whether a state value counts as yes in ``{key?yes:no}``: missing, ``null``, ``false``,
    ``0``, ``""``, ``[]`` and ``{}`` are no; everything else is yes."""
    return value is not MISSING and bool(value)


class _Choice:
    """``{key?yes:no}``: the placeholder and the two texts."""

    __slots__ = ("no", "piece", "yes")

    def __init__(self, piece: Placeholder, yes: str, no: str) -> None:
        self.piece = piece
        self.yes = yes
        self.no = no


class Ground:
    """A step's grounding template; ``render(state)`` gives the line for the model.

    Syntax errors raise :class:`TemplateError` when the ground is built (with the step's id when
    a :class:`Step` builds it). ``{key?yes:no}`` splits at the first ``:`` (a ground's default
    therefore cannot contain ``:``). A secret key's value is never rendered (an error), but
    ``{secret?yes:no}`` may test whether it is known.
    """

    __slots__ = ("_pieces", "_template", "keys")

    def __init__(self, text: str) -> None:
        template = Template(text)
        pieces: list[str | Placeholder | _Choice] = []
        for piece in template._pieces:
            if isinstance(piece, Placeholder) and piece.optional and ":" in piece.default:
                yes, _, no = piece.default.partition(":")
                pieces.append(_Choice(piece, yes.strip(), no.strip()))
            else:
                pieces.append(piece)
        self._template = template
        self._pieces = tuple(pieces)
        self.keys: tuple[str, ...] = template.keys
        """The state keys the ground reads."""

    @property
    def text(self) -> str:
        """The ground's source text."""
        return self._template.text

    def render(self, state: State) -> str:
        """The line, with values from ``state`` (a missing key renders as nothing)."""
        out: list[str] = []
        for piece in self._pieces:
            if isinstance(piece, str):
                out.append(piece)
            elif isinstance(piece, _Choice):
                out.append(piece.yes if truthy(_lookup(state, piece.piece)) else piece.no)
            else:
                if state.is_secret(piece.key):
                    raise TemplateError(
                        f"ground {self.text!r}: {piece.source} reads secret key {piece.key!r}; "
                        "a ground goes to the model, so it may only test a secret "
                        f"({{{piece.ref}?yes:no}}), never show it"
                    )
                value = _lookup(state, piece)
                if value is MISSING:
                    out.append(piece.default if piece.optional else "")
                else:
                    out.append(spell(value))
        return "".join(out)

    def shown_secrets(self, state: State) -> list[str]:
        """The secret keys (under ``state``'s policy) whose values this ground would show."""
        return [
            piece.key
            for piece in self._pieces
            if isinstance(piece, Placeholder) and state.is_secret(piece.key)
        ]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ground) and other.text == self.text

    def __hash__(self) -> int:
        return hash((Ground, self.text))

    def __repr__(self) -> str:
        return f"Ground({self.text!r})"


def _lookup(state: State, piece: Placeholder) -> Any:
    found = state.get(piece.key, MISSING)
    return walk_path(found, piece.steps) if piece.steps else found


def check_grounds(flow: Flow, state: State) -> None:
    """Refuse to run a flow whose step grounds show a secret key to the model."""
    # Only a policy can make a key secret: an ungoverned state has nothing to check.
    for s in flow.steps if state.engine.policy.active else ():
        shown = s.ground.shown_secrets(state) if s.ground is not None else []
        if shown:
            raise FlowError(
                f"flow {flow.name!r}: step {s.id!r}'s ground shows {shown[0]!r}, a secret "
                "key, to the model; test it instead ({" + shown[0] + "?known:unknown})"
            )
