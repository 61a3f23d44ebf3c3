"""OpenAIModel against a real HTTP server on 127.0.0.1 speaking the chat-completions wire format,
through the real openai SDK, on asyncio and trio: answers, tool calls, structured output,
streaming (usage, cut-off streams, cancellation), and failures told apart by status."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import BaseModel

from chat_server import SAFETY, ChatServer, chat_server
from slateflow import ManualClock, Resolver, Retry, Session, State
from slateflow.errors import LLMStreamError, ModelCallError, ResolverError
from slateflow.resolve import LLMDelta, LLMRequest, LLMResponse, Message, ToolCall

pytest.importorskip("openai")

from slateflow.integrations.openai import OpenAIModel

pytestmark = [
    pytest.mark.anyio,
    # Under trio, the SDK leaves its own SSE generators (openai._streaming, httpx2's
    # aiter_bytes, httpcore2's pool stream) to the garbage collector after a stream ends or is
    # cancelled, and trio warns; ours are
    # closed (the response is, by OpenAIModel.stream). Not ours to fix: filtered by name.
    pytest.mark.filterwarnings("ignore:Async generator 'openai._streaming:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Async generator 'httpx2._models:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Async generator 'httpcore2.:ResourceWarning"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[ChatServer]:
    with chat_server() as running:
        yield running


OPEN: list[OpenAIModel] = []


def model(server: ChatServer, name: str = "hello", **options: Any) -> OpenAIModel:
    made = OpenAIModel(name, base_url=server.url, **options)
    OPEN.append(made)
    return made


@pytest.fixture(autouse=True)
async def _closed() -> Any:
    # Each test's models close their connection pools before its event loop ends.
    yield
    while OPEN:
        await OPEN.pop().aclose()


async def test_a_completion_comes_back_with_its_usage(server: ChatServer) -> None:
    response = await model(server).generate(LLMRequest(prompt="Hi", system="Be brief."))
    assert response.text == "Hello there!"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 4)
    sent = server.requests[-1]
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]


async def test_a_server_that_reports_no_usage_gives_unknown_usage(server: ChatServer) -> None:
    response = await model(server, "nousage").generate(LLMRequest(prompt="Hi"))
    assert response.usage is None


async def test_parallel_tool_calls_and_their_results_round_trip(server: ChatServer) -> None:
    llm = model(server, "tools")
    spec = {"name": "lookup", "parameters": {"type": "object", "properties": {}}}
    response = await llm.generate(LLMRequest(prompt="Free?", tools=({**spec},)))
    assert [(c.id, c.parsed()) for c in response.tool_calls] == [
        ("call_a", {"day": "friday"}),
        ("call_b", {"day": "saturday"}),
    ]
    follow_up = LLMRequest(
        messages=(
            Message(role="user", content="Free?"),
            Message(role="assistant", tool_calls=response.tool_calls),
            Message(role="tool", tool_call_id="call_a", content='{"free": 2}'),
            Message(role="tool", tool_call_id="call_b", content='{"free": 0}'),
        ),
        tools=({**spec},),
    )
    await model(server).generate(follow_up)
    sent = server.requests[-1]["messages"]
    assert sent[1]["tool_calls"][0]["function"] == {
        "name": "lookup",
        "arguments": '{"day": "friday"}',
    }
    assert [m.get("tool_call_id") for m in sent[2:]] == ["call_a", "call_b"]


class Slot(BaseModel):
    day: str
    party: int = 2


async def test_structured_output_is_asked_for_and_validated_here(server: ChatServer) -> None:
    llm = model(server, "json", strict=True)
    slot = Resolver.llm("slot", llm, "Which slot?", output=Slot)
    async with Session(State()) as session:
        assert await session.call(slot) == {"day": "friday", "party": 4}
    fmt = server.requests[-1]["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["day", "party"]  # strict: every property required
    assert "default" not in schema["properties"]["party"]


async def test_a_stream_gives_pieces_then_the_whole_answer_with_usage(server: ChatServer) -> None:
    pieces = [p async for p in model(server).stream(LLMRequest(prompt="Hi"))]
    assert [p.text for p in pieces if isinstance(p, LLMDelta)] == ["Hel", "lo ", "there", "!"]
    final = pieces[-1]
    assert isinstance(final, LLMResponse)
    assert final.text == "Hello there!"
    assert final.usage is not None
    assert final.usage.output_tokens == 4
    assert server.requests[-1]["stream_options"] == {"include_usage": True}


async def test_streamed_tool_calls_are_assembled_from_their_pieces(server: ChatServer) -> None:
    pieces = [p async for p in model(server, "tools").stream(LLMRequest(prompt="Free?"))]
    final = pieces[-1]
    assert isinstance(final, LLMResponse)
    assert final.tool_calls == (
        ToolCall(id="call_a", name="lookup", arguments='{"day": "friday"}'),
        ToolCall(id="call_b", name="lookup", arguments='{"day": "saturday"}'),
    )


async def test_a_stream_cut_mid_way_is_an_error_not_a_short_answer(server: ChatServer) -> None:
    with pytest.raises(LLMStreamError, match="ended before the model finished"):
        async for _ in model(server, "cut").stream(LLMRequest(prompt="Hi")):
            pass
    llm = model(server, "cut")
    answer = Resolver.llm("answer", llm, "Hi", stream=True)
    async with Session(State()) as session:
        with pytest.raises(ResolverError, match="ended before the model finished"):
            await session.call(answer)
        assert "answer:result" not in session.state


async def test_a_streaming_resolver_writes_partial_text_then_the_answer(server: ChatServer) -> None:
    heard: list[str] = []
    answer = Resolver.llm("answer", model(server), "Hi", stream=True, on_partial=heard.append)
    async with Session(State()) as session:
        assert await session.call(answer) == "Hello there!"
        meta = session.state.entry("answer:result").provenance.meta
    assert heard == ["Hel", "Hello ", "Hello there", "Hello there!"]
    assert meta["usage"] == {"input_tokens": 12, "output_tokens": 4}


@pytest.mark.parametrize(
    ("name", "status", "retryable", "after"),
    [
        ("e429", 429, True, 2.0),
        ("e503ms", 503, True, 0.25),
        ("e400", 400, False, None),
        ("e401", 401, False, None),
        ("e404", 404, False, None),
    ],
)
async def test_a_failure_names_the_server_and_status_and_says_whether_to_retry(
    server: ChatServer, name: str, status: int, retryable: bool, after: float | None
) -> None:
    with pytest.raises(ModelCallError) as raised:
        await model(server, name).generate(LLMRequest(prompt="Hi"))
    error = raised.value
    assert (error.status, error.retryable, error.retry_after) == (status, retryable, after)
    assert f"HTTP {status}" in str(error)
    assert server.url in str(error)
    assert f"scripted {status}" in str(error)


async def test_a_503_is_retried_by_the_resolver_after_the_wait_the_server_asked(
    server: ChatServer,
) -> None:
    clock = ManualClock()
    with chat_server() as own:  # its first answer to "flaky" is the 503
        ask = Resolver.llm("ask", model(own, "flaky"), "Hi", retry=Retry(attempts=2, backoff=0))
        async with Session(State(), clock=clock) as session:
            began = clock.monotonic()
            run = session.dispatch(ask)
            assert await run.wait() == "Hello there!"  # on the manual clock: it jumps the wait
            assert run.attempts == 2
            assert clock.monotonic() - began == pytest.approx(0.1)  # retry-after-ms: 100
            await close_models()


async def close_models() -> None:
    # Its server goes away with the block: close the pool while the loop still runs.
    while OPEN:
        await OPEN.pop().aclose()


async def test_a_400_is_not_retried(server: ChatServer) -> None:
    before = server.calls.get("e400", 0)
    ask = Resolver.llm("ask", model(server, "e400"), "Hi", retry=Retry(attempts=3, backoff=0))
    async with Session(State()) as session:
        with pytest.raises(ResolverError, match="HTTP 400"):
            await session.call(ask)
        assert "ask:result" not in session.state
    assert server.calls["e400"] == before + 1


async def test_a_server_that_is_down_is_a_retryable_error() -> None:
    with chat_server() as gone:
        url = gone.url
    with pytest.raises(ModelCallError, match="could not be reached") as raised:
        async with OpenAIModel("hello", base_url=url) as llm:
            await llm.generate(LLMRequest(prompt="Hi"))
    assert raised.value.retryable is True
    assert raised.value.status is None


async def test_cancelling_a_stream_closes_it(server: ChatServer) -> None:
    stream = model(server).stream(LLMRequest(prompt="Hi"))
    first = await stream.__anext__()
    assert isinstance(first, LLMDelta)
    await stream.aclose()  # what a cancelled run does


async def test_the_server_sees_every_tool_call_answered_and_refuses_one_that_is_not(
    server: ChatServer,
) -> None:
    llm = model(server)
    params = llm.params(LLMRequest(prompt="x"))
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    params["messages"] = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    params["messages"].append({"role": "user", "content": "and?"})
    with pytest.raises(Exception, match="did not have response messages"):
        await llm.client.chat.completions.create(**params)  # the raw SDK, our pairing bypassed
    with pytest.raises(ValueError, match="no tool result"):  # slateflow refuses it first
        LLMRequest(
            messages=(
                Message(role="assistant", tool_calls=(ToolCall(id="c1", name="lookup"),)),
                Message(role="user", content="and?"),
            )
        )


async def test_a_slow_first_token_is_waited_for_and_a_timeout_closes_the_stream(
    server: ChatServer,
) -> None:
    server.first_token.clear()  # the server holds the first piece until the test says
    try:
        heard: list[str] = []
        slow = Resolver.llm(
            "slow", model(server, "slow"), "Hi", stream=True, on_partial=heard.append
        )
        async with Session(State()) as session:
            asked = server.calls.get("slow", 0)
            run = session.dispatch(slow)
            with anyio.fail_after(SAFETY):
                while server.calls.get("slow", 0) == asked:  # the request reached the server
                    await anyio.lowlevel.checkpoint()
            assert heard == []  # nothing said before the first token
            server.first_token.set()
            assert await run.wait() == "Hello there!"
            assert heard[0] == "Hel"
        server.first_token.clear()
        impatient = Resolver.llm("slow", model(server, "slow"), "Hi", stream=True, timeout=5)
        async with Session(State(), clock=ManualClock()) as session:
            run = session.dispatch(impatient)
            await run.wait(raise_error=False)  # the manual clock reaches the timeout
            assert run.status == "error"
            assert "timed out" in (run.error or "")
            assert "slow:partial" not in session.state
    finally:
        server.first_token.set()


async def test_inside_a_session_the_model_calls_through_the_sessions_one_pool(
    server: ChatServer,
) -> None:
    llm = model(server)
    ask = Resolver.llm("ask", llm, "Hi")
    async with Session(State()) as session:
        assert not session.http.started
        assert await session.call(ask) == "Hello there!"
        assert session.http.started  # the same httpx2 pool an HTTP resolver uses
        streamed = Resolver.llm("streamed", llm, "Hi", stream=True)
        assert await session.dispatch(streamed).wait() == "Hello there!"
    assert not session.http.started  # closed with the session
    # Outside a session the model uses a client of its own, still open.
    assert (await llm.generate(LLMRequest(prompt="Hi"))).text == "Hello there!"
