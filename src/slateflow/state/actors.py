"""Acting writers: a block of code whose writes are stamped as one writer and fenced to its keys."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import PolicyViolation
from .keys import compile_pattern

__all__ = ["Actor"]


class Actor:
    """Who is writing in the current context, and which keys it may touch.

    Set by :meth:`State.acting_as` (the Session sets one around each resolver's code). Writes with
    the default provenance (``source="user"``, no writer) are stamped as the actor; a write outside
    ``allow`` or inside ``deny`` raises :class:`PolicyViolation` before anything is written.
    """

    __slots__ = ("allow", "deny", "source", "writer")

    def __init__(self, writer: str, source: str, allow: Iterable[str], deny: Iterable[str]) -> None:
        self.writer = writer
        self.source = source
        self.allow = tuple(compile_pattern(p) for p in allow)
        self.deny = tuple(compile_pattern(p) for p in deny)

    def admit(self, key: str, source: str, writer: str | None) -> tuple[str, str | None]:
        """Check a write to ``key``; returns the provenance source and writer to record."""
        if any(p.matches(key) for p in self.deny) or not any(p.matches(key) for p in self.allow):
            allowed = ", ".join(repr(p.text) for p in self.allow)
            denied = ", ".join(repr(p.text) for p in self.deny)
            except_ = f" except {denied}, which belong to the runtime" if denied else ""
            raise PolicyViolation(
                f"{self.writer!r} may not write {key!r} while it runs: it may write only "
                f"{allowed}{except_}; return the value instead, declare the key (a resolver's "
                "writes=[...]), or write it elsewhere"
            )
        if source == "user" and writer is None:
            return self.source, self.writer
        return source, writer

    def __repr__(self) -> str:
        return f"Actor({self.writer!r}, source={self.source!r})"
