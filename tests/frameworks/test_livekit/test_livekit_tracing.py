"""slateflow's OpenTelemetry spans inside a LiveKit AgentSession with LiveKit's own tracing on:
the turn span nests under LiveKit's ``llm_node`` span, with nothing wired by hand."""

from __future__ import annotations

import pytest
from livekit.agents import AgentSession
from livekit.agents.telemetry import set_tracer_provider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from booking_agent import Booking, BookingAgent
from slateflow.integrations import otel
from slateflow.integrations.livekit import LiveKitCall
from slateflow.integrations.livekit.testing import ScriptedLLM

pytestmark = pytest.mark.asyncio


def parent_of(span: ReadableSpan, spans: list[ReadableSpan]) -> ReadableSpan | None:
    if span.parent is None:
        return None
    return next((s for s in spans if s.context.span_id == span.parent.span_id), None)


async def test_slateflow_spans_nest_under_livekits_llm_node_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    set_tracer_provider(provider)  # LiveKit's spans
    booking = Booking()
    call = LiveKitCall(
        booking.flow(),
        toolbox=booking.toolbox(),
        extractors=booking.extractors(),
        instructions="You are the booking agent of La Maison.",
    )
    with otel.instrument(tracer_provider=provider):
        async with AgentSession(llm=ScriptedLLM(BookingAgent())) as session:
            call.attach(session)
            await session.start(call.agent)
            await session.run(user_input="Saturday at seven for four people, please.")
    spans = list(exporter.get_finished_spans())
    names = {s.name for s in spans}
    assert "llm_node" in names, names  # LiveKit's own
    (turn,) = [s for s in spans if s.name == "slateflow.turn"]
    parent = parent_of(turn, spans)
    assert parent is not None
    assert parent.name == "llm_node"
