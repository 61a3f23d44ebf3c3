"""Prompt templates: text with ``{placeholders}`` filled from the state when an LLM is called.

A template is parsed once, when it is built; rendering it only reads the state. The syntax::

    template    := ( literal | "{{" | "}}" | placeholder )*
    placeholder := "{" reference [ "?" [ default ] ] "}"
    reference   := key ( "." step )*
    key         := a state key containing no "."      e.g. availability:result
                 | "[" any state key "]"              e.g. [files:report.pdf]
    step        := a name (dict field) | an integer (list index; negative counts from the end)
    default     := any text without "{" or "}"       rendered when the key or path is missing

Whitespace just inside the braces is ignored (``{ topic }``), and so is whitespace around the
``?`` and at both ends of a default (``{ user:name ? there }`` falls back to ``there``).
``{{`` and ``}}`` are literal braces; a lone ``}``, an unclosed ``{`` and an empty ``{}`` are
syntax errors, reported with their line, column and the offending text.

- A key written without brackets ends at the first ``.``, ``?`` or ``}`` and may not contain
  whitespace, ``{``, ``[`` or ``]`` (``{items[0]}`` is a syntax error: write ``{items.0}``).
  Any other key, such as one containing ``.``, ``?`` or braces, is written in brackets; a
  bracketed key ends at the first ``]``, so a key containing ``]`` cannot be referenced. Every
  key must be a valid state key.
- A step is a run of characters other than whitespace and ``. ? { } [ ]``. A step of ASCII
  digits (optionally led by ``-``) indexes a list; on a dict every step is a field name, so
  ``{prices.2024}`` reads the field ``"2024"``.
- Strings render as they are. Every other value renders as compact JSON (``true``, ``null``,
  ``3``, ``{"open":true}``, non-ASCII characters kept).
- A missing key or path (a field that is absent, an index out of range, a step into a string or
  number) is an error naming the placeholder and the step, unless the placeholder has ``?``: then
  it renders its default, or nothing.
- A key the policy marks secret is never put into a prompt: rendering it is an error, even with
  ``?``. No error message ever contains a secret value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..errors import InvalidKeyError, SlateError, TemplateError
from ..state.keys import check_key

if TYPE_CHECKING:
    from ..state import State

__all__ = ["MISSING", "Reference", "Template", "render"]

_MISSING: Any = object()
_BRACE = re.compile(r"[{}]")
_INDEX = re.compile(r"-?[0-9]+")
# Characters that end a key or step name (whitespace ends it too).
_NAME_STOP = frozenset(".?{}[]")
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_LITERAL_HINT = "; write '{{' and '}}' for literal braces"
_SNIPPET_WIDTH = 72
_MAX_FIELDS = 10


class Placeholder:
    """One parsed ``{...}``: the key, the path below it and the fallback, with source spans."""

    __slots__ = ("default", "head", "key", "optional", "ref", "source", "steps")

    def __init__(
        self,
        key: str,
        head: str,
        steps: tuple[tuple[str, int | None], ...],
        optional: bool,
        default: str,
        ref: str,
        source: str,
    ) -> None:
        self.key = key
        self.head = head  # the key as written: "user:name" or "[files:report.pdf]"
        self.steps = steps  # (name, list index if the name is an integer)
        self.optional = optional
        self.default = default
        self.ref = ref  # the reference as written, without the braces, "?" and default
        self.source = source  # the whole placeholder as written

    def __repr__(self) -> str:
        return f"<placeholder {self.source}>"


class Template:
    """A prompt template: text with ``{key}`` / ``{key.path}`` placeholders filled from a State.

    ``Template(text)`` parses the text at once and raises :class:`TemplateError` (with the line,
    column and a snippet) for bad syntax; see the module documentation for the grammar.
    :meth:`render` reads the state and never writes it. ``keys`` lists the state keys the
    template reads (a resolver's default ``reads``). Templates are immutable and compare, hash
    and pickle by their text.
    """

    __slots__ = ("_firsts", "_keys", "_pieces", "_static", "_text")

    _text: str
    _pieces: tuple[str | Placeholder, ...]
    _keys: tuple[str, ...]
    _firsts: tuple[Placeholder, ...]
    _static: str | None

    def __init__(self, text: str) -> None:
        if type(text) is not str:
            if not isinstance(text, str):
                raise TypeError(f"Template() takes the template text as a str, got {text!r}")
            text = str.__str__(text)
        pieces = _parse(text)
        firsts: dict[str, Placeholder] = {}
        for piece in pieces:
            if not isinstance(piece, str) and piece.key not in firsts:
                firsts[piece.key] = piece
        self._text = text
        self._pieces = pieces
        self._keys = tuple(firsts)
        self._firsts = tuple(firsts.values())
        # Text without placeholders renders to itself; skip the loop (and the state) entirely.
        self._static = None if firsts else "".join(p for p in pieces if isinstance(p, str))

    @property
    def text(self) -> str:
        """The template's source text, as given."""
        return self._text

    @property
    def keys(self) -> tuple[str, ...]:
        """The distinct state keys the placeholders read, in order of first appearance."""
        return self._keys

    def render(self, state: State, *, owner: str | None = None) -> str:
        """The text with every placeholder replaced by its value from ``state``.

        Raises :class:`TemplateError` for a missing key or path (unless the placeholder has
        ``?``) and for any secret key. ``owner`` (the resolver's name) only prefixes error
        messages: ``resolver 'summary': ...``. The state is only read, never written.
        """
        static = self._static
        if static is not None:
            return static
        # Checked on every render, before any value is read: policies may change between renders.
        is_secret = state.is_secret
        for first in self._firsts:
            if is_secret(first.key):
                raise TemplateError(_secret_message(first, owner))
        get = state.get
        out: list[str] = []
        append = out.append
        piece: str | Placeholder = ""
        try:
            for piece in self._pieces:
                if isinstance(piece, str):
                    append(piece)
                    continue
                found = get(piece.key, _MISSING)
                value = walk_path(found, piece.steps) if piece.steps else found
                if value is _MISSING:
                    if piece.optional:
                        append(piece.default)
                        continue
                    raise TemplateError(_missing_message(piece, found, state, owner))
                kind = type(value)
                # JSON spells scalars as Python's repr does; only containers need the encoder.
                if kind is str:
                    append(value)
                elif kind is bool:
                    append("true" if value else "false")
                elif kind is int:
                    append(int.__repr__(value))
                elif kind is float:
                    append(float.__repr__(value))
                elif value is None:
                    append("null")
                else:
                    append(_encode(value))
        except SlateError:
            raise
        except ValueError as exc:  # an int beyond Python's int-to-str digit limit
            raise TemplateError(_unrenderable_message(piece, owner, exc)) from None
        return "".join(out)

    def fill(
        self,
        state: State,
        *,
        owner: str | None = None,
        quote: Callable[[str], str] | None = None,
    ) -> tuple[str, str, tuple[str, ...]]:
        """The text filled from ``state`` for a request that must carry secrets (an HTTP
        call's URL, headers or body), unlike :meth:`render`, which refuses them.

        Returns the filled text, the text to show people (each secret key's value as ``***``)
        and the secret strings put in (to mask them wherever a server echoes them). ``quote``
        encodes each value put in (a URL's path segments), except a value that starts the text
        (a base URL from a key). Missing keys fail as in :meth:`render`.
        """
        static = self._static
        if static is not None:
            return static, static, ()
        is_secret = state.is_secret
        get = state.get
        real: list[str] = []
        shown: list[str] = []
        secrets: list[str] = []
        for index, piece in enumerate(self._pieces):
            if isinstance(piece, str):
                real.append(piece)
                shown.append(piece)
                continue
            found = get(piece.key, _MISSING)
            value = walk_path(found, piece.steps) if piece.steps else found
            if value is _MISSING:
                if not piece.optional:
                    raise TemplateError(_missing_message(piece, found, state, owner))
                text = piece.default
            else:
                try:
                    text = spell(value)
                except ValueError as exc:
                    raise TemplateError(_unrenderable_message(piece, owner, exc)) from None
            if quote is not None and index > 0:
                text = quote(text)
            real.append(text)
            if is_secret(piece.key) and value is not _MISSING:
                shown.append("***")
                if text:
                    secrets.append(text)
            else:
                shown.append(text)
        return "".join(real), "".join(shown), tuple(secrets)

    def __repr__(self) -> str:
        text = self._text
        if len(text) <= 60:
            return f"Template({text!r})"
        return f"Template({text[:50] + '…'!r}, {len(text)} chars)"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Template):
            return self._text == other._text
        return NotImplemented

    def __hash__(self) -> int:
        return hash((Template, self._text))

    def __reduce__(self) -> tuple[type[Template], tuple[str]]:
        return (Template, (self._text,))


@lru_cache(maxsize=256)
def _compiled(text: str) -> Template:
    return Template(text)


def render(text: str, state: State, *, owner: str | None = None) -> str:
    """Render ``text`` as a :class:`Template` from ``state`` (parsed templates are cached).

    Same rules and errors as :meth:`Template.render`. Build a :class:`Template` once instead
    when you render the same text many times and want syntax errors at definition time.
    """
    if type(text) is not str:
        return Template(text).render(state, owner=owner)
    return _compiled(text).render(state, owner=owner)


# -- rendering helpers (the cold paths live here, out of the render loop) --------------------


MISSING: Any = _MISSING
"""What :meth:`Reference.lookup` returns when the key or path is not there."""


def spell(value: Any) -> str:
    """A value as a template shows it: a string as it is, anything else as compact JSON."""
    # The render loop inlines the same rules for speed.
    kind = type(value)
    if kind is str:
        return str(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value)
    if kind is float:
        return float.__repr__(value)
    if value is None:
        return "null"
    return _encode(value)


class Reference:
    """A key with an optional path into its value, in the template grammar: ``key.path.0``.

    ``Reference("availability:result.open.0")`` reads key ``availability:result``, field ``open``,
    item 0; ``Reference("[files:report.pdf].size")`` brackets a key containing ``.``. Raises
    :class:`TemplateError` for bad syntax. Guards use it for ``eq("booking:slot.time", ...)``.
    """

    __slots__ = ("key", "steps", "text")

    def __init__(self, text: str) -> None:
        if type(text) is not str:
            raise TypeError(f"a key reference is a str such as 'booking:slot.time', got {text!r}")
        pieces = _parse("{" + text + "}")
        piece = pieces[0] if len(pieces) == 1 else None
        if not isinstance(piece, Placeholder) or piece.optional:
            raise TemplateError(
                f"{text!r} is not a key reference: write a key, optionally followed by a path "
                "('booking:slot.time', '[odd.key].field')"
            )
        self.text = text
        self.key = piece.key
        self.steps = piece.steps

    def lookup(self, state: State) -> Any:
        """The value at the key and path (a copy), or :data:`MISSING` when it is not there."""
        value = state.get(self.key, _MISSING)
        return walk_path(value, self.steps) if self.steps else value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Reference) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"Reference({self.text!r})"


def walk_path(value: Any, steps: tuple[tuple[str, int | None], ...]) -> Any:
    # _MISSING itself falls through to the last branch: a missing key stays missing.
    for name, index in steps:
        kind = type(value)
        if kind is dict:
            value = value.get(name, _MISSING)
            if value is _MISSING:
                return _MISSING
        elif kind is list and index is not None and -len(value) <= index < len(value):
            value = value[index]
        else:
            return _MISSING
    return value


def _unrenderable_message(piece: str | Placeholder, owner: str | None, exc: Exception) -> str:
    where = piece.source if isinstance(piece, Placeholder) else "(literal)"
    return f"{_prefix(owner)}template placeholder {where} -> the value cannot be rendered: {exc}"


def _prefix(owner: str | None) -> str:
    return "" if owner is None else f"resolver {owner!r}: "


def _suggest(piece: Placeholder) -> str:
    return "{" + piece.ref + "?}"


def _secret_message(piece: Placeholder, owner: str | None) -> str:
    even = " (even with '?': a secret never silently disappears either)" if piece.optional else ""
    return (
        f"{_prefix(owner)}template placeholder {piece.source} -> key {piece.key!r} is secret, "
        f"and secret values are never put into a prompt{even}; remove the placeholder, or "
        "put what the model may see under another key"
    )


def _describe(value: Any) -> str:
    """What a value is, for an error message: its JSON type and shape, never its content."""
    kind = type(value)
    if kind is dict:
        if not value:
            return "it is an empty dict"
        names = [name if len(name) <= 40 else name[:39] + "…" for name in list(value)[:_MAX_FIELDS]]
        more = len(value) - len(names)
        listed = ", ".join(names) + (f", ... ({more} more)" if more else "")
        return f"it is a dict with fields: {listed}"
    if kind is list:
        if not value:
            return "it is an empty list"
        return f"it is a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    if kind is str:
        return "it is a string"
    if kind is bool:
        return "it is a boolean"
    if value is None:
        return "it is null"
    return "it is a number"


def _path_failure(value: Any, piece: Placeholder) -> str:
    walked = piece.head
    for name, index in piece.steps:
        kind = type(value)
        if kind is dict and name in value:
            value = value[name]
        elif kind is list and index is not None and -len(value) <= index < len(value):
            value = value[index]
        else:
            what = f"no field {name!r}" if index is None or kind is dict else f"no index {index}"
            why = _describe(value)
            if kind is list and index is None:
                why += f"; index it with a number, like {walked}.0"
            return f"{walked!r} has {what} ({why})"
        walked += "." + name
    raise AssertionError("the path was found")  # pragma: no cover


def _missing_message(piece: Placeholder, value: Any, state: State, owner: str | None) -> str:
    if value is _MISSING:
        what = f"key {piece.key!r} is not set"
        todo = f"set the key first, or write {_suggest(piece)} to render it empty"
    else:
        what = _path_failure(value, piece)
        todo = f"check the path, or write {_suggest(piece)} to render it empty"
    hint = ""
    if piece.steps and not piece.head.startswith("["):
        dotted = piece.ref
        try:
            if dotted in state:
                hint = f" (a key {dotted!r} is set: write {{[{dotted}]}} for a key with a '.')"
        except SlateError:
            pass
    return f"{_prefix(owner)}template placeholder {piece.source} -> {what}{hint}; {todo}"


# -- parsing -----------------------------------------------------------------------------------


def _where(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {column}" if "\n" in text else f"column {column}"


def _snippet(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    if end < 0:
        end = len(text)
    left, right = start, end
    if right - left > _SNIPPET_WIDTH:
        left = max(start, min(pos - _SNIPPET_WIDTH // 2, end - _SNIPPET_WIDTH))
        right = min(end, left + _SNIPPET_WIDTH)
    shown = "".join(c if c.isprintable() else " " for c in text[left:right])
    before = "…" if left > start else ""
    after = "…" if right < end else ""
    caret = " " * (len(before) + pos - left) + "^"
    return f"\n    {before}{shown}{after}\n    {caret}"


def _error(text: str, pos: int, message: str) -> TemplateError:
    return TemplateError(
        f"template syntax error at {_where(text, pos)}: {message}{_snippet(text, pos)}"
    )


def _read_name(text: str, pos: int) -> int:
    """The end of the key or step name starting at ``pos``."""
    n = len(text)
    while pos < n:
        ch = text[pos]
        if ch in _NAME_STOP or ch.isspace():
            break
        pos += 1
    return pos


def _skip_space(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos].isspace():
        pos += 1
    return pos


def _bad_name(text: str, pos: int, opened: int, what: str) -> TemplateError:
    """The error for an empty key or step name at ``pos`` (the character there explains why)."""
    if pos >= len(text):
        return _error(text, opened, "unclosed '{'" + _LITERAL_HINT)
    ch = text[pos]
    if ch == "}":
        if what == "key":
            return _error(text, opened, "empty placeholder '{}'" + _LITERAL_HINT)
        return _error(text, pos, f"expected a {what} before '}}'")
    if ch == "{":
        return _error(text, pos, "'{' inside a placeholder" + _LITERAL_HINT)
    if ch in "[]":
        return _error(
            text,
            pos,
            f"{ch!r} is only allowed around a whole key, like {{[files:report.pdf]}}; index "
            "a list with a step, like {items.0}",
        )
    if ch == "?":
        return _error(text, pos, f"expected a {what} before '?'")
    if ch == ".":
        return _error(text, pos, f"expected a {what} before '.'")
    return _error(text, pos, f"whitespace where a {what} was expected" + _LITERAL_HINT)


def _placeholder(text: str, opened: int) -> tuple[Placeholder, int]:
    """Parse the placeholder whose ``{`` is at ``opened``; return it and the index after ``}``."""
    n = len(text)
    pos = _skip_space(text, opened + 1)
    ref_start = pos
    if pos < n and text[pos] == "[":
        close = text.find("]", pos + 1)
        if close < 0:
            raise _error(text, pos, "unclosed '[': a bracketed key ends with ']'")
        key_at, key = pos + 1, text[pos + 1 : close]
        pos = close + 1
    else:
        end = _read_name(text, pos)
        if end == pos:
            raise _bad_name(text, pos, opened, "key")
        key_at, key = pos, text[pos:end]
        pos = end
    head = text[ref_start:pos]
    try:
        check_key(key)
    except InvalidKeyError as exc:
        why = f"{exc}" + (" (an empty '[]')" if not key else "")
        raise _error(text, key_at, why + ("" if head.startswith("[") else _LITERAL_HINT)) from None
    steps: list[tuple[str, int | None]] = []
    while pos < n and text[pos] == ".":
        end = _read_name(text, pos + 1)
        if end == pos + 1:
            raise _bad_name(text, end, opened, "step")
        name = text[pos + 1 : end]
        steps.append((name, int(name) if _INDEX.fullmatch(name) else None))
        pos = end
    ref = text[ref_start:pos]
    pos = _skip_space(text, pos)
    optional, default = False, ""
    if pos < n and text[pos] == "?":
        optional = True
        brace = _BRACE.search(text, pos + 1)
        if brace is None:
            raise _error(text, opened, "unclosed '{'" + _LITERAL_HINT)
        if brace.group() == "{":
            raise _error(
                text, brace.start(), "'{' inside a default (defaults cannot contain braces)"
            )
        default = text[pos + 1 : brace.start()].strip()
        pos = brace.start()
    if pos >= n:
        raise _error(text, opened, "unclosed '{'" + _LITERAL_HINT)
    ch = text[pos]
    if ch != "}":
        if ch == "{":
            raise _error(text, pos, "'{' inside a placeholder" + _LITERAL_HINT)
        if ch in "[]":
            raise _bad_name(text, pos, opened, "step")
        raise _error(
            text,
            pos,
            f"expected '}}' (or '?' and a default) after {{{ref}, found {ch!r}" + _LITERAL_HINT,
        )
    source = text[opened : pos + 1]
    placeholder = Placeholder(key, head, tuple(steps), optional, default, ref, source)
    return placeholder, pos + 1


def _parse(text: str) -> tuple[str | Placeholder, ...]:
    pieces: list[str | Placeholder] = []
    literal: list[str] = []
    pos, n = 0, len(text)
    while pos < n:
        brace = _BRACE.search(text, pos)
        if brace is None:
            literal.append(text[pos:])
            break
        at = brace.start()
        literal.append(text[pos:at])
        doubled = text.startswith(brace.group() * 2, at)
        if doubled:
            literal.append(brace.group())
            pos = at + 2
        elif brace.group() == "}":
            raise _error(text, at, "lone '}'; write '}}' for a literal '}'")
        else:
            placeholder, pos = _placeholder(text, at)
            if literal:
                pieces.append("".join(literal))
                literal = []
            pieces.append(placeholder)
    if literal:
        pieces.append("".join(literal))
    return tuple(p for p in pieces if not isinstance(p, str) or p)
