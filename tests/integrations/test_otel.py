"""OpenTelemetry traces of a call, read back from the SDK's in-memory exporter (asyncio and
trio): spans for turns, resolver runs, model calls and tool calls; events for flow steps, tool
admissions and commits; background runs linked to the turns that started and delivered them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from slateflow import (
    Conversation,
    Flow,
    ManualClock,
    Resolver,
    Session,
    State,
    Step,
    is_set,
    resolved,
    run,
    tracing,
)
from slateflow.integrations import otel
from slateflow.resolve import LLMResponse, Usage
from slateflow.testing import ScriptedLLM, fake_fetch

pytestmark = pytest.mark.anyio


class Exported(InMemorySpanExporter):
    """The spans of one test, and the provider the test's own 'framework' spans come from."""

    def __init__(self) -> None:
        super().__init__()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self))

    def app(self) -> trace.Tracer:
        return self.provider.get_tracer("app")


@pytest.fixture
def spans() -> Iterator[Exported]:
    exporter = Exported()
    with otel.instrument(tracer_provider=exporter.provider):
        yield exporter
    assert tracing.current is None


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def events(span: ReadableSpan, name: str) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == name]


def booking() -> Flow:
    return Flow(
        "booking",
        [
            Step("size", done=is_set("party_size")),
            Step("check", after=["size"], done=resolved("lookup")),
            Step("bye", after=["check"], terminal=True),
        ],
    )


async def test_a_turn_is_a_span_with_the_calls_id_and_the_flow_and_commits_as_events(
    spans: Exported,
) -> None:
    state = State()
    otel.set_conversation_id(state, "call-42")
    async with Session(state, clock=ManualClock()) as session:
        conversation = Conversation(session)
        conversation.run_flow(booking())
        await conversation.user_turn("hello")
    (turn,) = named(spans, "slateflow.turn")
    attributes = dict(turn.attributes or {})
    assert attributes[otel.GEN_AI_CONVERSATION_ID] == "call-42"
    assert attributes["slateflow.turn.number"] == 1
    commits = events(turn, "slateflow.commit")
    assert ["session:turn", "turn:user"] in [
        c["slateflow.commit.keys"].split(", ") for c in commits
    ]
    assert all("slateflow.commit.values" not in c for c in commits)  # values only when asked


async def test_steps_entered_and_done_are_events_naming_the_guard_no_span_per_step(
    spans: Exported,
) -> None:
    async with Session(State(), clock=ManualClock()) as session:
        conversation = Conversation(session)
        conversation.run_flow(booking())
        await conversation.user_turn("four of us")
        with spans.app().start_as_current_span("app.work"):
            session.state.set("party_size", 4)
    (work,) = named(spans, "app.work")
    done = events(work, "slateflow.step.done")
    assert done == [
        {
            "slateflow.flow": "booking",
            "slateflow.step": "size",
            "slateflow.guard": "'party_size' must be known",
        }
    ]
    assert {"slateflow.flow": "booking", "slateflow.step": "check"} in events(
        work, "slateflow.step.entered"
    )
    assert not [s for s in spans.get_finished_spans() if "step" in s.name]


async def test_a_resolver_run_is_a_span_under_the_turn_that_called_it(
    spans: Exported,
) -> None:
    async with Session(State(), clock=ManualClock()) as session:
        with spans.app().start_as_current_span("app.turn") as outer:
            await session.call(Resolver.fetch("lookup", fake_fetch(returns={"open": True})))
            failing = Resolver.fetch("broken", fake_fetch(raises=ValueError("no table")))
            with pytest.raises(Exception, match="no table"):
                await session.call(failing)
    (run,) = named(spans, "resolve lookup")
    assert run.parent is not None
    assert run.parent.span_id == outer.get_span_context().span_id
    attributes = dict(run.attributes or {})
    assert attributes["slateflow.resolver.mode"] == "call"
    assert attributes["slateflow.resolver.status"] == "done"
    assert attributes["slateflow.resolver.attempts"] == 1
    assert [c["slateflow.commit.keys"] for c in events(run, "slateflow.commit")]
    (broken,) = named(spans, "resolve broken")
    assert broken.status.status_code == trace.StatusCode.ERROR
    assert "no table" in str(dict(broken.attributes or {})["slateflow.resolver.error"])


async def test_a_model_call_follows_the_genai_conventions(spans: Exported) -> None:
    reply = LLMResponse(
        text="Table for four at seven.",
        model="gpt-test-0613",
        usage=Usage(input_tokens=21, output_tokens=7),
        finish_reason="stop",
    )
    llm = ScriptedLLM([reply], model="gpt-test")
    state = State()
    otel.set_conversation_id(state, "call-7")
    async with Session(state, clock=ManualClock()) as session:
        await session.call(Resolver.llm("answer", llm, "Say when."))
    (chat,) = named(spans, "chat gpt-test")
    attributes = dict(chat.attributes or {})
    assert attributes[otel.GEN_AI_OPERATION_NAME] == "chat"
    assert attributes[otel.GEN_AI_PROVIDER_NAME] == "slateflow.scripted"
    assert attributes[otel.GEN_AI_REQUEST_MODEL] == "gpt-test"
    assert attributes[otel.GEN_AI_RESPONSE_MODEL] == "gpt-test-0613"
    assert attributes[otel.GEN_AI_USAGE_INPUT_TOKENS] == 21
    assert attributes[otel.GEN_AI_USAGE_OUTPUT_TOKENS] == 7
    assert attributes[otel.GEN_AI_CONVERSATION_ID] == "call-7"
    assert "gen_ai.system" not in attributes  # the deprecated name
    (run,) = named(spans, "resolve answer")
    assert chat.parent is not None
    assert chat.parent.span_id == run.context.span_id


async def test_a_tool_call_is_a_span_with_its_admission_as_an_event(
    spans: Exported,
) -> None:
    flow = Flow(
        "booking",
        [
            Step("size", done=is_set("party_size"), allow=["lookup"]),
            Step("book", after=["size"], allow=["book"], terminal=True),
        ],
    )
    async with Session(State(), clock=ManualClock()) as session:
        conversation = Conversation(session, tools=["lookup", "book"])
        conversation.run_flow(flow)
        ran = await conversation.run_tool("lookup", lambda: {"open": True}, call_id="call_1")
        refused = await conversation.run_tool("book", lambda: "booked", call_id="call_2")
    assert ran.allowed
    assert not refused.allowed
    lookup, book = named(spans, "execute_tool lookup"), named(spans, "execute_tool book")
    attributes = dict(lookup[0].attributes or {})
    assert attributes[otel.GEN_AI_TOOL_NAME] == "lookup"
    assert attributes[otel.GEN_AI_TOOL_CALL_ID] == "call_1"
    assert attributes[otel.GEN_AI_OPERATION_NAME] == "execute_tool"
    (admitted,) = events(lookup[0], "slateflow.tool.admission")
    assert admitted["slateflow.tool.admitted"] is True
    (no,) = events(book[0], "slateflow.tool.admission")
    assert no["slateflow.tool.admitted"] is False
    assert no["slateflow.tool.reason"] == refused.reason


async def test_a_background_run_links_to_the_turn_that_started_it_and_the_one_that_delivered_it(
    spans: Exported,
) -> None:
    clock = ManualClock()
    lookup = Resolver.fetch("lookup", fake_fetch(returns={"open": True}, delay=1.0, clock=clock))
    flow = Flow(
        "booking",
        [
            Step("hello", done=is_set("turn:user")),  # done by the first turn itself
            Step(
                "check",
                after=["hello"],
                done=resolved("lookup"),
                on_enter=run(lookup, "background"),
            ),
            Step("bye", after=["check"], terminal=True),
        ],
    )
    async with Session(State(clock=clock), clock=clock) as session:
        conversation = Conversation(session)
        conversation.run_flow(flow)
        await conversation.user_turn("is seven free?")
        await clock.advance(2.0)
        second = await conversation.user_turn("and?")
        assert [d.name for d in second.deliveries] == ["lookup"]
        second.handed_over()
    first_turn, second_turn = sorted(
        named(spans, "slateflow.turn"),
        key=lambda s: dict(s.attributes or {})["slateflow.turn.number"],
    )
    (span,) = named(spans, "resolve lookup")
    links = {
        dict(link.attributes or {})["slateflow.link"]: link.context.span_id for link in span.links
    }
    assert links == {
        "started": first_turn.context.span_id,
        "delivered": second_turn.context.span_id,
    }
    assert events(span, "slateflow.run.finished") == [{"slateflow.resolver.status": "done"}]


async def test_values_are_shown_only_when_asked_never_secrets_and_excluded_keys_are_left_out() -> (
    None
):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    state = State()
    state.policy("card:*", secret=True)
    tracer = provider.get_tracer("app")
    with (
        otel.instrument(
            tracer_provider=provider, values=True, exclude=["audio:*"], max_value_chars=16
        ),
        tracer.start_as_current_span("app.work"),
    ):
        state.update({"name": "Ada", "card:number": "4111111111111111", "audio:chunk": "x"})
        state.set("notes", "a" * 100)
    (work,) = [s for s in exporter.get_finished_spans() if s.name == "app.work"]
    first, second = events(work, "slateflow.commit")
    keys = first["slateflow.commit.keys"].split(", ")
    assert sorted(keys) == ["card:number", "name"]
    values = dict(zip(keys, first["slateflow.commit.values"], strict=True))
    assert values == {"name": '"Ada"', "card:number": "***"}
    (notes,) = second["slateflow.commit.values"]
    assert notes.startswith('"aaaaaaaaaaaaaaa')
    assert notes.endswith("(102 chars)")


async def test_uninstrumented_slateflow_makes_no_spans() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider).uninstrument()
    assert tracing.current is None
    async with Session(State(), clock=ManualClock()) as session:
        await Conversation(session).user_turn("hello")
        await session.call(Resolver.fetch("lookup", fake_fetch(returns=1)))
    assert exporter.get_finished_spans() == ()


def test_without_opentelemetry_instrument_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from slateflow.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    with pytest.raises(MissingExtraError, match=r"slateflow\[otel\]"):
        otel.instrument()
