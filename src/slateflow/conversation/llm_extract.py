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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import ExtractDefinitionError
from ..flow.steps import OnEnter
from ..resolve.llm import LLM, LLMRequest
from ..state import State
from .extract import (
    ExtractionResult,
    Field,
    Trigger,
    TurnExtractor,
    check_triggers,
    check_window,
    make_check,
    make_field,
)
from .promotion import Rule

__all__ = ["LLMExtractor"]

log = logging.getLogger("slateflow.conversation")

SYSTEM = (
    "You extract facts from a phone or chat conversation. Answer with one JSON object and "
    "nothing else. Use exactly the field names given. Give a field only what the caller said "
    "or clearly meant; use null for anything they did not say. Do not guess."
)

_Check = Callable[[dict[str, Any]], Any]


def _json_object(text: str) -> Any:
    """The first JSON object in ``text`` (bare, in a ```json fence, or with words around it)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("there is no JSON object in it")
    obj, _ = json.JSONDecoder().raw_decode(text[start:])
    return obj


class LLMExtractor(TurnExtractor):
    """Reads the fields of ``model`` (a pydantic model whose fields all default, usually to
    None) from the caller's turns by asking ``llm``; attach it with ``session.add_extractor``
    or call ``await extractor.extract(state, text)``.

    - ``rules``: a promotion rule per field (default :func:`keep_known`); ``keys``: where a
      field is written (default ``{name}:{field}``; a rule's ``.to(key)`` wins).
    - ``window``, ``triggers``, ``validate`` and ``on_complete`` work as for ``Extract``
      (``Trigger.every(2)`` keeps a slow model off every turn).
    - ``instructions`` are added to the prompt; ``confidence`` is recorded with each value (an
      LLM gives none of its own); ``llm_model`` is passed as the request's model.

    A failed call, a reply that is not a JSON object, or one the model rejects writes nothing:
    the run's result carries the ``error`` (also logged) and the turn goes on.
    """

    def __init__(
        self,
        name: str,
        llm: LLM,
        model: type[BaseModel],
        *,
        rules: Mapping[str, Rule] | None = None,
        keys: Mapping[str, str] | None = None,
        window: int = 1,
        triggers: Iterable[Trigger] = (Trigger.every_turn(),),
        validate: Iterable[_Check | tuple[_Check, str]] = (),
        on_complete: OnEnter | None = None,
        instructions: str | None = None,
        confidence: float = 0.8,
        llm_model: str | None = None,
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
        rules = dict(rules or {})
        keys = dict(keys or {})
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
        fields: dict[str, Field] = {}
        for field in model.model_fields:
            key = keys.get(field, f"{name}:{field}")
            fields[field] = make_field(name, fields, field, key, None, rules.get(field))
        checks = tuple(
            make_check(name, *(c if isinstance(c, tuple) else (c, ""))) for c in validate
        )
        super().__init__(
            name,
            tuple(fields.values()),
            checks,
            check_window(name, window),
            check_triggers(name, tuple(triggers)),
            on_complete,
        )
        self.llm = llm
        self.model = model
        self.instructions = instructions
        self.confidence = float(confidence)
        self.llm_model = llm_model
        self.requests: list[LLMRequest] = []
        """Every request sent, oldest first."""

    # -- the request ---------------------------------------------------------------------------

    def _describe_field(self, name: str) -> str:
        info = self.model.model_fields[name]
        schema = self.model.model_json_schema().get("properties", {}).get(name, {})
        kind = schema.get("type") or " or ".join(
            str(s.get("type")) for s in schema.get("anyOf", []) if s.get("type") != "null"
        )
        line = f"- {name}" + (f" ({kind})" if kind else "")
        return line + (f": {info.description}" if info.description else "")

    def request(self, state: State, turns: Sequence[str]) -> LLMRequest:
        """The request this extractor would send for ``turns`` now (a test can read it)."""
        lines = ["Fields:"]
        lines += [self._describe_field(f.name) for f in self.fields]
        known = []
        for f in self.fields:
            if state.contains(f.key):
                shown = (
                    "(known, secret)"
                    if state.is_secret(f.key)
                    else json.dumps(state.get(f.key), ensure_ascii=False, default=str)
                )
                known.append(f"- {f.name}: {shown}")
        if known:
            lines += ["", "Already known (give a field again only if the caller changes it):"]
            lines += known
        if self.instructions:
            lines += ["", self.instructions]
        lines += ["", "Conversation, oldest first:"]
        lines += [f"Caller: {t}" for t in turns]
        lines += ["", "Answer with one JSON object with exactly these fields: "]
        lines[-1] += ", ".join(f.name for f in self.fields) + "."
        return LLMRequest(
            prompt="\n".join(lines), system=SYSTEM, temperature=0.0, model=self.llm_model
        )

    # -- reading -------------------------------------------------------------------------------

    async def extract(self, state: State, text: str) -> ExtractionResult:
        """Add ``text`` as the newest turn, ask the LLM over the window, promote its answer."""
        self.turns.append(text)
        return await self.read(state, list(self.turns))

    async def read(self, state: State, turns: Sequence[str]) -> ExtractionResult:
        request = self.request(state, turns)
        self.requests.append(request)
        try:
            response = await self.llm.generate(request)
        except Exception as exc:
            return self._failed(state, f"the LLM call failed: {type(exc).__name__}: {exc}")
        try:
            parsed = self.model.model_validate(_json_object(response.text))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}"
                for e in exc.errors()
            )
            return self._failed(state, f"the LLM's reply does not fit the fields: {problems}")
        except ValueError as exc:
            return self._failed(state, f"the LLM's reply is not a JSON object: {exc}")
        values = parsed.model_dump(mode="json")
        found = {
            f.name: (values[f.name], self.confidence)
            for f in self.fields
            if values.get(f.name) is not None
        }
        return self.promote(state, found)

    def _failed(self, state: State, why: str) -> ExtractionResult:
        message = f"extractor {self.name!r}: {why}"
        log.warning("%s; nothing was written", message)
        values = {f.name: state.get(f.key) for f in self.fields}
        result = ExtractionResult(self.name, (), values, error=message)
        self.history.append(result)
        return result

    def __repr__(self) -> str:
        return f"<LLMExtractor {self.name!r}: {', '.join(f.name for f in self.fields)}>"
