"""LLMExtractor: fields asked of an LLM as JSON, validated by pydantic, promoted by the rules."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

from slateflow import ManualClock, Resolver, Session, State, run
from slateflow.conversation import LLMExtractor, Trigger, keep_known, overwrite, true_only
from slateflow.errors import ExtractDefinitionError
from slateflow.testing import ScriptedLLM

pytestmark = pytest.mark.anyio


class Booking(BaseModel):
    date: str | None = Field(default=None, description="the day, e.g. Saturday")
    party_size: int | None = Field(default=None, description="how many people")
    confirmed: bool | None = None


def booking(llm: ScriptedLLM, **options: Any) -> LLMExtractor:
    return LLMExtractor("booking", llm, Booking, **options)


async def test_fields_are_written_with_provenance() -> None:
    llm = ScriptedLLM(['{"date": "Saturday", "party_size": 4, "confirmed": null}'])
    state = State()
    result = await booking(llm).extract(state, "Saturday, four of us")
    assert state.pick("booking:date", "booking:party_size") == {
        "booking:date": "Saturday",
        "booking:party_size": 4,
    }
    assert not state.contains("booking:confirmed")  # null: not said, not written
    prov = state.provenance("booking:party_size")
    assert prov is not None
    assert (prov.source, prov.writer, prov.confidence) == ("extraction", "booking", 0.8)
    assert result.written == {"booking:date": "Saturday", "booking:party_size": 4}
    assert result.values == {"date": "Saturday", "party_size": 4, "confirmed": None}
    assert result.error is None


async def test_the_request_lists_the_fields_the_known_values_and_the_turns() -> None:
    llm = ScriptedLLM(['{"party_size": 5}'])
    state = State()
    state.set("booking:date", "Friday")
    state.set("booking:card", "4111")
    state.policy("booking:card", secret=True)

    class WithCard(Booking):
        card: str | None = None

    extractor = LLMExtractor(
        "booking", llm, WithCard, window=2, instructions="Party sizes are whole numbers."
    )
    await extractor.extract(state, "first turn")
    await extractor.extract(state, "hello")  # the LLM's script is exhausted: an error result
    llm.add('{"party_size": 5}')
    await extractor.extract(state, "five of us")
    request = llm.last_request
    assert request.temperature == 0.0
    assert request.system is not None
    assert "JSON object" in request.system
    assert "- party_size (integer): how many people" in request.prompt
    assert "- date: \"Friday\"" in request.prompt
    assert "- card: (known, secret)" in request.prompt
    assert "4111" not in request.prompt
    assert "Party sizes are whole numbers." in request.prompt
    assert "Caller: hello\nCaller: five of us" in request.prompt
    assert "first turn" not in request.prompt  # outside the window of 2
    assert state.get("booking:party_size") == 5


async def test_a_fenced_or_chatty_reply_is_read() -> None:
    llm = ScriptedLLM(['Sure! ```json\n{"date": "Monday"}\n``` Anything else?'])
    state = State()
    await booking(llm).extract(state, "monday")
    assert state.get("booking:date") == "Monday"


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("I could not tell.", "is not a JSON object"),
        ('["Saturday"]', "is not a JSON object"),
        ('{"party_size": "many"}', "does not fit the fields: party_size"),
        ('{"date": "Saturday", "party_size": ', "is not a JSON object"),
        (RuntimeError("model overloaded"), "the LLM call failed: RuntimeError: model overloaded"),
    ],
    ids=["prose", "array", "wrong type", "truncated", "call raised"],
)
async def test_a_bad_reply_writes_nothing(reply: Any, why: str) -> None:
    llm = ScriptedLLM([reply])
    state = State()
    state.set("booking:date", "Friday")
    before = state.snapshot()
    extractor = booking(llm)
    result = await extractor.extract(state, "Saturday for four")
    assert state.snapshot() == before
    assert result.error is not None
    assert result.error.startswith("extractor 'booking': ")
    assert why in result.error
    assert result.decisions == ()
    assert result.values == {"date": "Friday", "party_size": None, "confirmed": None}
    assert extractor.history == [result]


async def test_promotion_rules_decide_as_for_recognizers() -> None:
    llm = ScriptedLLM(
        [
            '{"date": "Saturday", "party_size": 4, "confirmed": true}',
            '{"date": "Sunday", "party_size": 6, "confirmed": false}',
        ]
    )
    state = State()
    extractor = booking(
        llm,
        rules={
            "date": keep_known(),
            "party_size": overwrite().to("party:size"),
            "confirmed": true_only(),
        },
    )
    await extractor.extract(state, "Saturday, four, yes")
    second = await extractor.extract(state, "Sunday, six, no")
    assert state.get("booking:date") == "Saturday"
    assert state.get("party:size") == 6
    assert state.get("booking:confirmed") is True
    reasons = {d.field: (d.written, d.reason) for d in second.decisions}
    assert reasons == {
        "date": (False, "keep_known: 'booking:date' is already known ('Saturday')"),
        "party_size": (True, "overwrite: overwrites"),
        "confirmed": (False, "true_only: False is not true"),
    }


async def test_accept_when_and_validate() -> None:
    llm = ScriptedLLM(['{"party_size": 40}', '{"party_size": 4, "confirmed": true}'])
    state = State()
    extractor = booking(
        llm,
        rules={"confirmed": true_only().accept_when(lambda v, s: s.get("asked"), "asked")},
        validate=[(lambda v: (v["party_size"] or 0) <= 12, "at most 12 people")],
    )
    too_many = await extractor.extract(state, "forty of us")
    assert [d.reason for d in too_many.decisions] == ["validation: at most 12 people"]
    assert not state.contains("booking:party_size")
    result = await extractor.extract(state, "four then, yes")
    assert state.get("booking:party_size") == 4
    assert not state.contains("booking:confirmed")
    assert {d.field: d.reason for d in result.decisions}["confirmed"] == (
        "not accepted: asked does not hold"
    )


async def test_in_a_session_with_triggers_and_on_complete() -> None:
    llm = ScriptedLLM(['{"date": "Saturday"}', '{"party_size": 2}'])
    calls: list[dict[str, Any]] = []

    async def lookup(state: State) -> bool:
        calls.append(state.pick("booking:date", "booking:party_size"))
        return True

    class Slot(BaseModel):
        date: str | None = None
        party_size: int | None = None

    extractor = LLMExtractor(
        "booking",
        llm,
        Slot,
        window=2,
        triggers=[Trigger.every(2)],
        on_complete=run(Resolver.function("lookup", lookup), "call"),
    )
    state = State()
    async with Session(state, clock=ManualClock()) as session:
        session.add_extractor(extractor)
        await session.user_turn("Saturday")
        assert llm.requests == []  # every 2nd turn only
        await session.user_turn("for two, card 4111 1111 1111 1111")
        assert "Caller: Saturday\nCaller: for two, card [card ending 1111]" in (
            llm.last_request.prompt
        )
        assert state.get("booking:date") == "Saturday"
        await session.user_turn("hmm")
        await session.user_turn("two people")
        assert state.get("booking:party_size") == 2
        assert calls == [{"booking:date": "Saturday", "booking:party_size": 2}]
        assert state.get("lookup:result") is True


def test_definition_errors_name_the_problem() -> None:
    llm = ScriptedLLM()

    class Required(BaseModel):
        date: str

    class Empty(BaseModel):
        model_config = ConfigDict(extra="forbid")

    cases: list[tuple[Any, str]] = [
        (lambda: LLMExtractor("b", llm, Required), "date of Required have no default"),
        (lambda: LLMExtractor("b", llm, Empty), "has no field"),
        (lambda: LLMExtractor("b", llm, dict), "must be a pydantic model"),  # type: ignore[arg-type]
        (lambda: LLMExtractor("b", object(), Booking), "async def generate"),  # type: ignore[arg-type]
        (
            lambda: LLMExtractor("b", llm, Booking, rules={"day": overwrite()}),
            "rules name unknown field(s) day",
        ),
        (lambda: LLMExtractor("b", llm, Booking, keys={"x": "y"}), "keys name unknown field(s) x"),
        (lambda: LLMExtractor("b", llm, Booking, window=0), "window"),
        (lambda: LLMExtractor("b", llm, Booking, confidence=2), "confidence"),
        (lambda: LLMExtractor("", llm, Booking), "non-empty string"),
        (lambda: LLMExtractor("b", llm, Booking, keys={"date": "bad key"}), "field 'date'"),
    ]
    for make, message in cases:
        with pytest.raises(ExtractDefinitionError) as raised:
            make()
        assert message in str(raised.value)


optional_values = st.fixed_dictionaries(
    {
        "date": st.none() | st.text(min_size=1, max_size=12),
        "party_size": st.none() | st.integers(min_value=-5, max_value=500),
        "confirmed": st.none() | st.booleans(),
    }
)


@settings(deadline=None, max_examples=80)
@given(reply=optional_values)
def test_exactly_the_non_null_fields_are_written(reply: dict[str, Any]) -> None:
    async def main() -> tuple[State, Any]:
        state = State()
        result = await booking(ScriptedLLM([json.dumps(reply)])).extract(state, "...")
        return state, result

    for backend in ("asyncio", "trio"):
        state, result = anyio.run(main, backend=backend)
        expected = {f"booking:{k}": v for k, v in reply.items() if v is not None}
        assert state.pick(*expected) == expected
        assert sorted(state.keys("booking:")) == sorted(expected)
        assert result.written == expected
