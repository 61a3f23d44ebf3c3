"""Keys: validation, ``*`` patterns, typed keys and the resolver result convention."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from functools import lru_cache
from typing import Any, Generic, TypeVar

from pydantic import TypeAdapter

from ..errors import InvalidKeyError

__all__ = [
    "MAX_KEY_LENGTH",
    "META_PREFIX",
    "Key",
    "Pattern",
    "check_key",
    "error_key",
    "key_name",
    "partial_key",
    "result_key",
    "status_key",
    "unprintable",
]

T = TypeVar("T")

MAX_KEY_LENGTH = 256
META_PREFIX = "state_meta:"

# Characters that print as nothing or reorder what follows (format characters: zero-width
# spaces and joiners, bidi overrides and isolates, the BOM, soft hyphens, tag characters),
# lone surrogates and non-characters: two keys differing only by them would print the same.
_INVISIBLE = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u08e2\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\ufffe\uffff\ud800-\udfff"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f"
)
# A segment is any run of characters other than whitespace, control characters, invisible
# characters, ":" and "*".
_SEGMENT = rf"[^\s:*\x00-\x1f\x7f-\x9f{_INVISIBLE}]+"
_KEY_RE = re.compile(rf"{_SEGMENT}(?::{_SEGMENT})*")
_PATTERN_RE = re.compile(rf"[^\s\x00-\x1f\x7f-\x9f{_INVISIBLE}]+")
_INVISIBLE_RE = re.compile(f"[{_INVISIBLE}]")


def result_key(name: str) -> str:
    """The key a resolver named ``name`` writes its value to: ``"{name}:result"``."""
    return f"{name}:result"


def partial_key(name: str) -> str:
    """The key a streaming resolver keeps its answer so far in while it runs:
    ``"{name}:partial"`` (removed when the run ends)."""
    return f"{name}:partial"


def error_key(name: str) -> str:
    """The key a resolver named ``name`` writes its error message to: ``"{name}:error"``."""
    return f"{name}:error"


def status_key(name: str) -> str:
    """The key holding a resolver's status (``running``, ``done``, ...): ``"{name}:status"``."""
    return f"{name}:status"


def key_list(keys: str | Key[Any] | Iterable[str | Key[Any]]) -> list[str | Key[Any]]:
    """``keys`` as a list; a lone key is one key, not an iterable of characters."""
    return [keys] if isinstance(keys, str | Key) else list(keys)


def _hidden(ch: str) -> str:
    if unicodedata.category(ch) == "Cc":
        return f"it contains a control character ({ch!r})"
    if _INVISIBLE_RE.match(ch) or unicodedata.category(ch) in ("Cf", "Cs"):
        name = unicodedata.name(ch, "a surrogate or non-character")
        return f"it contains an invisible or text-reordering character (U+{ord(ch):04X} {name})"
    return ""


def unprintable(text: str) -> str:
    """Why ``text`` (a name: a step id, a tool) would not print as itself: it holds a control,
    invisible or text-reordering character, or is only whitespace; ``""`` when it is fine."""
    if not text.strip():
        return "it is blank"
    for ch in text:
        if not ch.isascii() or not ch.isprintable():
            hidden = _hidden(ch)
            if hidden:
                return hidden
    return ""


def _why_invalid(key: str) -> str:
    if not key:
        return "it is empty"
    if len(key) > MAX_KEY_LENGTH:
        return f"it is {len(key)} characters long (at most {MAX_KEY_LENGTH})"
    for ch in key:
        if ch.isspace():
            return f"it contains whitespace ({ch!r})"
        hidden = _hidden(ch)
        if hidden:
            return f"{hidden}, so it would print like another key"
        if ch == "*":
            return "it contains '*', which is reserved for patterns"
    return "it has an empty segment (keys are segments joined by ':', like 'booking:date')"


KNOWN_VALID: set[str] = set()
"""Strings :func:`check_key` already found valid (a bounded cache; validity is a property of
the string alone)."""
_VALID_MAX = 65_536


def key_name(key: str | Key[Any] | object) -> str:
    """The name of a key given as a str or a :class:`Key` (anything else is checked, and
    refused with :class:`InvalidKeyError` if it is no key)."""
    if type(key) is str:
        return key
    if isinstance(key, Key):
        return key.name
    return check_key(key)


def check_key(key: object) -> str:
    """Return ``key`` if it is a valid state key, else raise :class:`InvalidKeyError` naming it.

    A ``str`` subclass (such as a ``StrEnum`` member) is accepted and returned as a plain ``str``.
    """
    if type(key) is not str:
        if isinstance(key, str):
            return check_key(str.__str__(key))
        raise InvalidKeyError(
            f"state key {key!r} is a {type(key).__name__}; keys are strings such as 'booking:date'"
        )
    if key in KNOWN_VALID:
        return key
    if (
        len(key) <= MAX_KEY_LENGTH
        and _KEY_RE.fullmatch(key) is not None
        and (key.isascii() or not _has_format_character(key))
    ):
        # Validity is a property of the string alone: remember it (a bounded set).
        if len(KNOWN_VALID) >= _VALID_MAX:
            KNOWN_VALID.clear()
        KNOWN_VALID.add(key)
        return key
    raise InvalidKeyError(f"invalid state key {key!r}: {_why_invalid(key)}")


def _has_format_character(key: str) -> bool:
    # The regex knows the common invisible characters; the Unicode database knows them all.
    return any(unicodedata.category(ch) in ("Cf", "Cs") for ch in key if not ch.isascii())


class Pattern:
    """A key pattern where ``*`` matches any run of characters (including ``:``).

    ``"*:result"`` matches ``"verify:result"`` and ``"a:b:result"``; a pattern without ``*``
    matches only that exact key. Specificity (used when several declarations match one key) is
    the number of literal characters: the exact key beats every pattern, ``"verify:*"`` beats
    ``"*"``.
    """

    __slots__ = ("_prefix", "_regex", "_suffix", "specificity", "text", "wildcard")

    def __init__(self, text: str) -> None:
        if type(text) is not str or not text or len(text) > MAX_KEY_LENGTH:
            raise InvalidKeyError(f"invalid key pattern {text!r}: patterns are non-empty strings")
        if "*" not in text:
            check_key(text)
        elif _PATTERN_RE.fullmatch(text) is None or (
            not text.isascii() and _has_format_character(text)
        ):
            raise InvalidKeyError(
                f"invalid key pattern {text!r}: it contains whitespace, control or invisible "
                "characters"
            )
        self.text = text
        self.wildcard = "*" in text
        self.specificity = len(text) - text.count("*") + (0 if self.wildcard else MAX_KEY_LENGTH)
        # One "*" (``name:*``, ``*:result``: nearly every pattern) is a prefix and a suffix;
        # only patterns with several are compiled, and only when first matched.
        pieces = text.split("*")
        self._prefix, self._suffix = pieces[0], pieces[-1]
        self._regex: re.Pattern[str] | None = None

    def matches(self, key: str) -> bool:
        """Whether ``key`` matches this pattern."""
        if not self.wildcard:
            return key == self.text
        prefix, suffix = self._prefix, self._suffix
        if len(key) < len(prefix) + len(suffix):
            return False
        if not (key.startswith(prefix) and key.endswith(suffix)):
            return False
        if self.text.count("*") == 1:
            return True
        regex = self._regex
        if regex is None:
            parts = (re.escape(p) for p in self.text.split("*"))
            regex = self._regex = re.compile(".*".join(parts), re.DOTALL)
        return regex.fullmatch(key) is not None

    def __repr__(self) -> str:
        return f"Pattern({self.text!r})"


@lru_cache(maxsize=4096)
def compile_pattern(text: str) -> Pattern:
    """A cached :class:`Pattern` for ``text``."""
    return Pattern(text)


class Key(Generic[T]):
    """A typed key: a key name bound to a type that validates writes and types reads.

    ``BOOKING = Key("booking", Booking)``; ``state.set(BOOKING, Booking(...))`` validates the value
    with pydantic and stores its JSON form; ``state.get(BOOKING)`` returns a ``Booking``. Reading
    the plain name (``state.get("booking")``) returns the stored JSON data.
    """

    __slots__ = ("adapter", "name", "type")

    def __init__(self, name: str, type_: type[T] | Any) -> None:
        self.name = check_key(name)
        self.type = type_
        self.adapter: TypeAdapter[T] = TypeAdapter(type_)

    def __repr__(self) -> str:
        type_name = getattr(self.type, "__name__", repr(self.type))
        return f"Key({self.name!r}, {type_name})"
