"""slateflow in a pipecat pipeline: ``pip install 'slateflow[pipecat]'`` (pipecat-ai 1.14+).

One :class:`PipecatCall` per call gives the two processors a pipeline needs and registers the
call's tools with the LLM service::

    call = PipecatCall(booking_flow, context, toolbox=toolbox, extractors=[slots, answers])
    call.register_tools(llm)
    pipeline = Pipeline([
        transport.input(), stt, pair.user(),
        call.steering,                       # feeds whole user turns, steers context and tools
        llm, tts, transport.output(),
        call.tap,                            # what was spoken, idle, barge-in, the end
        pair.assistant(),
    ])

pipecat is asyncio-only, and so is this adapter. See ``docs/pipecat.md`` for the timings.
"""

from __future__ import annotations

from ...extras import require

require("pipecat.frames.frames", "pipecat", "slateflow.integrations.pipecat")

from .call import PipecatCall  # noqa: E402
from .processors import CallTap, Steering  # noqa: E402
from .timing import FloorHold, PacedSpeechTimeout  # noqa: E402

__all__ = ["CallTap", "FloorHold", "PacedSpeechTimeout", "PipecatCall", "Steering"]
