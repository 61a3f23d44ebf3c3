"""What every recognizer is: ``recognize(text)`` gives a :class:`Recognition` or None."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ...state import State

__all__ = ["Recognition", "Recognizer"]


class Recognition(NamedTuple):
    """What a recognizer read: the ``value`` (JSON data) and its ``confidence`` (0 to 1)."""

    value: Any
    confidence: float


class Recognizer(ABC):
    """Reads one kind of value from a transcript; build one with the functions of this package."""

    @abstractmethod
    def recognize(self, text: str) -> Recognition | None:
        """The value found in ``text``, or None."""

    @abstractmethod
    def describe(self) -> str:
        """What it reads, in a few words."""

    def recognize_in(self, text: str, state: State) -> Recognition | None:
        """The value found in ``text`` by a recognizer that may also read the State (a
        :func:`~slateflow.conversation.choice` reads the options offered); extractors call
        this. Most recognizers read only the text."""
        return self.recognize(text)

    def map(self, fn: Callable[[Any], Any], describe: str = "") -> Recognizer:
        """This recognizer with ``fn`` applied to its value; a value ``fn`` maps to None counts
        as not recognised (``datetime().map(lambda v: v.get("time"))`` reads only times)."""
        return _Mapped(self, fn, describe or f"{self.describe()}, mapped")

    def pick(self, part: str) -> Recognizer:
        """This recognizer keeping one part of a dict value, when it was heard:
        ``datetime().pick("time")`` reads "19:30" from "at half past seven... 19:30"."""
        return _Mapped(
            self,
            lambda v: v.get(part) if isinstance(v, dict) else None,
            f"{self.describe()}: {part}",
        )

    def __repr__(self) -> str:
        return f"<recognizer: {self.describe()}>"


class _Mapped(Recognizer):
    def __init__(self, inner: Recognizer, fn: Callable[[Any], Any], text: str) -> None:
        self.inner = inner
        self.fn = fn
        self.text = text

    def recognize(self, text: str) -> Recognition | None:
        return self._mapped(self.inner.recognize(text))

    def recognize_in(self, text: str, state: State) -> Recognition | None:
        return self._mapped(self.inner.recognize_in(text, state))

    def _mapped(self, found: Recognition | None) -> Recognition | None:
        if found is None:
            return None
        value = self.fn(found.value)
        return None if value is None else Recognition(value, found.confidence)

    def describe(self) -> str:
        return self.text
