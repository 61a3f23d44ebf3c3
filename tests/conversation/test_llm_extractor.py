"""LLMExtractor: fields asked of an LLM as JSON, validated by pydantic, promoted by the rules."""

from __future__ import annotations

import datetime as dt
import enum
import json
import logging
from typing import Any, Literal

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, model_validator

from builders import conversation_on
from slateflow import Resolver, State, run
from slateflow.conversation import Trigger, keep_known, non_empty, overwrite, true_only
from slateflow.conversation.llm_extract import SYSTEM, LLMExtractor
from slateflow.errors import ExtractDefinitionError
from slateflow.resolve.llm import LLMRequest
from slateflow.testing import ScriptedLLM


class Booking(BaseModel):
    date: str | None = Field(default=None, description="the day, e.g. Saturday")
    party_size: int | None = Field(default=None, description="how many people")
    confirmed: bool | None = None


def booking(llm: ScriptedLLM, **options: Any) -> LLMExtractor:
    return LLMExtractor("booking", llm, Booking, **options)


# -- writing ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_fields_are_written_with_provenance() -> None:
    llm = ScriptedLLM(['{"date": "Saturday", "party_size": 4, "confirmed": null}'])
    state = State()
    extractor = booking(llm, confidence=0.7)
    result = await extractor.extract(state, "Saturday, four of us")
    assert state.snapshot()["entries"].keys() == {"booking:date", "booking:party_size"}
    assert state.pick("booking:date", "booking:party_size") == {
        "booking:date": "Saturday",
        "booking:party_size": 4,
    }
    assert "booking:confirmed" not in state  # null: not said, not written
    for key in ("booking:date", "booking:party_size"):
        prov = state.provenance(key)
        assert prov is not None
        assert (prov.source, prov.writer, prov.confidence) == ("extraction", "booking", 0.7)
    assert result.written == {"booking:date": "Saturday", "booking:party_size": 4}
    assert result.values == {"date": "Saturday", "party_size": 4, "confirmed": None}
    assert result.error is None
    assert not result.complete
    assert extractor.history == [result]


@pytest.mark.anyio
async def test_one_batch_one_signal() -> None:
    llm = ScriptedLLM(['{"date": "Saturday", "party_size": 4, "confirmed": true}'])
    state = State()
    seqs: list[int] = []
    state.changed.connect(lambda sender, **kw: seqs.append(state.snapshot()["seq"]), weak=False)
    result = await booking(llm).extract(state, "Saturday for four, yes")
    assert result.complete
    assert len(seqs) == 1  # the three values arrive together


@pytest.mark.anyio
async def test_values_are_written_in_json_form_and_defaults_are_never_written() -> None:
    class Color(enum.Enum):
        RED = "red"
        BLUE = "blue"

    class Order(BaseModel):
        day: dt.date | None = None
        color: Color | None = None
        gift_wrap: bool = False  # a non-None default: written only when the reply says it
        quantity: int = Field(default=1, ge=1)  # does not accept None: a null is "not said"

    llm = ScriptedLLM(
        [
            '{"day": "2026-01-03", "color": "red", "gift_wrap": null, "quantity": null}',
            '{"gift_wrap": false, "quantity": 3}',
        ]
    )
    state = State()
    extractor = LLMExtractor("order", llm, Order)
    first = await extractor.extract(state, "the third, in red")
    assert first.error is None
    assert state.pick("order:day", "order:color") == {
        "order:day": "2026-01-03",
        "order:color": "red",
    }
    assert "order:gift_wrap" not in state
    assert "order:quantity" not in state
    second = await extractor.extract(state, "three, no wrapping")
    assert second.written == {"order:gift_wrap": False, "order:quantity": 3}


@pytest.mark.anyio
async def test_keys_that_are_not_fields_are_ignored_unless_the_model_forbids_them() -> None:
    state = State()
    await booking(ScriptedLLM(['{"date": "Monday", "mood": "happy"}'])).extract(state, "x")
    assert state.keys() == ["booking:date"]

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid")
        date: str | None = None

    state = State()
    result = await LLMExtractor(
        "s", ScriptedLLM(['{"date": "Monday", "mood": "happy"}']), Strict
    ).extract(state, "x")
    assert result.error is not None
    assert "does not fit the fields: mood: Extra inputs are not permitted" in result.error
    assert state.keys() == []


@pytest.mark.anyio
async def test_an_aliased_field_is_asked_by_its_alias_and_read_by_either_name() -> None:
    class Contact(BaseModel):
        first_name: str | None = Field(default=None, alias="firstName")

    llm = ScriptedLLM(['{"firstName": "Ada"}', '{"first_name": "Bo"}'])
    extractor = LLMExtractor("c", llm, Contact, rules={"first_name": overwrite()})
    state = State()
    await extractor.extract(state, "I'm Ada")
    assert "- firstName (string)" in llm.last_request.prompt
    assert "exactly these fields: firstName." in llm.last_request.prompt
    assert state.get("c:first_name") == "Ada"
    await extractor.extract(state, "no, Bo")
    assert '- firstName: "Ada"' in llm.last_request.prompt
    assert state.get("c:first_name") == "Bo"


# -- the request --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_request_lists_the_fields_the_known_values_and_the_turns() -> None:
    llm = ScriptedLLM(["{}"])
    state = State()
    state.set("booking:date", "Friday")
    state.set("booking:card", "4111 1111 1111 1111")
    state.policy("booking:card", secret=True)

    class WithCard(Booking):
        card: str | None = None

    extractor = LLMExtractor(
        "booking",
        llm,
        WithCard,
        window=2,
        instructions="Party sizes are whole numbers.",
        llm_model="small-model",
    )
    await extractor.extract(state, "first turn")
    await extractor.extract(state, "hello")  # the LLM's script is exhausted: an error result
    assert extractor.history[-1].error is not None
    llm.add('{"party_size": 5}')
    await extractor.extract(state, "five of us")
    request = llm.last_request
    assert extractor.last_request == request
    assert request.temperature == 0.0
    assert request.model == "small-model"
    assert request.system == SYSTEM
    assert "one JSON object" in SYSTEM
    assert "null" in SYSTEM
    assert "- date (string): the day, e.g. Saturday" in request.prompt
    assert "- party_size (integer): how many people" in request.prompt
    assert "- confirmed (boolean)\n" in request.prompt
    known = request.prompt.split("Already known")[1].split("\n\n")[0]
    assert '- date: "Friday"' in known
    assert "- card: (known, secret)" in known
    assert "party_size" not in known  # not known yet
    assert "4111" not in request.prompt
    assert "Party sizes are whole numbers." in request.prompt
    assert "Caller: hello\nCaller: five of us" in request.prompt
    assert "first turn" not in request.prompt  # outside the window of 2
    assert request.prompt.rstrip().endswith(
        "exactly these fields: date, party_size, confirmed, card."
    )
    assert state.get("booking:party_size") == 5


def test_known_is_read_where_the_field_is_written() -> None:
    state = State()
    state.set("party:size", 3)
    state.set("booking:party_size", 99)  # not where this extractor writes party_size
    state.set("vault:pin", "1234")
    state.policy("vault:*", secret=True)

    class Slot(BaseModel):
        party_size: int | None = None
        pin: str | None = None

    extractor = LLMExtractor(
        "booking",
        ScriptedLLM(),
        Slot,
        rules={"party_size": keep_known().to("party:size")},
        keys={"pin": "vault:pin"},
    )
    prompt = extractor.request(state, ["hi"]).prompt
    assert "- party_size: 3" in prompt
    assert "99" not in prompt
    assert "- pin: (known, secret)" in prompt
    assert "1234" not in prompt


def test_a_key_holding_none_is_not_told_as_known() -> None:
    state = State()
    state.set("booking:date", None)
    state.set("booking:party_size", 0)  # falsy but known
    prompt = booking(ScriptedLLM()).request(state, ["hi"]).prompt
    known = prompt.split("Already known")[1].split("\n\n")[0]
    assert "- party_size: 0" in known
    assert "date" not in known


@pytest.mark.anyio
async def test_a_field_reset_to_none_can_be_filled_again() -> None:
    state = State()
    state.set("booking:date", None)
    result = await booking(ScriptedLLM(['{"date": "Saturday"}'])).extract(state, "Saturday")
    assert result.written == {"booking:date": "Saturday"}  # None is unknown, so it is written
    assert state.get("booking:date") == "Saturday"


def test_the_request_describes_types() -> None:
    class Color(enum.Enum):
        RED = "red"
        BLUE = "blue"

    class Kinds(BaseModel):
        day: dt.date | None = None
        color: Color | None = Field(default=None, description="the paint")
        size: Literal["S", "M"] | None = None
        tags: list[str] | None = None
        anything: Any = None

    prompt = LLMExtractor("k", ScriptedLLM(), Kinds).request(State(), ["hi"]).prompt
    assert "- day (string in date format)\n" in prompt
    assert '- color (one of "red", "blue"): the paint\n' in prompt
    assert '- size (one of "S", "M")\n' in prompt
    assert "- tags (array of string)\n" in prompt
    assert "- anything\n" in prompt
    assert "Already known" not in prompt  # nothing is known


@pytest.mark.anyio
async def test_read_uses_the_turns_it_is_given() -> None:
    llm = ScriptedLLM(['{"date": "Tuesday"}'])
    extractor = booking(llm, window=3)
    state = State()
    await extractor.read(state, ["one", "two"])
    assert "Conversation, oldest first:\nCaller: one\nCaller: two\n" in llm.last_request.prompt
    assert list(extractor.turns) == []  # read() does not record turns; extract() does
    assert state.get("booking:date") == "Tuesday"


@pytest.mark.anyio
async def test_the_window_keeps_the_last_n_turns() -> None:
    llm = ScriptedLLM(["{}"] * 4)
    extractor = booking(llm, window=2)
    state = State()
    for text in ("a1", "b2", "c3", "d4"):
        await extractor.extract(state, text)
    turns = [r.prompt.split("oldest first:\n")[1].split("\n\n")[0] for r in llm.requests]
    assert turns == [
        "Caller: a1",
        "Caller: a1\nCaller: b2",
        "Caller: b2\nCaller: c3",
        "Caller: c3\nCaller: d4",
    ]
    assert state.keys() == []  # {} says nothing


# -- replies ------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    "reply",
    [
        '```json\n{"date": "Monday"}\n```',
        'Sure! ```json\n{"date": "Monday"}\n``` Anything else?',
        '```\n{"date": "Monday"}\n```',
        'Here you go: {"date": "Monday"} -- hope that helps',
        'The format is {field: value}, so: {"date": "Monday"}',
        '  {"date": "Monday"}\n',
    ],
    ids=["fenced", "fenced in words", "bare fence", "in words", "braces before", "spaces"],
)
async def test_a_fenced_or_chatty_reply_is_read(reply: str) -> None:
    state = State()
    result = await booking(ScriptedLLM([reply])).extract(state, "monday")
    assert result.error is None
    assert state.keys() == ["booking:date"]
    assert state.get("booking:date") == "Monday"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("I could not tell.", "is not a JSON object: there is no JSON object in it"),
        ('["Saturday"]', "is not a JSON object: it is an array"),
        ('[{"date": "Saturday"}]', "is not a JSON object: it is an array"),
        ("42", "is not a JSON object: it is a number"),
        ("```json\nnull\n```", "is not a JSON object: it is null"),
        ('{"party_size": NaN}', "is not a JSON object: no complete JSON object in it"),
        ('{"party_size": "many"}', "does not fit the fields: party_size: Input should be"),
        ('{"confirmed": "perhaps"}', "does not fit the fields: confirmed:"),
        ('{"date": "Saturday", "party_size": ', "not a JSON object: no complete JSON object"),
        (RuntimeError("model overloaded"), "the LLM call failed: RuntimeError: model overloaded"),
    ],
    ids=[
        "prose",
        "array",
        "array of objects",
        "number",
        "fenced null",
        "NaN",
        "wrong type",
        "wrong bool",
        "truncated",
        "call raised",
    ],
)
async def test_a_bad_reply_writes_nothing(
    reply: Any, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    llm = ScriptedLLM([reply])
    state = State()
    state.set("booking:date", "Friday")
    before = state.snapshot()
    extractor = booking(llm, rules={"date": overwrite()})
    with caplog.at_level(logging.WARNING, logger="slateflow.conversation"):
        result = await extractor.extract(state, "Saturday for four")
    assert state.snapshot() == before
    assert result.error is not None
    assert result.error.startswith("extractor 'booking': ")
    assert why in result.error
    assert result.decisions == ()
    assert result.written == {}
    assert result.values == {"date": "Friday", "party_size": None, "confirmed": None}
    assert extractor.history == [result]
    logged = [r for r in caplog.records if r.name == "slateflow.conversation"]
    assert [r.levelno for r in logged] == [logging.WARNING]
    assert result.error in logged[0].getMessage()


@pytest.mark.anyio
async def test_a_model_validator_that_fails_writes_nothing() -> None:
    class Checked(BaseModel):
        start: int | None = None
        end: int | None = None

        @model_validator(mode="after")
        def ordered(self) -> Checked:
            if self.start is not None and self.end is not None and self.end < self.start:
                raise ValueError("end before start")
            return self

    class Broken(BaseModel):
        a: int | None = None

        @model_validator(mode="after")
        def broken(self) -> Broken:
            raise TypeError("a bug in the model")

    state = State()
    result = await LLMExtractor("t", ScriptedLLM(['{"start": 5, "end": 2}']), Checked).extract(
        state, "from five to two"
    )
    assert result.error is not None
    assert "does not fit the fields: value: Value error, end before start" in result.error
    result = await LLMExtractor("b", ScriptedLLM(['{"a": 1}']), Broken).extract(state, "one")
    assert (
        result.error
        == "extractor 'b': model Broken failed on the reply: TypeError: a bug in the model"
    )
    assert state.keys() == []


@pytest.mark.anyio
async def test_values_the_state_refuses_write_nothing() -> None:
    state = State()
    state.declare("booking:date", int)  # the State wants a number here; the model gives text
    before = state.snapshot()
    extractor = booking(ScriptedLLM(['{"date": "Saturday", "party_size": 4}']))
    result = await extractor.extract(state, "Saturday for four")
    assert result.error is not None
    assert result.error.startswith("extractor 'booking': the State refused the values: ")
    assert "booking:date" in result.error
    assert state.snapshot() == before  # party_size was not written either: one batch
    assert extractor.history == [result]


@pytest.mark.anyio
async def test_cancellation_propagates() -> None:
    extractor_box: list[LLMExtractor] = []

    with anyio.CancelScope() as scope:

        async def hang(request: LLMRequest) -> str:
            scope.cancel()
            await anyio.sleep_forever()
            raise AssertionError("not reached")

        extractor = booking(ScriptedLLM([hang]))
        extractor_box.append(extractor)
        await extractor.extract(State(), "hello")
        raise AssertionError("the cancellation was swallowed")
    assert scope.cancelled_caught
    assert extractor_box[0].history == []  # not recorded as a failed run


# -- promotion ----------------------------------------------------------------------------------


@pytest.mark.anyio
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
    assert "booking:party_size" not in state  # .to(key) wins
    assert state.get("party:size") == 6
    assert state.get("booking:confirmed") is True
    reasons = {d.field: (d.key, d.written, d.reason) for d in second.decisions}
    assert reasons == {
        "date": ("booking:date", False, "keep_known: 'booking:date' is already known ('Saturday')"),
        "party_size": ("party:size", True, "overwrite: overwrites"),
        "confirmed": ("booking:confirmed", False, "true_only: False is not true"),
    }
    assert second.values == {"date": "Saturday", "party_size": 6, "confirmed": True}
    prov = state.provenance("party:size")
    assert prov is not None
    assert (prov.source, prov.writer) == ("extraction", "booking")


@pytest.mark.anyio
async def test_keys_override_the_default_key() -> None:
    llm = ScriptedLLM(['{"date": "Monday", "party_size": 2}'])
    state = State()
    result = await booking(llm, keys={"date": "slot:day"}).extract(state, "Monday for two")
    assert result.written == {"slot:day": "Monday", "booking:party_size": 2}
    assert sorted(state.keys()) == ["booking:party_size", "slot:day"]


@pytest.mark.anyio
async def test_a_rule_target_wins_over_keys() -> None:
    llm = ScriptedLLM(['{"date": "Monday"}'])
    state = State()
    extractor = booking(llm, keys={"date": "slot:day"}, rules={"date": non_empty().to("x:day")})
    await extractor.extract(state, "Monday")
    assert state.keys() == ["x:day"]


@pytest.mark.anyio
async def test_accept_when_and_validate() -> None:
    llm = ScriptedLLM(
        [
            '{"party_size": 40}',
            '{"party_size": 4, "confirmed": true}',
            '{"confirmed": true}',
        ]
    )
    state = State()
    extractor = booking(
        llm,
        rules={"confirmed": true_only().accept_when(lambda v, s: s.get("asked"), "asked")},
        validate=[(lambda v: (v["party_size"] or 0) <= 12, "at most 12 people")],
    )
    too_many = await extractor.extract(state, "forty of us")
    assert [(d.field, d.written, d.reason) for d in too_many.decisions] == [
        ("party_size", False, "validation: at most 12 people")
    ]
    assert "booking:party_size" not in state
    result = await extractor.extract(state, "four then, yes")
    assert state.get("booking:party_size") == 4
    assert "booking:confirmed" not in state
    assert {d.field: d.reason for d in result.decisions}["confirmed"] == (
        "not accepted: asked does not hold"
    )
    state.set("asked", True)
    await extractor.extract(state, "yes")
    assert state.get("booking:confirmed") is True


@pytest.mark.anyio
async def test_a_bare_callable_check_is_described_by_its_name() -> None:
    def small_party(values: dict[str, Any]) -> bool:
        return (values["party_size"] or 0) <= 12

    extractor = booking(
        ScriptedLLM(['{"party_size": 13, "date": "Monday"}']), validate=[small_party]
    )
    result = await extractor.extract(State(), "13 on Monday")
    assert {d.reason for d in result.decisions} == {"validation: small_party"}
    assert result.written == {}


@pytest.mark.anyio
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
    async with conversation_on(state) as conversation:
        conversation.add_extractor(extractor)
        await conversation.user_turn("Saturday")
        assert llm.requests == []  # every 2nd turn only
        await conversation.user_turn("for two, card 4111 1111 1111 1111")
        assert "Caller: Saturday\nCaller: for two, card [card ending 1111]" in (
            llm.last_request.prompt
        )
        assert "4111 1111" not in llm.last_request.prompt
        assert state.get("booking:date") == "Saturday"
        await conversation.user_turn("hmm")
        await conversation.user_turn("two people")
        assert state.get("booking:party_size") == 2
        assert calls == [{"booking:date": "Saturday", "booking:party_size": 2}]
        assert state.get("lookup:result") is True


@pytest.mark.anyio
async def test_a_failed_llm_in_a_session_costs_nothing_but_its_values() -> None:
    llm = ScriptedLLM([RuntimeError("down"), '{"date": "Sunday"}'])
    extractor = booking(llm)
    state = State()
    async with conversation_on(state) as conversation:
        conversation.add_extractor(extractor)
        await conversation.user_turn("Sunday")
        assert "booking:date" not in state
        await conversation.user_turn("Sunday please")
        assert state.get("booking:date") == "Sunday"
    assert [r.error is not None for r in extractor.history] == [True, False]


# -- definitions --------------------------------------------------------------------------------


class _Required(BaseModel):
    date: str


class _PartlyRequired(BaseModel):
    date: str | None = None
    party_size: int


class _Empty(BaseModel):
    model_config = ConfigDict(extra="forbid")


Untyped: Any = LLMExtractor  # the definition errors pass what the types forbid


class _NotAnLLM:
    def generate(self, request: LLMRequest) -> str:  # not async, but runtime_checkable can't tell
        return "{}"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda llm: Untyped("b", llm, _Required),
            "field(s) date of _Required have no default",
        ),
        (
            lambda llm: Untyped("b", llm, _PartlyRequired),
            "field(s) party_size of _PartlyRequired have no default",
        ),
        (lambda llm: Untyped("b", llm, _Empty), "model _Empty has no field"),
        (lambda llm: Untyped("b", llm, dict), "model must be a pydantic model"),
        (lambda llm: Untyped("b", llm, Booking()), "model must be a pydantic model"),
        (lambda llm: Untyped("b", object(), Booking), "async def generate"),
        (
            lambda llm: Untyped("b", llm, Booking, rules={"day": overwrite()}),
            "rules name unknown field(s) day; the fields of Booking: date, party_size, confirmed",
        ),
        (
            lambda llm: Untyped("b", llm, Booking, keys={"x": "y", "a": "b"}),
            "keys name unknown field(s) a, x",
        ),
        (
            lambda llm: Untyped("b", llm, Booking, rules={"date": "overwrite"}),
            "field 'date': expected a promotion rule",
        ),
        (
            lambda llm: Untyped("b", llm, Booking, rules=[overwrite()]),
            "rules maps field names",
        ),
        (lambda llm: Untyped("b", llm, Booking, window=0), "window takes a number of turns"),
        (lambda llm: Untyped("b", llm, Booking, triggers=[]), "trigger() takes one or more"),
        (lambda llm: Untyped("b", llm, Booking, triggers=["every"]), "Trigger values"),
        (lambda llm: Untyped("b", llm, Booking, confidence=2), "confidence must be in [0, 1]"),
        (lambda llm: Untyped("b", llm, Booking, confidence=True), "confidence"),
        (lambda llm: Untyped("", llm, Booking), "non-empty string"),
        (
            lambda llm: Untyped("b", llm, Booking, keys={"date": "bad key"}),
            "extractor 'b' field 'date'",
        ),
        (
            lambda llm: Untyped("b", llm, Booking, validate=lambda v: True),
            "validate takes a list of checks",
        ),
        (lambda llm: Untyped("b", llm, Booking, validate=["x"]), "validate takes a callable"),
        (
            lambda llm: Untyped("b", llm, Booking, validate=[(lambda v: True, 3)]),
            "a validate pair is (callable, description)",
        ),
        (lambda llm: Untyped("b", llm, Booking, on_complete="lookup"), "on_complete takes"),
        (lambda llm: Untyped("b", llm, Booking, instructions=["x"]), "instructions is text"),
        (lambda llm: Untyped("b", llm, Booking, llm_model=3), "llm_model is text"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_definition_errors_name_the_problem(make: Any, message: str) -> None:
    with pytest.raises(ExtractDefinitionError) as raised:
        make(ScriptedLLM())
    assert message in str(raised.value)


def test_a_definition_that_works() -> None:
    extractor = booking(
        ScriptedLLM(),
        triggers=Trigger.every(3),  # one trigger need not be in a list
        validate=[(lambda v: True, "always")],
    )
    assert extractor.triggers == (Trigger.every(3),)
    assert [f.key for f in extractor.fields] == [
        "booking:date",
        "booking:party_size",
        "booking:confirmed",
    ]
    assert [f.rule for f in extractor.fields] == [keep_known()] * 3
    assert [text for _, text in extractor.checks] == ["always"]
    assert extractor.turns.maxlen == 1
    assert repr(extractor) == "<LLMExtractor 'booking': date, party_size, confirmed>"


@pytest.mark.anyio
async def test_a_generate_that_is_not_async_fails_at_the_call() -> None:
    # The definition check is duck-typed (a sync method returning a coroutine is a valid LLM),
    # so a plain sync generate is found out by the first call, which writes nothing.
    extractor = LLMExtractor("b", _NotAnLLM(), Booking)  # type: ignore[arg-type]
    state = State()
    result = await extractor.extract(state, "hi")
    assert result.error is not None
    assert result.error.startswith("extractor 'b': the LLM call failed: TypeError")
    assert state.keys() == []


# -- properties ---------------------------------------------------------------------------------


class _Everything(BaseModel):
    date: str | None = None
    party_size: int | None = None
    confirmed: bool | None = None
    day: dt.date | None = None
    price: float | None = None


optional_values = st.fixed_dictionaries(
    {
        "date": st.none() | st.text(min_size=1, max_size=12),
        "party_size": st.none() | st.integers(min_value=-5, max_value=500),
        "confirmed": st.none() | st.booleans(),
        "day": st.none() | st.dates(),
        "price": st.none() | st.floats(allow_nan=False, allow_infinity=False, width=32),
    },
    optional={"other": st.integers()},
)


@settings(deadline=None, max_examples=80)
@given(reply=optional_values)
def test_exactly_the_non_null_fields_are_written(reply: dict[str, Any]) -> None:
    async def main() -> tuple[State, Any]:
        state = State()
        llm = ScriptedLLM([json.dumps(reply, default=str)])
        result = await LLMExtractor("booking", llm, _Everything).extract(state, "...")
        return state, result

    dumped = _Everything.model_validate(
        {k: v for k, v in reply.items() if v is not None}
    ).model_dump(mode="json")
    expected = {f"booking:{k}": dumped[k] for k in _Everything.model_fields if reply[k] is not None}
    for backend in ("asyncio", "trio"):
        state, result = anyio.run(main, backend=backend)
        assert result.error is None
        assert state.pick(*expected) == expected
        assert sorted(state.keys()) == sorted(expected)
        assert result.written == expected
        assert all(d.written and d.reason == "keep_known: new value" for d in result.decisions)
