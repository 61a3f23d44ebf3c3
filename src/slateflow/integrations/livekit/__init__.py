"""slateflow in LiveKit Agents: ``pip install 'slateflow[livekit]'`` (livekit-agents 1.x).

One :class:`LiveKitCall` per call gives the agent to start and watches the session::

    call = LiveKitCall(booking_flow, toolbox=toolbox, extractors=[slots, answers],
                       instructions=SYSTEM)
    session = AgentSession(llm=..., stt=..., tts=..., vad=...)
    call.attach(session)
    await session.start(call.agent, room=ctx.room)

LiveKit is asyncio-only, and so is this adapter. See ``docs/livekit.md``.
"""

from __future__ import annotations

from ...extras import require

require("livekit.agents", "livekit", "slateflow.integrations.livekit")

from .agent import SlateflowAgent  # noqa: E402
from .call import LiveKitCall  # noqa: E402

__all__ = ["LiveKitCall", "SlateflowAgent"]
