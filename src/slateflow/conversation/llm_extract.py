"""LLMExtractor: the fields of a record asked of an LLM as one JSON object.

Where a recognizer cannot cope (free-form requests, several facts in one breath, corrections),
an LLM can. ``LLMExtractor("booking", llm, Booking)`` asks ``llm`` for a JSON object with the
fields of the pydantic model ``Booking`` (``null`` for what the caller did not say), telling it
which fields are already known; the reply is validated by the model and each value goes through
the same promotion rules as a recognizer's, with provenance source ``"extraction"``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

from pydantic import AliasChoices, BaseModel, ValidationError

from ..errors import ExtractDefinitionError, SlateError
from ..flow.steps import OnEnter
from ..resolve.llm import LLM, LLMRequest, call_model
from ..state import State
from .extract import (
    DEFAULT_MAX_HISTORY,
    ExtractionResult,
    Field,
    Trigger,
    TurnExtractor,
    check_triggers,
    check_window,
    make_check,
    make_field,
)
from .promotion import Promotion

__all__ = ["LLMExtractor"]

log = logging.getLogger("slateflow.conversation")

SYSTEM = (
    "You extract facts from a phone or chat conversation. Answer with one JSON object and "
    "nothing else. Use exactly the field names given. Give a field only what the caller said "
    "or clearly meant; use null for anything they did not say. Do not guess."
)
"""The system text of every request."""

_Check = Callable[[dict[str, Any]], Any]

_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\r?\n?(.*?)```", re.DOTALL)
_MAX_CANDIDATES = 32  # '{' positions tried in a chatty reply before giving up


class _NotAnObject(ValueError):
    """The reply holds no JSON object."""


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def _json_object(text: str) -> dict[str, Any]:
    """The JSON object in ``text``: all of it, the first ```json fence, or else the first
    ``{...}`` that parses among words around it. Raises :class:`_NotAnObject` saying why."""
    candidates = [text.strip()] + [m.group(1).strip() for m in _FENCE.finditer(text)]
    for candidate in candidates:
        try:
            value = _DECODER.decode(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
        raise _NotAnObject(f"it is {_json_kind(value)}")
    first_error: str | None = None
    start = text.find("{")
    tries = 0
    while start >= 0 and tries < _MAX_CANDIDATES:
        tries += 1
        try:
            value, _ = _DECODER.raw_decode(text, start)
        except ValueError as exc:
            first_error = first_error or str(exc)
        else:
            return value  # type: ignore[no-any-return]  # raw_decode at '{' is an object
        start = text.find("{", start + 1)
    if first_error is None:
        raise _NotAnObject("there is no JSON object in it")
    raise _NotAnObject(f"no complete JSON object in it ({first_error})")


def _json_name(name: str, model: type[BaseModel]) -> str:
    """The name a field has in JSON (its validation alias, else its alias, else its name)."""
    info = model.model_fields[name]
    alias = info.validation_alias
    if isinstance(alias, AliasChoices) and alias.choices and isinstance(alias.choices[0], str):
        return alias.choices[0]
    if isinstance(alias, str):
        return alias
    return info.alias or name


def _type_text(schema: Mapping[str, Any], defs: Mapping[str, Any], depth: int = 0) -> str:
    """A short type for a field's JSON schema: ``integer``, ``string (date)``, ``one of "a",
    "b"``, ``array of string``; empty when the schema says nothing useful."""
    if depth > 4:
        return ""
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = defs.get(ref.removeprefix("#/$defs/"), {})
        return _type_text(target, defs, depth + 1) if isinstance(target, Mapping) else ""
    if "enum" in schema and isinstance(schema["enum"], list):
        return "one of " + ", ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    if "const" in schema:
        return "exactly " + json.dumps(schema["const"], ensure_ascii=False)
    for union in ("anyOf", "oneOf"):
        if isinstance(schema.get(union), list):
            parts = [
                _type_text(s, defs, depth + 1)
                for s in schema[union]
                if isinstance(s, Mapping) and s.get("type") != "null"
            ]
            return " or ".join(dict.fromkeys(p for p in parts if p))
    kind = schema.get("type")
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        items = _type_text(schema["items"], defs, depth + 1)
        return f"array of {items}" if items else "array"
    if isinstance(kind, str):
        fmt = schema.get("format")
        return f"{kind} in {fmt} format" if isinstance(fmt, str) else kind
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind if k != "null")
    return ""


class LLMExtractor(TurnExtractor):
    """Reads the fields of ``model`` (a pydantic model whose fields all have a default, usually
    None) from the caller's turns by asking ``llm``; attach it with ``call.add_extractor``
    or call ``await extractor.extract(state, text)``.

    - ``rules``: a promotion rule per field (default :func:`keep_known`); ``keys``: where a
      field is written (default ``{name}:{field}``; a rule's ``.to(key)`` wins).
    - ``window``, ``triggers``, ``validate`` (callables, or ``(callable, description)``) and
      ``on_complete`` (``run(resolver, mode)``) work as for ``Extract``
      (``Trigger.every(2)`` keeps a slow model off every turn).
    - ``instructions`` are added to the prompt; ``confidence`` is recorded with each value (an
      LLM gives none of its own); ``llm_model`` is passed as the request's model;
      ``max_history`` runs are kept in ``history`` (default 1,000).

    The prompt lists each field with its type and ``description``, the values already known
    (a secret key's value is never shown) and the window of turns. Only the fields the reply
    gives a value other than null are promoted: a field's default is never written, and a
    field need not accept None. Keys that are not fields are ignored unless the model forbids
    extras. Values are written as ``model_dump(mode="json")`` gives them (a date as text).

    A failed call, a reply that is not a JSON object, one the model rejects, or values the
    State refuses (a declared type, a policy) write nothing: the run's result carries the
    ``error`` (also logged as a warning) and the turn goes on. Cancellation propagates.
    """

    def __init__(
        self,
        name: str,
        llm: LLM,
        model: type[BaseModel],
        *,
        rules: Mapping[str, Promotion] | None = None,
        keys: Mapping[str, str] | None = None,
        window: int = 1,
        triggers: Iterable[Trigger] = (Trigger.every_turn(),),
        validate: Iterable[_Check | tuple[_Check, str]] = (),
        on_complete: OnEnter | None = None,
        instructions: str | None = None,
        confidence: float = 0.8,
        llm_model: str | None = None,
        max_history: int = DEFAULT_MAX_HISTORY,
    ) -> None:
        if type(name) is not str or not name:
            raise ExtractDefinitionError(f"an extractor name is a non-empty string, got {name!r}")
        where = f"extractor {name!r}"
        if not isinstance(llm, LLM):
            raise ExtractDefinitionError(
                f"{where}: llm must have `async def generate(request)`, got {llm!r}"
            )
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise ExtractDefinitionError(f"{where}: model must be a pydantic model, got {model!r}")
        if not model.model_fields:
            raise ExtractDefinitionError(f"{where}: model {model.__name__} has no field")
        required = [f for f, info in model.model_fields.items() if info.is_required()]
        if required:
            raise ExtractDefinitionError(
                f"{where}: field(s) {', '.join(required)} of {model.__name__} have no default; "
                "give every field a default (usually None): the caller may not have said it"
            )
        rules = _table(where, "rules", rules)
        keys = _table(where, "keys", keys)
        for what, table in (("rules", rules), ("keys", keys)):
            unknown = sorted(set(table) - set(model.model_fields))
            if unknown:
                raise ExtractDefinitionError(
                    f"{where}: {what} name unknown field(s) {', '.join(unknown)}; "
                    f"the fields of {model.__name__}: {', '.join(model.model_fields)}"
                )
        if type(confidence) not in (int, float) or not 0 <= confidence <= 1:
            raise ExtractDefinitionError(
                f"{where}: confidence must be in [0, 1], got {confidence!r}"
            )
        if on_complete is not None and not isinstance(on_complete, OnEnter):
            raise ExtractDefinitionError(
                f"{where}: on_complete takes run(resolver, mode), got {on_complete!r}"
            )
        for option, given in (("instructions", instructions), ("llm_model", llm_model)):
            if given is not None and type(given) is not str:
                raise ExtractDefinitionError(f"{where}: {option} is text, got {given!r}")
        fields: dict[str, Field] = {}
        for field in model.model_fields:
            key = keys.get(field, f"{name}:{field}")
            fields[field] = make_field(name, fields, field, key, None, rules.get(field))
        if isinstance(triggers, Trigger):
            triggers = (triggers,)
        super().__init__(
            name,
            tuple(fields.values()),
            _checks(name, validate),
            check_window(name, window),
            check_triggers(name, tuple(triggers)),
            on_complete,
            max_history,
        )
        self.llm = llm
        self.model = model
        self.instructions = instructions
        self.confidence = float(confidence)
        self.llm_model = llm_model
        self.last_request: LLMRequest | None = None
        """The newest request sent (None before the first)."""
        self._json_names = {f: _json_name(f, model) for f in model.model_fields}
        self._field_lines = _field_lines(model, self._json_names)

    # -- the request ---------------------------------------------------------------------------

    def request(self, state: State, turns: Sequence[str]) -> LLMRequest:
        """The request this extractor would send for ``turns`` (oldest first) now."""
        lines = ["Fields:", *self._field_lines]
        known = []
        for f in self.fields:
            value = state.get(f.key)
            if value is None:  # not known (as in an ExtractionResult's values)
                continue
            shown = (
                "(known, secret)"
                if state.is_secret(f.key)
                else json.dumps(value, ensure_ascii=False, default=str)  # State values are JSON
            )
            known.append(f"- {self._json_names[f.name]}: {shown}")
        if known:
            lines += ["", "Already known (give a field again only if the caller changes it):"]
            lines += known
        if self.instructions:
            lines += ["", self.instructions]
        lines += ["", "Conversation, oldest first:"]
        lines += [f"Caller: {t}" for t in turns]
        names = ", ".join(self._json_names[f.name] for f in self.fields)
        lines += ["", f"Answer with one JSON object with exactly these fields: {names}."]
        return LLMRequest(
            prompt="\n".join(lines), system=SYSTEM, temperature=0.0, model=self.llm_model
        )

    # -- reading -------------------------------------------------------------------------------

    async def extract(self, state: State, text: str) -> ExtractionResult:
        """Add ``text`` as the newest turn, ask the LLM over the window, promote its answer."""
        self.turns.append(text)
        return await self.read(state, list(self.turns))

    async def read(self, state: State, turns: Sequence[str]) -> ExtractionResult:
        """Ask the LLM for the fields in ``turns`` (oldest first) and promote its answer; never
        raises for a failed call or a bad reply (the result's ``error`` says what failed)."""
        request = self.request(state, turns)
        self.last_request = request
        try:
            response = await call_model(self.llm, request)
        except Exception as exc:
            return self._failed(state, f"the LLM call failed: {type(exc).__name__}: {exc}")
        try:
            found = self.parse(response.text)
        except _NotAnObject as exc:
            return self._failed(state, f"the LLM's reply is not a JSON object: {exc}")
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
            )
            return self._failed(state, f"the LLM's reply does not fit the fields: {problems}")
        except Exception as exc:
            return self._failed(
                state,
                f"model {self.model.__name__} failed on the reply: {type(exc).__name__}: {exc}",
            )
        try:
            return self.promote(state, found)
        except SlateError as exc:
            # The batch is one transaction: nothing of it was written.
            return self._failed(state, f"the State refused the values: {exc}")

    def parse(self, text: str) -> dict[str, tuple[Any, float]]:
        """``(value, confidence)`` of each field the reply ``text`` gives a value other than
        null, validated by the model and in JSON form; raises if the reply does not fit."""
        obj = _json_object(text)
        # A null is "not said": drop it before validating (so a field need not accept None),
        # and answer to the field's python name as well as to its alias.
        given = {k: v for k, v in obj.items() if v is not None}
        for field, json_name in self._json_names.items():
            if json_name != field and field in given and json_name not in given:
                given[json_name] = given.pop(field)
        parsed = self.model.model_validate(given)
        said = parsed.model_fields_set
        values = parsed.model_dump(mode="json")
        return {
            f.name: (values[f.name], self.confidence)
            for f in self.fields
            if f.name in said and values.get(f.name) is not None
        }

    def _failed(self, state: State, why: str) -> ExtractionResult:
        message = f"extractor {self.name!r}: {why}"
        log.warning("%s; nothing was written", message)
        values = {f.name: state.get(f.key) for f in self.fields}
        result = ExtractionResult(self.name, (), values, error=message)
        self.remember(result)
        return result

    def __repr__(self) -> str:
        return f"<LLMExtractor {self.name!r}: {', '.join(f.name for f in self.fields)}>"


def _table(where: str, what: str, table: Mapping[str, Any] | None) -> dict[str, Any]:
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise ExtractDefinitionError(f"{where}: {what} maps field names to values, got {table!r}")
    return dict(table)


def _checks(
    extractor: str, validate: Iterable[_Check | tuple[_Check, str]]
) -> tuple[tuple[_Check, str], ...]:
    """The cross-field checks, each made by ``make_check``."""
    if callable(validate) or not isinstance(validate, Iterable) or isinstance(validate, str):
        raise ExtractDefinitionError(
            f"extractor {extractor!r}: validate takes a list of checks (callables or "
            f"(callable, description) pairs), got {validate!r}"
        )
    checks = []
    for check in validate:
        if isinstance(check, tuple):
            if len(check) != 2 or not isinstance(check[1], str):
                raise ExtractDefinitionError(
                    f"extractor {extractor!r}: a validate pair is (callable, description), "
                    f"got {check!r}"
                )
            checks.append(make_check(extractor, check[0], check[1]))
        else:
            checks.append(make_check(extractor, check, ""))
    return tuple(checks)


def _field_lines(model: type[BaseModel], json_names: Mapping[str, str]) -> list[str]:
    """One prompt line per field: its JSON name, its type and its description."""
    try:
        schema = model.model_json_schema()
    except Exception:  # a type with no JSON schema: name and description only
        schema = {}
    properties = schema.get("properties", {})
    defs = schema.get("$defs", {})
    lines = []
    for name, info in model.model_fields.items():
        json_name = json_names[name]
        prop = properties.get(json_name, {})
        kind = _type_text(prop, defs) if isinstance(prop, Mapping) else ""
        description = info.description or (
            prop.get("description") if isinstance(prop, Mapping) else None
        )
        line = f"- {json_name}" + (f" ({kind})" if kind else "")
        lines.append(line + (f": {description}" if description else ""))
    return lines
