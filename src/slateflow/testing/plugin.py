"""The slateflow pytest plugin (registered through the ``pytest11`` entry point).

Fixtures: ``slate_state`` (a fresh State), ``slate_clock`` (a ManualClock), ``scripted_llm`` (an
empty ScriptedLLM; ``scripted_llm.add(...)`` the replies), ``slate_session`` (an open Session
over ``slate_state`` on ``slate_clock``: async), ``slate_conversation`` (a Conversation over
it, what a voice adapter talks to), ``slate_script`` (a ConversationScript over that).

``slate_session`` works under anyio's pytest plugin (``@pytest.mark.anyio``, asyncio and trio)
and under pytest-asyncio in strict mode (``@pytest.mark.asyncio``) and auto mode.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from typing import Any

import pytest

from ..conversation import Conversation
from ..resolve import ManualClock, Session
from ..state import State
from .script import ConversationScript
from .scripted_llm import ScriptedLLM

__all__ = [
    "scripted_llm",
    "slate_clock",
    "slate_conversation",
    "slate_script",
    "slate_session",
    "slate_state",
]


@pytest.fixture
def slate_clock() -> ManualClock:
    """A ManualClock: time moves only when the test calls ``await slate_clock.advance(s)``."""
    return ManualClock()


@pytest.fixture
def slate_state(slate_clock: ManualClock) -> State:
    """A fresh State whose commit times come from ``slate_clock`` (so TTL freshness, and every
    timestamp, moves only when the test advances the clock)."""
    return State(clock=slate_clock)


@pytest.fixture
def scripted_llm() -> ScriptedLLM:
    """An empty ScriptedLLM; add its replies with ``scripted_llm.add("...")``."""
    return ScriptedLLM()


@pytest.fixture
async def slate_session(
    slate_state: State, slate_clock: ManualClock, request: pytest.FixtureRequest
) -> AsyncIterator[Session]:
    """An open Session over ``slate_state`` on ``slate_clock``; closed after the test."""
    if "anyio_backend" in request.fixturenames:
        # anyio runs an async generator fixture in one task from setup to teardown.
        async with Session(slate_state, clock=slate_clock) as session:
            yield session
        return
    # pytest-asyncio runs setup, the test and teardown as separate tasks, but a Session's task
    # group must be entered and left by one task: start() hosts it in a task of its own.
    session = await Session(slate_state, clock=slate_clock).start()
    try:
        yield session
    finally:
        await session.aclose()


@pytest.fixture
def slate_conversation(slate_session: Session) -> Conversation:
    """A Conversation over ``slate_session``: turns, flows, tools, the inbox, interruptions."""
    return Conversation(slate_session)


@pytest.fixture
def slate_script(slate_conversation: Conversation) -> ConversationScript:
    """A ConversationScript over ``slate_conversation`` (register fakes with
    ``slate_script.use``)."""
    return ConversationScript(slate_conversation)


# What @pytest_asyncio.fixture sets: pytest-asyncio in strict mode runs the fixture (and does not
# warn that a test asks for an unmarked async fixture). Tests run by anyio hide it (below).
_unwrap = getattr(slate_session, "_get_wrapped_function", None)  # pytest >= 8.4 wraps fixtures
_session_function: Any = _unwrap() if _unwrap is not None else slate_session
_session_function._force_asyncio_fixture = True


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> Generator[None, Any, Any]:
    """For a test anyio runs, hide ``slate_session`` from pytest-asyncio: anyio runs it."""
    func = fixturedef.func
    if (
        getattr(func, "_force_asyncio_fixture", False)
        and getattr(func, "__module__", None) == __name__
        and "anyio_backend" in request.fixturenames
    ):
        func._force_asyncio_fixture = False
        try:
            return (yield)
        finally:
            func._force_asyncio_fixture = True
    return (yield)
