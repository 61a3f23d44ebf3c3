"""The testing kit: fakes, a scripted LLM and a conversation script, so a flow can be
unit-tested with no network, no sleeps and no flakiness (with ``slateflow.ManualClock`` and
``slateflow.resolve.settle`` for time)."""

from .asserts import assert_provenance, assert_resolved, assert_step, recent_journal, why
from .fakes import Fake, FakeCall, fake_agent, fake_fetch
from .script import ConversationScript
from .scripted_llm import CutOff, Reply, ScriptedLLM

__all__ = [
    "ConversationScript",
    "CutOff",
    "Fake",
    "FakeCall",
    "Reply",
    "ScriptedLLM",
    "assert_provenance",
    "assert_resolved",
    "assert_step",
    "fake_agent",
    "fake_fetch",
    "recent_journal",
    "why",
]
