"""slateflow's OpenTelemetry spans inside a real pipecat pipeline with pipecat's own tracing on:
the turn span nests under pipecat's turn span, the model call and tool spans under it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pipecat.processors.aggregators.llm_context import LLMContext

from booking_agent import Booking, BookingAgent
from slateflow.integrations import otel
from slateflow.integrations.pipecat import PipecatCall
from slateflow.integrations.pipecat.testing import ScriptedLLMService, pipecat_call

pytestmark = pytest.mark.asyncio

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> Iterator[None]:
    # pipecat traces through the global provider, which can be set once per process.
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    with otel.instrument():
        yield


def parent_of(span: ReadableSpan, spans: list[ReadableSpan]) -> ReadableSpan | None:
    if span.parent is None:
        return None
    return next((s for s in spans if s.context.span_id == span.parent.span_id), None)


async def test_slateflow_spans_nest_under_pipecats_turn_span() -> None:
    EXPORTER.clear()
    booking = Booking()
    call = PipecatCall(
        booking.flow(),
        LLMContext(),
        toolbox=booking.toolbox(),
        extractors=booking.extractors(),
        system="You are the booking agent of La Maison.",
    )
    async with pipecat_call(
        call, ScriptedLLMService(BookingAgent()), enable_tracing=True, conversation_id="call-9"
    ) as caller:
        await caller.say("Saturday at seven for four people, please.")
        await caller.wait_quiet()
        booking.lookup.complete({"open": True})
        await caller.wait_quiet()
        await caller.say("Yes, that's right.")
        await caller.wait_ended()
    spans = list(EXPORTER.get_finished_spans())
    names = {s.name for s in spans}
    assert {"conversation", "turn"} <= names, names  # pipecat's own
    ours = [s for s in spans if s.name == "slateflow.turn"]
    assert len(ours) >= 2
    for span in ours:
        parent = parent_of(span, spans)
        assert parent is not None
        assert parent.name == "turn"
    lookups = [s for s in spans if s.name == "resolve availability"]
    assert lookups
    assert any(s.name == "execute_tool book_table" for s in spans)
