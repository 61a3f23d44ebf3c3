"""The slateflow pytest plugin (registered through the ``pytest11`` entry point).

Fixtures: ``slate_state`` (a fresh State), ``slate_clock`` (a ManualClock), ``scripted_llm`` (an
empty ScriptedLLM; ``scripted_llm.add(...)`` the replies), ``slate_session`` (an open Session
over ``slate_state`` on ``slate_clock``: async), ``slate_conversation`` (a Conversation over
it, what a voice adapter talks to), ``slate_script`` (a ConversationScript over that).

``slate_session`` works under anyio's pytest plugin (``@pytest.mark.anyio``, asyncio and trio)
and under pytest-asyncio in strict mode (``@pytest.mark.asyncio``) and auto mode.

Options: the markers ``slate_state``, ``slate_session`` and ``slate_conversation`` take the
keyword arguments of ``State``, ``Session`` and ``Conversation`` for the fixture of the same
name, on a test, a class or a module (``pytestmark``); the closest marker wins per option::

    @pytest.mark.slate_session(max_concurrency=2, on_exit="wait")
    @pytest.mark.slate_conversation(redact=None, tools=["book_table"])
    async def test_booking(slate_conversation): ...

The clock is the ``slate_clock`` fixture's (override that fixture for another one).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from typing import Any

import pytest

from ..conversation import Conversation
from ..errors import UsageError
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


_TAKES = {"slate_state": State, "slate_session": Session, "slate_conversation": Conversation}


def pytest_configure(config: pytest.Config) -> None:
    """Register the option markers (so ``--strict-markers`` accepts them)."""
    for name, cls in _TAKES.items():
        config.addinivalue_line(
            "markers", f"{name}(**options): keyword arguments of {cls.__name__} for {name}"
        )


def _options(request: pytest.FixtureRequest, fixture: str) -> dict[str, Any]:
    """The options the ``fixture`` marker gives this test: markers on the test, its class and
    its module, merged with the closest winning."""
    merged: dict[str, Any] = {}
    for marker in reversed(list(request.node.iter_markers(fixture))):
        if marker.args:
            raise UsageError(
                f"@pytest.mark.{fixture} takes keyword arguments of {_TAKES[fixture].__name__}, "
                f"got positional {marker.args!r}"
            )
        merged.update(marker.kwargs)
    if "clock" in merged:
        raise UsageError(
            f"@pytest.mark.{fixture}(clock=...): the fixtures share the slate_clock fixture's "
            "clock; override slate_clock to use another"
        )
    return merged


def _make(cls: Any, fixture: str, opts: dict[str, Any], *args: Any, **fixed: Any) -> Any:
    try:
        return cls(*args, **opts, **fixed)
    except TypeError as exc:
        raise UsageError(f"@pytest.mark.{fixture}({', '.join(opts)}): {exc}") from None


@pytest.fixture
def slate_clock() -> ManualClock:
    """A ManualClock: time moves only when the test calls ``await slate_clock.advance(s)``."""
    return ManualClock()


@pytest.fixture
def slate_state(slate_clock: ManualClock, request: pytest.FixtureRequest) -> State:
    """A fresh State whose commit times come from ``slate_clock`` (so TTL freshness, and every
    timestamp, moves only when the test advances the clock); options from
    ``@pytest.mark.slate_state(...)``."""
    state: State = _make(State, "slate_state", _options(request, "slate_state"), clock=slate_clock)
    return state


@pytest.fixture
def scripted_llm() -> ScriptedLLM:
    """An empty ScriptedLLM; add its replies with ``scripted_llm.add("...")``."""
    return ScriptedLLM()


@pytest.fixture
async def slate_session(
    slate_state: State, slate_clock: ManualClock, request: pytest.FixtureRequest
) -> AsyncIterator[Session]:
    """An open Session over ``slate_state`` on ``slate_clock``, closed after the test; options
    from ``@pytest.mark.slate_session(...)``."""
    opts = _options(request, "slate_session")
    made: Session = _make(Session, "slate_session", opts, slate_state, clock=slate_clock)
    if "anyio_backend" in request.fixturenames:
        # anyio runs an async generator fixture in one task from setup to teardown.
        async with made as session:
            yield session
        return
    # pytest-asyncio runs setup, the test and teardown as separate tasks, but a Session's task
    # group must be entered and left by one task: start() hosts it in a task of its own.
    session = await made.start()
    try:
        yield session
    finally:
        await session.aclose()


@pytest.fixture
def slate_conversation(slate_session: Session, request: pytest.FixtureRequest) -> Conversation:
    """A Conversation over ``slate_session``: turns, flows, tools, the inbox, interruptions;
    options from ``@pytest.mark.slate_conversation(...)``."""
    opts = _options(request, "slate_conversation")
    made: Conversation = _make(Conversation, "slate_conversation", opts, slate_session)
    return made


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
