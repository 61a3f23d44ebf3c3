"""Tools: schemas derived from type hints and docstrings, exported in the OpenAI, Anthropic and
Gemini formats; calls validated before anything runs, admitted by the flows atomically, run
(sync in a worker thread, async on the loop), recorded in the State, reported to the flows,
and turned into words the model can act on; argument values filled into the State through
promotion rules. On asyncio and trio."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date
from typing import Annotated, Any, Literal

import anyio
import pytest
from pydantic import BaseModel, Field

from slateflow import (
    Conversation,
    Flow,
    ManualClock,
    Session,
    State,
    Step,
    called_ok,
    commit,
    is_true,
)
from slateflow.conversation import ToolFailed, overwrite
from slateflow.errors import MissingExtraError, ToolDefinitionError
from slateflow.integrations.tools import Tool, Toolbox, ToolContext, tool
from slateflow.resolve import ToolCall

pytestmark = pytest.mark.anyio


# -- schemas ---------------------------------------------------------------------------------


@tool
def book(ctx: ToolContext, day: date, party: int, note: str | None = None) -> dict[str, Any]:
    """Book a table for the caller.

    Only once the caller said yes to the read-back.

    Args:
        day: The day of the booking.
        party: How many people are coming.
        note: Anything the restaurant should know.
    """
    return {"day": day.isoformat(), "party": party, "by": ctx.tool}


class Slot(BaseModel):
    """A time to offer."""

    time: str = Field(description="Like 09:30.")
    length: Annotated[int, Field(ge=15)] = 30


class Request(BaseModel):
    slots: list[Slot]
    kind: Literal["new", "change"] = "new"


def test_the_schema_comes_from_hints_and_the_docstring() -> None:
    assert book.name == "book"
    assert book.description == "Book a table for the caller."
    schema = book.parameters
    assert schema["type"] == "object"
    assert set(schema["properties"]) == {"day", "party", "note"}  # no ctx
    assert schema["required"] == ["day", "party"]
    assert schema["properties"]["day"]["format"] == "date"
    assert schema["properties"]["party"]["description"] == "How many people are coming."
    assert schema["additionalProperties"] is False


def test_numpy_and_sphinx_docstrings_are_read_too() -> None:
    def numpy_style(day: str) -> str:
        """Look up slots.

        Parameters
        ----------
        day : str
            The day to look at.
        """
        return day

    def sphinx_style(day: str) -> str:
        """Look up slots.

        :param day: The day to look at.
        """
        return day

    for fn in (numpy_style, sphinx_style):
        made = Tool(fn)
        assert made.description == "Look up slots."
        assert made.parameters["properties"]["day"]["description"] == "The day to look at."


def test_a_single_model_argument_is_the_schema_and_arrives_as_the_model() -> None:
    def offer(request: Request) -> int:
        """Offer slots."""
        return len(request.slots)

    made = Tool(offer)
    assert set(made.parameters["properties"]) == {"slots", "kind"}
    checked, data = made.validate({"slots": [{"time": "09:30"}]})
    assert isinstance(checked, Request)
    assert data == {"slots": [{"time": "09:30", "length": 30}], "kind": "new"}


def test_the_formats_the_model_apis_take() -> None:
    openai = book.schema("openai")
    assert openai["type"] == "function"
    assert openai["function"]["name"] == "book"
    assert openai["function"]["parameters"] == book.parameters
    anthropic = book.schema("anthropic")
    assert anthropic == {
        "name": "book",
        "description": "Book a table for the caller.",
        "input_schema": book.parameters,
    }
    gemini = book.schema("gemini")["parameters"]
    note = gemini["properties"]["note"]
    assert note["type"] == "string"
    assert note["nullable"] is True
    assert "additionalProperties" not in gemini
    assert "title" not in str(gemini)
    assert "default" not in str(gemini)
    spec = book.spec()
    assert (spec.name, spec.description) == ("book", book.description)


def test_gemini_gets_references_put_in_place() -> None:
    def offer(request: Request) -> int:
        """Offer slots."""
        return 0

    gemini = Tool(offer).schema("gemini")["parameters"]
    assert "$ref" not in str(gemini)
    assert "$defs" not in gemini
    item = gemini["properties"]["slots"]["items"]
    assert item["properties"]["time"] == {"type": "string", "description": "Like 09:30."}
    assert item["properties"]["length"]["minimum"] == 15
    assert gemini["properties"]["kind"]["enum"] == ["new", "change"]


def test_definitions_that_cannot_make_a_schema_are_refused() -> None:
    def star(*days: str) -> None:
        """Star."""

    def undocumented(day: str) -> None:
        pass

    def late(day: str, ctx: ToolContext) -> None:
        """Late."""

    def fills(day: str) -> None:
        """Fills."""

    with pytest.raises(ToolDefinitionError, match="named arguments"):
        Tool(star)
    with pytest.raises(ToolDefinitionError, match="no description"):
        Tool(undocumented)
    assert Tool(undocumented, description="Given.").description == "Given."
    with pytest.raises(ToolDefinitionError, match="must come first"):
        Tool(late)
    with pytest.raises(ToolDefinitionError, match="not one of its arguments"):
        Tool(fills, fills={"party": "b:party"})
    with pytest.raises(ToolDefinitionError, match="tool name"):
        Tool(fills, name="a:b")
    with pytest.raises(ToolDefinitionError, match="already has a tool named 'book'"):
        Toolbox(book, book)
    with pytest.raises(ValueError, match="format"):
        book.schema("cohere")  # type: ignore[arg-type]


def test_a_docstring_with_sections_names_the_extra_when_griffelib_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    def plain(day: str) -> str:
        """Look up slots for a day."""
        return day

    def sectioned(day: str) -> str:
        """Look up slots.

        Args:
            day: The day.
        """
        return day

    monkeypatch.setitem(sys.modules, "griffe", None)  # as if not installed
    assert Tool(plain).description == "Look up slots for a day."
    with pytest.raises(MissingExtraError, match=r"pip install 'slateflow\[tools\]'"):
        Tool(sectioned)


# -- calls -----------------------------------------------------------------------------------


def plan() -> Flow:
    """One step, done when 'book' succeeded; 'book' is a commit tool refused until b:ok."""
    return Flow(
        "booking",
        [Step("book", done=called_ok("book"), allow=["book", "lookup", "slow", "boom"])],
        constraints=[commit("book", until=is_true("b:ok"))],
    )


@asynccontextmanager
async def call_with(
    toolbox: Toolbox, *, clock: ManualClock | None = None, flow: bool = True
) -> AsyncIterator[Conversation]:
    async with Session(State(), clock=clock) as session:
        # The agent's tools: the toolbox's, and the others the plan names (never registered).
        named = [t for t in plan().tools() if t not in toolbox.names]
        conversation = Conversation(session, tools=[*toolbox.names, *named])
        if flow:
            conversation.run_flow(plan())
        yield conversation


async def test_a_valid_call_runs_and_is_recorded_with_provenance() -> None:
    async with call_with(Toolbox(book)) as conversation:
        conversation.state.set("b:ok", True)
        outcome = await conversation_call(conversation, "book", {"day": "2026-12-01", "party": 4})
        state = conversation.state
        assert outcome.ok
        assert outcome.value == {"day": "2026-12-01", "party": 4, "by": "book"}
        assert outcome.content == '{"day":"2026-12-01","party":4,"by":"book"}'
        assert state["tool:book:result"] == outcome.value
        provenance = state.provenance("tool:book:result")
        assert provenance is not None
        assert (provenance.source, provenance.writer) == ("tool", "book")
        assert provenance.meta["call_id"] == "call_1"
        assert str(provenance.meta["idempotency_key"]).startswith("book-")
        assert state["flow:booking:done"] == ["book"]  # the success reached the flow


async def conversation_call(conversation: Conversation, name: str, args: Any) -> Any:
    toolbox = Toolbox(book, lookup, slow, boom)
    return await toolbox.call(conversation, name, args, call_id="call_1")


@tool
async def lookup(day: str) -> list[str]:
    """Free times on a day."""
    return ["09:00"] if day else []


@tool(timeout=5)
async def slow() -> str:
    """Never finishes."""
    await anyio.sleep_forever()
    return "never"


@tool
def boom(day: str) -> str:
    """Fails."""
    raise RuntimeError(f"the calendar is down for {day}")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ('{"day": "2026-12-01"', "not JSON"),
        ('["2026-12-01"]', "must be a JSON object"),
        ({"day": "tomorrow", "party": 4}, "day: Input should be a valid date"),
        ({"day": "2026-12-01"}, "party: Field required"),
        ({"day": "2026-12-01", "party": 4, "vip": True}, "vip: Extra inputs are not permitted"),
    ],
)
async def test_invalid_arguments_are_explained_to_the_model_and_nothing_runs(
    args: Any, said: str
) -> None:
    async with call_with(Toolbox(book)) as conversation:
        conversation.state.set("b:ok", True)
        outcome = await conversation_call(conversation, "book", args)
        assert outcome.status == "invalid"
        assert said in outcome.content
        assert outcome.content.startswith("Error: the arguments of 'book' are invalid")
        assert "tool:book:result" not in conversation.state
        assert "tool:book:error" not in conversation.state
        assert conversation.state["flow:booking:done"] == []


async def test_an_unknown_tool_is_named_with_the_ones_there_are() -> None:
    async with call_with(Toolbox(book)) as conversation:
        outcome = await Toolbox(book, lookup).call(conversation, "cancel", "{}")
    assert outcome.status == "invalid"
    assert outcome.content == "Error: there is no tool named 'cancel'. Tools: book, lookup."


async def test_a_refused_call_tells_the_model_why_and_runs_nothing() -> None:
    ran: list[int] = []

    @tool(name="book")
    def counted(party: int) -> int:
        """Book."""
        ran.append(party)
        return party

    async with call_with(Toolbox(counted)) as conversation:
        outcome = await Toolbox(counted).call(conversation, "book", {"party": 2})
    assert outcome.status == "refused"
    assert outcome.content.startswith("Refused: 'book' is not permitted yet")
    assert "b:ok" in outcome.content
    assert ran == []


async def test_a_sync_tool_runs_in_a_worker_thread_and_an_async_one_on_the_loop() -> None:
    where: dict[str, int] = {}

    @tool
    def sync_tool() -> str:
        """Sync."""
        where["sync"] = threading.get_ident()
        return "s"

    @tool
    async def async_tool() -> str:
        """Async."""
        where["async"] = threading.get_ident()
        return "a"

    box = Toolbox(sync_tool, async_tool)
    async with call_with(box, flow=False) as conversation:
        assert (await box.call(conversation, "sync_tool")).content == "s"
        assert (await box.call(conversation, "async_tool")).content == "a"
    assert where["async"] == threading.get_ident()
    assert where["sync"] != threading.get_ident()


async def test_identical_concurrent_calls_share_one_execution() -> None:
    runs: list[str] = []
    release = anyio.Event()

    @tool
    async def search(day: str) -> list[str]:
        """Search."""
        runs.append(day)
        await release.wait()
        return ["09:00"]

    box = Toolbox(search)
    async with call_with(box, flow=False) as conversation:
        calls = [ToolCall(id=f"c{i}", name="search", arguments='{"day":"mon"}') for i in range(3)]
        async with anyio.create_task_group() as tg:
            outcomes: list[Any] = []

            async def all_of_them() -> None:
                outcomes.extend(await box.call_all(conversation, calls))

            tg.start_soon(all_of_them)
            await wait_until(lambda: runs)
            release.set()
    assert runs == ["mon"]
    assert [o.call_id for o in outcomes] == ["c0", "c1", "c2"]
    assert all(o.ok and o.value == ["09:00"] for o in outcomes)
    assert sum(o.shared for o in outcomes) == 2
    assert [m.tool_call_id for m in (o.message() for o in outcomes)] == ["c0", "c1", "c2"]


async def wait_until(condition: Any) -> None:
    while not condition():
        await anyio.lowlevel.checkpoint()


async def test_a_commit_tool_books_once_under_parallel_calls_with_different_arguments() -> None:
    booked: list[int] = []

    @tool(name="book")
    async def booking(party: int) -> str:
        """Book."""
        booked.append(party)
        await anyio.lowlevel.checkpoint()
        return f"booked for {party}"

    box = Toolbox(booking)
    async with call_with(box) as conversation:
        conversation.state.set("b:ok", True)
        calls = [
            ToolCall(id=f"c{i}", name="book", arguments=f'{{"party":{i + 2}}}') for i in range(3)
        ]
        outcomes = await box.call_all(conversation, calls)
    assert len(booked) == 1
    assert [o.status for o in outcomes].count("done") == 1
    assert [o.status for o in outcomes].count("refused") == 2


async def test_a_failing_tool_becomes_words_and_an_error_key_and_the_flow_is_not_told() -> None:
    async with call_with(Toolbox(boom)) as conversation:
        conversation.state.set("tool:boom:result", "stale")
        outcome = await conversation_call(conversation, "boom", {"day": "mon"})
        state = conversation.state
        assert outcome.status == "error"
        assert outcome.content == (
            "Error: tool 'boom' failed (RuntimeError: the calendar is down for mon)."
        )
        assert state["tool:boom:error"] == "RuntimeError: the calendar is down for mon"
        assert "tool:boom:result" not in state
        assert state["flow:booking:done"] == []


async def test_a_tool_that_returns_tool_failed_is_not_counted_done() -> None:
    @tool(name="book")
    async def full(party: int) -> Any:
        """Book."""
        return ToolFailed("no table is free at 7")

    box = Toolbox(full)
    async with call_with(box) as conversation:
        conversation.state.set("b:ok", True)
        outcome = await box.call(conversation, "book", {"party": 2})
        assert outcome.status == "failed"
        assert outcome.content == "Failed: no table is free at 7"
        assert conversation.state["tool:book:error"] == "no table is free at 7"
        assert conversation.state["flow:booking:done"] == []
        again = await box.call(conversation, "book", {"party": 3})  # may be called again
        assert again.status == "failed"


async def test_a_tool_that_runs_too_long_is_stopped_on_the_sessions_clock() -> None:
    clock = ManualClock()
    box = Toolbox(slow)
    async with call_with(box, clock=clock, flow=False) as conversation:
        outcomes: list[Any] = []

        async def go() -> None:
            outcomes.append(await box.call(conversation, "slow"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(go)
            await clock.settle()
            await clock.advance(5)
        assert outcomes[0].status == "timeout"
        assert outcomes[0].content == (
            "Error: tool 'slow' timed out: it did not finish within 5 s and was stopped."
        )
        assert conversation.state["tool:slow:error"].startswith("it did not finish")


async def test_the_idempotency_key_is_stable_per_model_call() -> None:
    keys: list[str] = []

    @tool
    async def pay(ctx: ToolContext, amount: int) -> str:
        """Pay."""
        keys.append(ctx.idempotency_key)
        return "paid"

    box = Toolbox(pay)
    async with call_with(box, flow=False) as conversation:
        await box.call(conversation, "pay", {"amount": 5}, call_id="call_a")
        await box.call(conversation, "pay", {"amount": 5}, call_id="call_a")  # a retry
        await box.call(conversation, "pay", {"amount": 5}, call_id="call_b")
        await box.call(conversation, "pay", {"amount": 5})
        await box.call(conversation, "pay", {"amount": 5})
    assert keys[0] == keys[1] != keys[2]
    assert keys[3] == keys[4] not in keys[:3]  # no call id: same tool, arguments and turn


async def test_argument_values_fill_the_state_through_promotion_rules() -> None:
    @tool(fills={"party": "b:party", "day": ("b:day", overwrite())})
    def note_booking(party: int, day: date) -> str:
        """Note what the caller wants."""
        return "noted"

    box = Toolbox(note_booking)
    async with call_with(box, flow=False) as conversation:
        state = conversation.state
        outcome = await box.call(conversation, "note_booking", {"party": 4, "day": "2026-12-01"})
        assert (state["b:party"], state["b:day"]) == (4, "2026-12-01")
        provenance = state.provenance("b:party")
        assert provenance is not None
        assert (provenance.source, provenance.writer) == ("tool_args", "note_booking")
        assert all(d.written for d in outcome.decisions)
        again = await box.call(conversation, "note_booking", {"party": 6, "day": "2026-12-02"})
        assert state["b:party"] == 4  # keep_known: the first answer stands
        assert state["b:day"] == "2026-12-02"  # overwrite: a correction
        assert [d.reason for d in again.decisions if not d.written] == [
            "keep_known: 'b:party' is already known (4)"
        ]


async def test_only_admitted_tools_are_offered_this_turn() -> None:
    box = Toolbox(book, lookup, slow, boom)
    async with call_with(box) as conversation:
        context = await conversation.user_turn("hi")
        assert box.admitted(conversation) == ("lookup", "slow", "boom")
        assert tuple(context.tools) == ("lookup", "slow", "boom")
        assert [s.name for s in box.specs(context.tools)] == ["lookup", "slow", "boom"]
        conversation.state.set("b:ok", True)
        assert "book" in box.admitted(conversation)
        assert [t["function"]["name"] for t in box.schemas("openai", ["book"])] == ["book"]


async def test_a_secret_result_is_kept_from_the_model() -> None:
    @tool
    async def card() -> str:
        """The card on file."""
        return "4111 1111 1111 1111"

    box = Toolbox(card)
    async with call_with(box, flow=False) as conversation:
        conversation.state.policy("tool:card:*", secret=True)
        outcome = await box.call(conversation, "card")
        assert outcome.content == "Done (the result is private)."
        assert conversation.state["tool:card:result"] == "4111 1111 1111 1111"
