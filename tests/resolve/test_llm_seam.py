"""The LLM seam: a request is a prompt or a conversation (tool calls paired with their results),
may carry tools and a response schema, and may stream; a resolver validates a structured answer
before writing it, shows partial text while in flight, writes the whole answer once, fails on a
stream cut off, and records unknown usage as unknown (with an estimate), never as zero."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from pydantic import BaseModel, ValidationError

from slateflow import ManualClock, Resolver, Session, State
from slateflow.errors import ResolverDefinitionError, ResolverError
from slateflow.resolve import (
    LLMDelta,
    LLMRequest,
    LLMResponse,
    Message,
    StreamingLLM,
    ToolCall,
    ToolSpec,
    Usage,
    estimate_usage,
)
from slateflow.testing import CutOff, ScriptedLLM

pytestmark = pytest.mark.anyio

CALL = ToolCall(id="call_1", name="lookup", arguments='{"day": "friday"}')


# -- requests ------------------------------------------------------------------------------------


def test_the_one_prompt_form_is_a_system_and_a_user_message() -> None:
    request = LLMRequest(prompt="Hello", system="Be brief.")
    assert [(m.role, m.content) for m in request.to_messages()] == [
        ("system", "Be brief."),
        ("user", "Hello"),
    ]


def test_a_tool_call_and_its_result_go_together() -> None:
    request = LLMRequest(
        messages=(
            Message(role="user", content="Free on Friday?"),
            Message(role="assistant", tool_calls=(CALL,)),
            Message(role="tool", tool_call_id="call_1", content='{"free": 2}'),
        ),
        prompt="And Saturday?",
    )
    assert [m.role for m in request.to_messages()] == ["user", "assistant", "tool", "user"]
    assert CALL.parsed() == {"day": "friday"}


@pytest.mark.parametrize(
    ("messages", "why"),
    [
        ((Message(role="tool", tool_call_id="call_9", content="x"),), "no earlier assistant"),
        (
            (
                Message(role="assistant", tool_calls=(CALL,)),
                Message(role="user", content="hello?"),
            ),
            "have no tool result",
        ),
    ],
)
def test_a_tool_call_without_its_pair_is_refused(messages: Any, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        LLMRequest(messages=messages)


def test_message_shapes_are_checked() -> None:
    with pytest.raises(ValidationError, match="only assistant"):
        Message(role="user", tool_calls=(CALL,))
    with pytest.raises(ValidationError, match="tool_call_id"):
        Message(role="tool", content="x")
    with pytest.raises(ValueError, match="not JSON"):
        ToolCall(id="c", name="t", arguments="{oops").parsed()


# -- the resolver --------------------------------------------------------------------------------


async def test_a_conversation_is_computed_from_the_state_at_each_attempt() -> None:
    llm = ScriptedLLM(["Hi Ada", "Hi Grace"])

    def history(state: State) -> list[Message]:
        return [Message(role="user", content=f"I am {state['user:name']}")]

    greet = Resolver.llm("greet", llm, messages=history, system="Greet.")
    async with Session(State(), clock=ManualClock()) as session:
        session.state.set("user:name", "Ada")
        assert await session.call(greet) == "Hi Ada"
        session.state.set("user:name", "Grace")
        assert await session.call(greet) == "Hi Grace"
    assert [m.content for m in llm.requests[1].to_messages()] == ["Greet.", "I am Grace"]


async def test_tool_calls_in_the_answer_are_the_result() -> None:
    llm = ScriptedLLM([LLMResponse(tool_calls=(CALL,), usage=Usage(input_tokens=9))])
    spec = {"name": "lookup", "parameters": {"type": "object", "properties": {}}}
    agent = Resolver.llm("agent", llm, "Book a table", tools=[spec], tool_choice="auto")
    async with Session(State(), clock=ManualClock()) as session:
        result = await session.call(agent)
    assert result == {"text": "", "tool_calls": [CALL.model_dump()]}
    assert llm.last_request.tools == (ToolSpec.model_validate(spec),)


class Slot(BaseModel):
    day: str
    party: int


async def test_a_structured_answer_is_validated_before_it_is_written() -> None:
    llm = ScriptedLLM(['{"day": "friday", "party": 4}', '{"day": "friday", "party": "many"}'])
    slot = Resolver.llm("slot", llm, "Which slot?", output=Slot)
    async with Session(State(), clock=ManualClock()) as session:
        assert await session.call(slot) == {"day": "friday", "party": 4}
        assert llm.last_request.response_schema == Slot.model_json_schema()
        assert llm.last_request.response_name == "Slot"
        with pytest.raises(ResolverError, match="not a valid Slot"):
            await session.call(slot)
        state = session.state
        assert "slot:result" not in state  # nothing half-written
        assert "party" in state.get("slot:error")


async def test_unknown_usage_is_recorded_as_unknown_with_an_estimate() -> None:
    llm = ScriptedLLM(["four words of answer", LLMResponse(text="x", usage=Usage(output_tokens=2))])
    ask = Resolver.llm("ask", llm, "A question of some length?")
    async with Session(State(), clock=ManualClock()) as session:
        await session.call(ask)
        meta = session.state.entry("ask:result").provenance.meta
        assert meta["usage"] is None
        # 26 characters sent, 20 received: about four characters a token.
        assert meta["usage_estimate"] == {"input_tokens": 7, "output_tokens": 5}
        await session.call(ask)
        meta = session.state.entry("ask:result").provenance.meta
        assert meta["usage"] == {"input_tokens": 0, "output_tokens": 2}
        assert "usage_estimate" not in meta


def test_an_estimate_is_never_zero() -> None:
    usage = estimate_usage(LLMRequest(), LLMResponse())
    assert (usage.input_tokens, usage.output_tokens, usage.estimated) == (1, 1, True)


def test_a_resolver_needs_a_prompt_or_messages_and_a_streaming_llm_to_stream() -> None:
    with pytest.raises(ResolverDefinitionError, match="prompt, the messages"):
        Resolver.llm("x", ScriptedLLM(), "")

    class Plain:
        async def generate(self, request: LLMRequest) -> LLMResponse:
            return LLMResponse(text="")

    with pytest.raises(ResolverDefinitionError, match="stream"):
        Resolver.llm("x", Plain(), "hi", stream=True)
    with pytest.raises(ResolverDefinitionError, match="pydantic model"):
        Resolver.llm("x", Plain(), "hi", output=dict)  # type: ignore[arg-type]


# -- streaming -----------------------------------------------------------------------------------


class Gated:
    """A streaming LLM whose pieces wait for the test: ``step`` lets the next one through."""

    def __init__(self, pieces: list[str], *, finish: bool = True) -> None:
        self.pieces = pieces
        self.finish = finish
        self.step = anyio.Event()
        self.closed = False

    async def generate(self, request: LLMRequest) -> LLMResponse:
        raise AssertionError("a streaming resolver streams")

    async def stream(self, request: LLMRequest) -> AsyncIterator[LLMDelta | LLMResponse]:
        try:
            for piece in self.pieces:
                await self.step.wait()
                self.step = anyio.Event()
                yield LLMDelta(text=piece)
            if self.finish:
                yield LLMResponse(text="".join(self.pieces), model="gated")
        finally:
            self.closed = True


async def _until(predicate: Any) -> None:
    while not predicate():
        await anyio.lowlevel.checkpoint()


async def test_partial_text_is_readable_while_streaming_and_the_answer_is_written_once() -> None:
    llm = Gated(["The table ", "is free."])
    assert isinstance(llm, StreamingLLM)
    heard: list[str] = []
    answer = Resolver.llm("answer", llm, "Is it free?", stream=True, on_partial=heard.append)
    async with Session(State()) as session:
        state = session.state
        results: list[Any] = []
        state.subscribe(lambda cs: results.extend(c.new for c in cs), keys=["answer:result"])
        run = session.dispatch(answer)
        llm.step.set()
        await _until(lambda: state.get("answer:partial") == "The table ")
        assert heard == ["The table "]
        assert "answer:result" not in state
        llm.step.set()
        assert await run.wait() == "The table is free."
        assert heard == ["The table ", "The table is free."]
        assert results == ["The table is free."]  # written once, whole
        assert "answer:partial" not in state  # gone with the run
        assert llm.closed


async def test_a_stream_cut_off_is_an_error_not_a_truncated_answer() -> None:
    llm = ScriptedLLM([CutOff("The table is")])
    answer = Resolver.llm("answer", llm, "Is it free?", stream=True)
    async with Session(State(), clock=ManualClock()) as session:
        with pytest.raises(ResolverError, match="without the model finishing"):
            await session.call(answer)
        state = session.state
        assert "answer:result" not in state
        assert "answer:partial" not in state
        assert state.get("answer:status") == "error"


async def test_cancelling_a_streaming_run_closes_the_stream() -> None:
    llm = Gated(["one ", "two"])
    answer = Resolver.llm("answer", llm, "Count", stream=True, partial_key=False)
    async with Session(State()) as session:
        run = session.dispatch(answer)
        llm.step.set()
        await _until(lambda: run.status == "running" and llm.step.is_set() is False)
        run.cancel()
        await run.wait(raise_error=False)
        assert run.status == "cancelled"
        assert llm.closed
        assert "answer:partial" not in session.state


async def test_a_scripted_llm_streams_word_by_word() -> None:
    llm = ScriptedLLM(["Four people at seven."])
    pieces = [p async for p in llm.stream(LLMRequest(prompt="x"))]
    assert [p.text for p in pieces[:-1]] == ["Four ", "people ", "at ", "seven."]
    assert isinstance(pieces[-1], LLMResponse)


def test_fixed_messages_with_a_tool_call_left_open_are_refused_when_the_resolver_is_built() -> None:
    open_call = [Message(role="assistant", tool_calls=(CALL,))]
    with pytest.raises(ResolverDefinitionError, match="no tool result"):
        Resolver.llm("x", ScriptedLLM(), "And now?", messages=open_call)
