"""Knowing, cheaply, that the running code is inside a section: what may not wait for itself.

User code runs inside slateflow's own work (a flow action inside a turn, a tool's function
inside its claim), and may call back in. Waiting there for the very thing that runs it would
wedge the call forever, so the waits that could be re-entered first ask :func:`inside`, and
refuse (or go ahead) instead. A section is marked with :func:`entered` around the code that runs
in it; a task started inside a section inherits the mark (it runs on the section's behalf), and
once the section ends the mark no longer counts, even in a task that outlives it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["entered", "inside"]

_open: ContextVar[tuple[_Section, ...]] = ContextVar("slateflow_sections", default=())


class _Section:
    __slots__ = ("open", "owner")

    def __init__(self, owner: object) -> None:
        self.owner = owner
        self.open = True


def inside(owner: object) -> bool:
    """Whether the running code is inside a section of ``owner`` that is still open."""
    return any(s.owner is owner and s.open for s in _open.get())


@contextmanager
def entered(owner: object) -> Iterator[None]:
    """Mark the code run in this block (and the tasks it starts) as inside ``owner``."""
    section = _Section(owner)
    token = _open.set((*_open.get(), section))
    try:
        yield
    finally:
        section.open = False
        _open.reset(token)
