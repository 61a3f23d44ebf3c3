"""Extract: named fields recognised from the caller's words and promoted into the State.

``Extract("booking").field("date", datetime()).field("party_size", integer_near(["people"]))
.build()`` makes an :class:`Extractor`; ``extractor.extract(state, text)`` runs each field's
recognizer over the text (or the last ``window`` turns), asks each field's promotion rule
whether the value may be written, and writes the accepted ones in one batch with provenance
source ``"extraction"``, the extractor's name as writer and each value's confidence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ExtractDefinitionError, SlateError
from ..state import State
from ..state.keys import check_key
from .promotion import Decision, Rule, keep_known
from .recognizers import Recognizer

__all__ = ["Extract", "ExtractionResult", "Extractor", "Field"]


@dataclass(frozen=True, slots=True)
class Field:
    """One field: its ``name``, the ``key`` it is written to, its recognizer and its rule."""

    name: str
    key: str
    recognizer: Recognizer
    rule: Rule


@dataclass(frozen=True, slots=True)
class ExtractionResult:
    """What one run of an extractor did: a :class:`Decision` per recognised field, and
    ``values``, what is known of every field afterwards (``None`` when still unknown)."""

    extractor: str
    decisions: tuple[Decision, ...]
    values: dict[str, Any]

    @property
    def written(self) -> dict[str, Any]:
        """The values written to the State by this run, by key."""
        return {d.key: d.value for d in self.decisions if d.written}

    @property
    def complete(self) -> bool:
        """Whether every field is known now."""
        return all(v is not None for v in self.values.values())


class Extract:
    """Builds an :class:`Extractor` (``Extract(name).field(...)...build()``)."""

    def __init__(self, name: str) -> None:
        if type(name) is not str or not name:
            raise ExtractDefinitionError(f"an extractor name is a non-empty string, got {name!r}")
        self.name = name
        self._fields: dict[str, Field] = {}
        self._checks: list[tuple[Callable[[dict[str, Any]], Any], str]] = []
        self._window = 1

    def field(self, name: str, recognizer: Recognizer, rule: Rule | None = None) -> Extract:
        """Recognise field ``name`` with ``recognizer``; it is written to ``{extractor}:{name}``
        (or where ``rule.to(key)`` says) under ``rule`` (default :func:`keep_known`)."""
        return self.field_to(name, f"{self.name}:{name}", recognizer, rule)

    def field_to(
        self, name: str, key: str, recognizer: Recognizer, rule: Rule | None = None
    ) -> Extract:
        """Like :meth:`field`, written to ``key``."""
        where = f"extractor {self.name!r} field {name!r}"
        if type(name) is not str or not name:
            raise ExtractDefinitionError(f"{where}: a field name is a non-empty string")
        if name in self._fields:
            raise ExtractDefinitionError(f"{where}: defined twice")
        if not isinstance(recognizer, Recognizer):
            raise ExtractDefinitionError(f"{where}: expected a recognizer, got {recognizer!r}")
        rule = rule if rule is not None else keep_known()
        if not isinstance(rule, Rule):
            raise ExtractDefinitionError(f"{where}: expected a promotion rule, got {rule!r}")
        try:
            target = check_key(rule.target or key)
        except SlateError as exc:
            raise ExtractDefinitionError(f"{where}: {exc}") from None
        self._fields[name] = Field(name, target, recognizer, rule)
        return self

    def validate(self, pred: Callable[[dict[str, Any]], Any], describe: str = "") -> Extract:
        """Write nothing from a turn unless ``pred(values)`` holds, where ``values`` maps every
        field to what is known after the turn (``None`` when unknown): cross-field checks such
        as "a party of at most 12"."""
        if not callable(pred):
            raise ExtractDefinitionError(f"extractor {self.name!r}: validate takes a callable")
        self._checks.append((pred, describe or getattr(pred, "__name__", "a check")))
        return self

    def window(self, turns: int) -> Extract:
        """Read the last ``turns`` user turns together (default 1: only the newest)."""
        if type(turns) is not int or turns < 1:
            raise ExtractDefinitionError(
                f"extractor {self.name!r}: window takes a number of turns >= 1, got {turns!r}"
            )
        self._window = turns
        return self

    def build(self) -> Extractor:
        """The extractor; raises :class:`ExtractDefinitionError` if it has no field."""
        if not self._fields:
            raise ExtractDefinitionError(f"extractor {self.name!r} has no field")
        return Extractor(self.name, tuple(self._fields.values()), tuple(self._checks), self._window)


class Extractor:
    """Reads its fields from the caller's turns and promotes them into the State."""

    def __init__(
        self,
        name: str,
        fields: tuple[Field, ...],
        checks: tuple[tuple[Callable[[dict[str, Any]], Any], str], ...],
        window: int,
    ) -> None:
        self.name = name
        self.fields = fields
        self.checks = checks
        self.window = window
        self.turns: deque[str] = deque(maxlen=window)
        self.history: list[ExtractionResult] = []
        """Every run's result, oldest first (why each value was or was not written)."""

    def extract(self, state: State, text: str) -> ExtractionResult:
        """Add ``text`` as the newest turn, recognise every field over the window, and write
        the values the rules accept, in one batch."""
        self.turns.append(text)
        heard = " ".join(self.turns)
        found: dict[str, tuple[Field, Any, float]] = {}
        for f in self.fields:
            recognition = f.recognizer.recognize(heard)
            if recognition is not None:
                found[f.name] = (f, recognition.value, recognition.confidence)
        values = {f.name: state.get(f.key) for f in self.fields}
        decisions: list[Decision] = []
        writes: list[tuple[Field, Any, float]] = []
        for f, value, confidence in found.values():
            write, reason = f.rule.decide(state, f.key, value)
            decisions.append(Decision(f.name, f.key, value, confidence, write, reason))
            if write:
                writes.append((f, value, confidence))
        proposed = dict(values)
        proposed.update({f.name: v for f, v, _ in writes})
        for pred, text_ in self.checks:
            if writes and not pred(proposed):
                decisions = [
                    Decision(d.field, d.key, d.value, d.confidence, False, f"validation: {text_}")
                    if d.written
                    else d
                    for d in decisions
                ]
                writes = []
                proposed = values
                break
        if writes:
            with state.transaction():
                for f, value, confidence in writes:
                    state.set(
                        f.key, value, source="extraction", writer=self.name, confidence=confidence
                    )
        result = ExtractionResult(self.name, tuple(decisions), proposed)
        self.history.append(result)
        return result

    def __repr__(self) -> str:
        return f"<Extractor {self.name!r}: {', '.join(f.name for f in self.fields)}>"
