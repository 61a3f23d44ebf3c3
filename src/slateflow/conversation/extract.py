"""Extract: named fields recognised from the caller's words and promoted into the State.

``Extract("booking").field("date", datetime()).field("party_size", integer_near(["people"]))
.build()`` makes an :class:`Extractor`; ``extractor.extract(state, text)`` runs each field's
recognizer over the text (or the last ``window`` turns), asks each field's promotion rule
whether the value may be written, and writes the accepted ones in one batch with provenance
source ``"extraction"``, the extractor's name as writer and each value's confidence.

A ``secret=True`` field (a date of birth, a member id the lookup needs) is the secret path: it
reads the turn as said, before redaction, writes its value to a key made secret, and the words
it was read from are masked (``[redacted date of birth]``) in the transcript, the turn keys and
everything a model or a person sees.
"""

from __future__ import annotations

import contextlib
import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ExtractDefinitionError, FlowDefinitionError, SlateError
from ..flow.steps import OnEnter, run
from ..resolve import Deliver, Mode, Resolver, Scheduling
from ..state import State
from ..state.keys import check_key
from ..state.records import SECRET_MASK
from .promotion import Decision, Promotion, keep_known
from .recognizers import Recognizer

if TYPE_CHECKING:
    from .context import Turn
    from .conversation import Conversation

__all__ = [
    "DEFAULT_MAX_HISTORY",
    "Extract",
    "ExtractionResult",
    "Extractor",
    "Field",
    "Trigger",
    "TurnExtractor",
]


@dataclass(frozen=True, slots=True)
class Field:
    """One field: its ``name``, the ``key`` it is written to, its recognizer and its rule;
    ``secret``: read from the turn as said and masked in it (see the module docs)."""

    name: str
    key: str
    recognizer: Recognizer | None
    rule: Promotion
    secret: bool = False

    @property
    def mask(self) -> str:
        """What the words a secret field was read from become: ``[redacted date of birth]``."""
        words = re.sub(r"[^a-z]+", " ", self.name.lower()).strip() or "value"
        return f"[redacted {words}]"


@dataclass(frozen=True, slots=True)
class ExtractionResult:
    """What one run of an extractor did: a :class:`Decision` per recognised field, and
    ``values``, what is known of every field afterwards (``None`` when still unknown).
    ``error`` says why nothing could be read (an LLM extractor's failed call or bad JSON)."""

    extractor: str
    decisions: tuple[Decision, ...]
    values: dict[str, Any]
    error: str | None = None

    @property
    def written(self) -> dict[str, Any]:
        """The values written to the State by this run, by key."""
        return {d.key: d.value for d in self.decisions if d.written}

    @property
    def complete(self) -> bool:
        """Whether every field is known now."""
        return all(v is not None for v in self.values.values())


@dataclass(frozen=True, slots=True)
class Trigger:
    """When a session runs an extractor: build one with the class methods.

    - ``Trigger.every_turn()`` (the default): after each user turn.
    - ``Trigger.every(n)``: after every ``n``-th user turn (turns ``n``, ``2n``, ...), reading
      the last ``window`` turns, so a slow extractor (an LLM) runs less often.
    - ``Trigger.after_tool()``: after each successful tool call reported with
      ``conversation.tool_ok(tool)``.
    - ``Trigger.on_step_change()``: when a flow of the conversation makes a step active, re-read
      the turns said after that step's posture was handed to the model (none, when it never
      was: a "yes" said before the question was asked is never taken as its answer).
    """

    kind: Literal["every_turn", "every", "after_tool", "on_step_change"]
    n: int = 1

    @classmethod
    def every_turn(cls) -> Trigger:
        """After each user turn."""
        return cls("every_turn")

    @classmethod
    def every(cls, n: int) -> Trigger:
        """After every ``n``-th user turn."""
        if type(n) is not int or n < 1:
            raise ExtractDefinitionError(
                f"Trigger.every(n) takes a number of turns >= 1, got {n!r}"
            )
        return cls("every", n)

    @classmethod
    def after_tool(cls) -> Trigger:
        """After each successful tool call."""
        return cls("after_tool")

    @classmethod
    def on_step_change(cls) -> Trigger:
        """When a flow of the session enters a step."""
        return cls("on_step_change")

    def on_turn(self, number: int) -> bool:
        """Whether this trigger runs its extractor after user turn ``number`` (from 1)."""
        return self.kind == "every_turn" or (self.kind == "every" and number % self.n == 0)


DEFAULT_MAX_HISTORY = 1_000
"""Runs an extractor keeps in ``history`` unless told otherwise."""


class TurnExtractor:
    """What every extractor shares: promotion of found values, triggers, the completion action
    and the session hooks. :class:`Extractor` (recognizers) and ``LLMExtractor`` build on it."""

    def __init__(
        self,
        name: str,
        fields: tuple[Field, ...],
        checks: tuple[tuple[Callable[[dict[str, Any]], Any], str], ...],
        window: int,
        triggers: tuple[Trigger, ...] = (Trigger.every_turn(),),
        completion: OnEnter | None = None,
        max_history: int = DEFAULT_MAX_HISTORY,
    ) -> None:
        if type(max_history) is not int or max_history < 1:
            raise ExtractDefinitionError(
                f"extractor {name!r}: max_history must be a positive int, got {max_history!r}"
            )
        self.name = name
        self.fields = fields
        self.checks = checks
        self.window = window
        self.triggers = triggers
        self.completion = completion
        self.turns: deque[str] = deque(maxlen=window)
        self.history: list[ExtractionResult] = []
        """The last ``max_history`` runs' results, oldest first (why each value was or was not
        written)."""
        self.max_history = max_history
        self._completed = False
        self._secrets: dict[str, tuple[Any, float]] = {}  # read from this turn, not promoted yet

    async def read(self, state: State, turns: Sequence[str]) -> ExtractionResult:
        """Read the fields from ``turns`` (oldest first) and promote them; subclasses say how
        values are found."""
        raise NotImplementedError

    def read_secrets(self, state: State, said: str) -> list[tuple[int, int, str]]:
        """Read the secret fields from ``said`` (the turn before redaction) and return the
        spans to mask, as ``(start, end, mask)``; the values are promoted when the turn is
        taken (:meth:`on_turn`), so a cancelled turn writes nothing."""
        spans: list[tuple[int, int, str]] = []
        self._secrets = {}
        for f in self.fields:
            if not f.secret or f.recognizer is None:
                continue
            found = f.recognizer.recognize_in(said, state)
            if found is None:
                continue
            self._secrets[f.name] = (found.value, found.confidence)
            start, end = _span(f.recognizer, said, found.value, state)
            spans.append((start, end, f.mask))
        return spans

    def _promote_secrets(self, state: State) -> None:
        found, self._secrets = self._secrets, {}
        if not found:
            return
        for f in self.fields:
            if f.name in found and not state.engine.policy.is_secret(f.key):
                state.policy(f.key, secret=True)
        self.promote(state, found)

    def promote(
        self,
        state: State,
        found: dict[str, tuple[Any, float]],
        *,
        writer: str | None = None,
        source: str = "extraction",
    ) -> ExtractionResult:
        """Ask each field's rule about its found ``(value, confidence)``, run the cross-field
        checks, and write the accepted values in one batch (provenance ``source``); the result
        is kept in ``history``."""
        by_name = {f.name: f for f in self.fields}
        values = {f.name: state.get(f.key) for f in self.fields}
        decisions: list[Decision] = []
        writes: list[tuple[Field, Any, float]] = []
        for name, (value, confidence) in found.items():
            f = by_name[name]
            write, reason = f.rule.decide(state, f.key, value)
            decisions.append(Decision(f.name, f.key, value, confidence, write, reason))
            if write:
                writes.append((f, value, confidence))
        proposed = dict(values)
        proposed.update({f.name: v for f, v, _ in writes})
        for pred, text in self.checks:
            if not writes:
                break
            try:
                holds = bool(pred(proposed))
            except Exception as exc:
                # A check that cannot judge the values (None where it wants a number) refuses.
                holds, text = False, f"{text} (it raised {type(exc).__name__}: {exc})"
            if not holds:
                decisions = [
                    Decision(d.field, d.key, d.value, d.confidence, False, f"validation: {text}")
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
                        f.key,
                        value,
                        source=source,
                        writer=writer or self.name,
                        confidence=confidence,
                    )
        secret = {f.name for f in self.fields if f.secret}
        if secret:
            # What was read on the secret path is kept out of the history a person reads.
            decisions = [
                Decision(d.field, d.key, SECRET_MASK, d.confidence, d.written, d.reason)
                if d.field in secret
                else d
                for d in decisions
            ]
            proposed = {
                k: SECRET_MASK if k in secret and v is not None else v for k, v in proposed.items()
            }
        result = ExtractionResult(self.name, tuple(decisions), proposed)
        self.remember(result)
        return result

    def remember(self, result: ExtractionResult) -> None:
        """Add ``result`` to ``history``, dropping the oldest past ``max_history``."""
        history = self.history
        history.append(result)
        if len(history) > self.max_history:
            del history[: len(history) - self.max_history]

    # -- the conversation's hooks (a TurnHook: user_turn, tool_ok, a flow's step change) -------

    def _wants(self, kind: str) -> bool:
        return any(t.kind == kind for t in self.triggers)

    async def on_turn(self, conversation: Conversation, turn: Turn) -> None:
        """A user turn was recorded: promote what the secret fields read from it, and read
        the turns if a trigger says so."""
        self._promote_secrets(conversation.state)
        if any(t.on_turn(turn.number) for t in self.triggers):
            await self._read_in(conversation)

    async def on_tool(self, conversation: Conversation, tool: str) -> None:
        """A tool succeeded: read the turns if triggered ``after_tool``."""
        if self._wants("after_tool"):
            await self._read_in(conversation)

    async def on_step_change(self, conversation: Conversation, since: int) -> None:
        """A flow entered a step whose posture was told after user turn ``since``: re-read the
        turns said after it if triggered ``on_step_change``."""
        if self._wants("on_step_change"):
            # Only what was said after the step's posture reached the model: an answer given
            # before its question was asked is not an answer to it.
            await self._read_in(conversation, since)

    async def _read_in(self, conversation: Conversation, since: int = 0) -> None:
        said = [t for t in conversation.transcript if t.speaker == "user" and t.number > since]
        turns = [t.text for t in said[-self.window :]]
        if not turns:
            return
        result = await self.read(conversation.state, turns)
        complete = result.complete
        if complete and not self._completed and self.completion is not None:
            await _start(conversation, self.completion)
        self._completed = complete


class Extract:
    """Builds an :class:`Extractor` (``Extract(name).field(...)...build()``)."""

    def __init__(self, name: str) -> None:
        if type(name) is not str or not name:
            raise ExtractDefinitionError(f"an extractor name is a non-empty string, got {name!r}")
        self.name = name
        self._fields: dict[str, Field] = {}
        self._checks: list[tuple[Callable[[dict[str, Any]], Any], str]] = []
        self._window = 1
        self._triggers: tuple[Trigger, ...] = (Trigger.every_turn(),)
        self._completion: OnEnter | None = None
        self._max_history = DEFAULT_MAX_HISTORY

    def field(
        self,
        name: str,
        recognizer: Recognizer,
        rule: Promotion | None = None,
        *,
        secret: bool = False,
    ) -> Extract:
        """Recognise field ``name`` with ``recognizer``; it is written to ``{extractor}:{name}``
        (or where ``rule.to(key)`` says) under ``rule`` (default :func:`keep_known`).

        ``secret=True``: the secret path. The field reads each turn as said (before
        redaction, so a masked phone number or member id can still be read), its key is made
        secret (``state.policy(key, secret=True)``: masked in logs, snapshots, prompts and
        replays) and the words the value was read from are masked in the transcript and in
        ``turn:user`` as ``[redacted <field name>]``. Provenance and promotion rules apply as
        for any field; it reads only the newest turn, on every turn, whatever the triggers.
        """
        return self.field_to(name, f"{self.name}:{name}", recognizer, rule, secret=secret)

    def field_to(
        self,
        name: str,
        key: str,
        recognizer: Recognizer,
        rule: Promotion | None = None,
        *,
        secret: bool = False,
    ) -> Extract:
        """Like :meth:`field`, written to ``key``."""
        where = f"extractor {self.name!r} field {name!r}"
        if not isinstance(recognizer, Recognizer):
            raise ExtractDefinitionError(f"{where}: expected a recognizer, got {recognizer!r}")
        if type(secret) is not bool:
            raise ExtractDefinitionError(f"{where}: secret is True or False, got {secret!r}")
        made = make_field(self.name, self._fields, name, key, recognizer, rule)
        self._fields[name] = replace(made, secret=secret)
        return self

    def validate(self, pred: Callable[[dict[str, Any]], Any], describe: str = "") -> Extract:
        """Write nothing from a turn unless ``pred(values)`` holds, where ``values`` maps every
        field to what is known after the turn (``None`` when unknown): cross-field checks such
        as "a party of at most 12"."""
        self._checks.append(make_check(self.name, pred, describe))
        return self

    def window(self, turns: int) -> Extract:
        """Read the last ``turns`` user turns together (default 1: only the newest)."""
        self._window = check_window(self.name, turns)
        return self

    def keep_history(self, runs: int) -> Extract:
        """Keep the results of the last ``runs`` runs in ``history`` (default 1,000)."""
        if type(runs) is not int or runs < 1:
            raise ExtractDefinitionError(
                f"extractor {self.name!r}: keep_history takes a positive int, got {runs!r}"
            )
        self._max_history = runs
        return self

    def trigger(self, *triggers: Trigger) -> Extract:
        """When a session runs this extractor (default ``Trigger.every_turn()``); several
        triggers add up."""
        self._triggers = check_triggers(self.name, triggers)
        return self

    def on_complete(
        self,
        resolver: Resolver,
        mode: Mode = "dispatch",
        *,
        scheduling: Scheduling | str = Scheduling.WHEN_IDLE,
        deliver: Deliver | None = None,
    ) -> Extract:
        """Start ``resolver`` in ``mode`` (``"call"``, ``"dispatch"`` or ``"background"``) in the
        session when every field becomes known; again only after a field was lost and found.

        In ``"call"`` mode the turn waits for it, so the flows see its result on that turn.
        """
        self._completion = check_completion(self.name, resolver, mode, scheduling, deliver)
        return self

    def build(self) -> Extractor:
        """The extractor; raises :class:`ExtractDefinitionError` if it has no field."""
        if not self._fields:
            raise ExtractDefinitionError(f"extractor {self.name!r} has no field")
        return Extractor(
            self.name,
            tuple(self._fields.values()),
            tuple(self._checks),
            self._window,
            self._triggers,
            self._completion,
            self._max_history,
        )


# -- checks shared by the builders ------------------------------------------------------------


def make_field(
    extractor: str,
    known: dict[str, Field],
    name: str,
    key: str,
    recognizer: Recognizer | None,
    rule: Promotion | None,
) -> Field:
    """A checked :class:`Field` (for extractor builders)."""
    where = f"extractor {extractor!r} field {name!r}"
    if type(name) is not str or not name:
        raise ExtractDefinitionError(f"{where}: a field name is a non-empty string")
    if name in known:
        raise ExtractDefinitionError(f"{where}: defined twice")
    rule = rule if rule is not None else keep_known()
    if not isinstance(rule, Promotion):
        raise ExtractDefinitionError(f"{where}: expected a promotion rule, got {rule!r}")
    try:
        target = check_key(rule.target or key)
    except SlateError as exc:
        raise ExtractDefinitionError(f"{where}: {exc}") from None
    for other in known.values():
        if other.key == target:
            raise ExtractDefinitionError(
                f"{where}: writes {target!r} like field {other.name!r}; give each field its own key"
            )
    return Field(name, target, recognizer, rule)


def make_check(
    extractor: str, pred: Callable[[dict[str, Any]], Any], describe: str
) -> tuple[Callable[[dict[str, Any]], Any], str]:
    """A checked cross-field validation (for extractor builders)."""
    if not callable(pred):
        raise ExtractDefinitionError(f"extractor {extractor!r}: validate takes a callable")
    return pred, describe or getattr(pred, "__name__", "a check")


def check_window(extractor: str, turns: object) -> int:
    """A checked window size (for extractor builders)."""
    if type(turns) is not int or turns < 1:
        raise ExtractDefinitionError(
            f"extractor {extractor!r}: window takes a number of turns >= 1, got {turns!r}"
        )
    return turns


def check_triggers(extractor: str, triggers: tuple[object, ...]) -> tuple[Trigger, ...]:
    """Checked triggers (for extractor builders)."""
    if not triggers or not all(isinstance(t, Trigger) for t in triggers):
        raise ExtractDefinitionError(
            f"extractor {extractor!r}: trigger() takes one or more Trigger values such as "
            f"Trigger.every(2), got {triggers!r}"
        )
    return tuple(dict.fromkeys(triggers))  # type: ignore[arg-type]


def check_completion(
    extractor: str,
    resolver: Resolver,
    mode: Mode,
    scheduling: Scheduling | str,
    deliver: Deliver | None,
) -> OnEnter:
    """A checked completion action (for extractor builders)."""
    try:
        return run(resolver, mode, scheduling=scheduling, deliver=deliver)
    except FlowDefinitionError as exc:
        raise ExtractDefinitionError(f"extractor {extractor!r}: on_complete: {exc}") from None


class Extractor(TurnExtractor):
    """Reads its fields from the caller's turns with recognizers and promotes them into the
    State. Attach it to a call (``call.add_extractor``) or call :meth:`extract`."""

    fields: tuple[Field, ...]

    def extract(self, state: State, text: str) -> ExtractionResult:
        """Add ``text`` as the newest turn, recognise every field over the window, and write
        the values the rules accept, in one batch."""
        self.turns.append(text)
        return self.promote(state, self.recognize(" ".join(self.turns), state))

    def recognize(self, heard: str, state: State | None = None) -> dict[str, tuple[Any, float]]:
        """``(value, confidence)`` of each field the recognizers find in ``heard`` (with the
        ``state`` for recognizers that read it, such as ``choice("slots:result")``)."""
        found: dict[str, tuple[Any, float]] = {}
        for f in self.fields:
            if f.recognizer is None or f.secret:
                continue  # a secret field reads the turn as said (read_secrets)
            recognition = (
                f.recognizer.recognize(heard)
                if state is None
                else f.recognizer.recognize_in(heard, state)
            )
            if recognition is not None:
                found[f.name] = (recognition.value, recognition.confidence)
        return found

    async def read(self, state: State, turns: Sequence[str]) -> ExtractionResult:
        """Read the fields in ``turns`` (oldest first) and promote them into ``state``; never
        raises for a reply it cannot use (the result says what failed)."""
        return self.promote(state, self.recognize(" ".join(turns), state))

    def __repr__(self) -> str:
        return f"<Extractor {self.name!r}: {', '.join(f.name for f in self.fields)}>"


def _span(recognizer: Recognizer, said: str, value: Any, state: State) -> tuple[int, int]:
    """The shortest run of words in ``said`` the recognizer still reads ``value`` from: the
    words to mask."""
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", said)]
    if not words:
        return 0, len(said)

    def reads(a: int, b: int) -> bool:
        found = recognizer.recognize_in(said[words[a][0] : words[b][1]], state)
        return found is not None and found.value == value

    lo, hi = 0, len(words) - 1
    while lo < hi and reads(lo + 1, hi):
        lo += 1
    while hi > lo and reads(lo, hi - 1):
        hi -= 1
    return words[lo][0], words[hi][1]


async def _start(conversation: Conversation, action: OnEnter) -> None:
    """Start an extractor's completion action in the conversation's session, in its mode
    (background outcomes go to the conversation unless the action names a ``deliver``)."""
    session = conversation.session
    if action.mode == "call":
        with contextlib.suppress(SlateError):
            # Its outcome is in the state (<name>:result or <name>:error) either way.
            await session.call(action.resolver)
    elif action.mode == "dispatch":
        session.dispatch(action.resolver)
    else:
        deliver = action.deliver if action.deliver is not None else conversation.deliver
        session.background(action.resolver, deliver, action.scheduling)
