"""Knowing, cheaply, that the running code is inside a section: what may not wait for itself.

User code runs inside slateflow's own work (a flow action inside a turn, a tool's function
inside its claim), and may call back in. Waiting there for the very thing that runs it would
wedge the call forever, so the waits that could be re-entered first ask :func:`inside`, and
refuse (or go ahead) instead. A section is marked with :func:`entered` around the code that runs
in it; a task started inside a section inherits the mark (it runs on the section's behalf), and
once the section ends the mark no longer counts, even in a task that outlives it.
"""

from __future__ import annotations

from contextvars import ContextVar, Token

__all__ = ["entered", "inside", "open_sections"]

_open: ContextVar[tuple[_Section, ...]] = ContextVar("slateflow_sections", default=())
open_sections = _open.get
"""The sections the running code is inside (empty, and so false, almost always: a cheap first
test before :func:`inside`)."""


class _Section:
    __slots__ = ("open", "owner")

    def __init__(self, owner: object) -> None:
        self.owner = owner
        self.open = True


def inside(owner: object) -> bool:
    """Whether the running code is inside a section of ``owner`` that is still open."""
    sections = _open.get()
    return bool(sections) and any(s.owner is owner and s.open for s in sections)


class entered:  # lower case: it reads as a function, ``with entered(owner):``
    """Mark the code run in this block (and the tasks it starts) as inside ``owner``."""

    __slots__ = ("_section", "_token")

    def __init__(self, owner: object) -> None:
        self._section = _Section(owner)
        self._token: Token[tuple[_Section, ...]] | None = None

    def __enter__(self) -> None:
        self._token = _open.set((*_open.get(), self._section))

    def __exit__(self, *exc: object) -> None:
        self._section.open = False
        if self._token is not None:
            _open.reset(self._token)
            self._token = None
