"""The slateflow pytest plugin, run in fresh pytest processes: under anyio's plugin (asyncio and
trio), under pytest-asyncio in strict and in auto mode, and a failing expectation's report."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

BODY = """
from slateflow import Flow, Resolver, Step, called_ok, captured, resolved, run
from slateflow.conversation import Extract, integer_near
from slateflow.testing import ConversationScript, fake_fetch


def booking(lookup):
    return Flow(
        "booking",
        [
            Step("slot", done=captured("booking:date")),
            Step(
                "check",
                after=["slot"],
                done=resolved("availability"),
                on_enter=run(Resolver.fetch("availability", lookup), "dispatch"),
            ),
            Step("book", after=["check"], done=called_ok("book_table"), allow=["book_table"]),
        ],
    )


async def script_case(slate_script, slate_state):
    lookup = slate_script.use("availability", fake_fetch())
    await slate_script.start(booking(lookup))
    slate_script.expect_step("slot")
    await slate_script.say(booking__date="Saturday")
    slate_script.expect_step("check")
    await slate_script.resolve("availability", {"open": True})
    slate_script.expect_step("book")
    await slate_script.tool_ok("book_table")
    slate_script.expect_complete()
    assert slate_state.get("flow:booking:complete") is True


async def clock_case(slate_session, slate_conversation, slate_clock, slate_state, scripted_llm):
    scripted_llm.add("hello")
    greet = Resolver.llm("greet", scripted_llm, "Greet {caller:name}")
    slate_state.set("caller:name", "Ada")
    slow = Resolver.fetch("slow", fake_fetch(returns=1, delay=5, clock=slate_clock))
    slate_session.dispatch(slow)
    assert await slate_session.call(greet) == "hello"
    await slate_clock.advance(4.9)
    assert slate_state.get("slow:status") == "running"
    await slate_clock.advance(0.1)
    assert slate_state.get("slow:result") == 1
    assert scripted_llm.last_request.prompt == "Greet Ada"
    sizes = Extract("b").field("size", integer_near(["people"])).build()
    slate_conversation.add_extractor(sizes)
    ctx = await slate_conversation.user_turn("four people, card 4111 1111 1111 1111")
    assert slate_state.get("b:size") == 4
    assert ctx.turn.text == "four people, card [card ending 1111]"


import pytest
from slateflow import Conversation
from slateflow.integrations.tools import Toolbox, tool
from slateflow.state import when


@pytest.fixture
def watched(slate_session, slate_conversation):
    # A sync fixture: it runs while the event loop is paused.
    seen = []
    slate_session.watch("caller:name", when.changed(), lambda c: seen.append(c.new), blocking=True)
    slate_conversation.run_flow(booking(fake_fetch(returns={"open": True})))
    return seen


async def options_case(slate_session, slate_conversation, slate_state, slate_clock, watched):
    assert slate_session.on_exit == "wait"
    assert slate_conversation.redact is None
    assert slate_conversation.tools == ("book_table",)
    assert Conversation.of(slate_session) is slate_conversation
    slate_state.set("caller:name", "Ada")
    slate_state.set("booking:date", "Saturday")
    await slate_clock.advance(0)
    assert watched == ["Ada"]
    assert slate_state.get("availability:result") == {"open": True}

    @tool
    async def book_table(day: str) -> str:
        \"\"\"Book a table.\"\"\"
        await slate_clock.sleep(2)  # a slow booking system on the manual clock
        return f"booked {day}"

    outcome = await Toolbox(book_table).call(slate_conversation, "book_table", {"day": "Sat"})
    assert (outcome.status, outcome.value) == ("done", "booked Sat")
    assert slate_clock.monotonic() == 2


OPTIONS = (
    pytest.mark.slate_session(on_exit="wait", cancel_grace=2.0),
    pytest.mark.slate_conversation(redact=None, tools=["book_table"]),
)


async def conversation_case(slate_conversation, slate_session, slate_state):
    assert slate_conversation.session is slate_session
    ctx = await slate_conversation.user_turn("hello")
    assert ctx.turn.number == 1
    assert slate_state.get("session:turn") == 1
"""

ANYIO = (
    BODY
    + """
import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.mark.anyio
async def test_script(slate_script, slate_state):
    await script_case(slate_script, slate_state)


@pytest.mark.anyio
async def test_clock(slate_session, slate_conversation, slate_clock, slate_state, scripted_llm):
    await clock_case(slate_session, slate_conversation, slate_clock, slate_state, scripted_llm)


@pytest.mark.anyio
async def test_conversation(slate_conversation, slate_session, slate_state):
    await conversation_case(slate_conversation, slate_session, slate_state)


@pytest.mark.anyio
@OPTIONS[0]
@OPTIONS[1]
async def test_options(slate_session, slate_conversation, slate_state, slate_clock, watched):
    await options_case(slate_session, slate_conversation, slate_state, slate_clock, watched)
"""
)

STRICT = (
    BODY
    + """
import pytest


@pytest.mark.asyncio
async def test_script(slate_script, slate_state):
    await script_case(slate_script, slate_state)


@pytest.mark.asyncio
async def test_clock(slate_session, slate_conversation, slate_clock, slate_state, scripted_llm):
    await clock_case(slate_session, slate_conversation, slate_clock, slate_state, scripted_llm)


@pytest.mark.asyncio
async def test_conversation(slate_conversation, slate_session, slate_state):
    await conversation_case(slate_conversation, slate_session, slate_state)


@pytest.mark.asyncio
@OPTIONS[0]
@OPTIONS[1]
async def test_options(slate_session, slate_conversation, slate_state, slate_clock, watched):
    await options_case(slate_session, slate_conversation, slate_state, slate_clock, watched)
"""
)

AUTO = (
    BODY
    + """
async def test_script(slate_script, slate_state):
    await script_case(slate_script, slate_state)


async def test_clock(slate_session, slate_conversation, slate_clock, slate_state, scripted_llm):
    await clock_case(slate_session, slate_conversation, slate_clock, slate_state, scripted_llm)


async def test_conversation(slate_conversation, slate_session, slate_state):
    await conversation_case(slate_conversation, slate_session, slate_state)


@OPTIONS[0]
@OPTIONS[1]
async def test_options(slate_session, slate_conversation, slate_state, slate_clock, watched):
    await options_case(slate_session, slate_conversation, slate_state, slate_clock, watched)
"""
)

INI = """
[pytest]
asyncio_mode = {mode}
asyncio_default_fixture_loop_scope = function
filterwarnings = error
"""


def run(pytester: pytest.Pytester, source: str, mode: str) -> pytest.RunResult:
    pytester.makeini(INI.format(mode=mode))
    pytester.makepyfile(test_kit=source)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")


def test_the_fixtures_work_under_anyio_on_asyncio_and_trio(pytester: pytest.Pytester) -> None:
    result = run(pytester, ANYIO, "strict")
    result.assert_outcomes(passed=8)


def test_the_fixtures_work_under_pytest_asyncio_strict_mode(pytester: pytest.Pytester) -> None:
    result = run(pytester, STRICT, "strict")
    result.assert_outcomes(passed=4)


def test_the_fixtures_work_under_pytest_asyncio_auto_mode(pytester: pytest.Pytester) -> None:
    result = run(pytester, AUTO, "auto")
    result.assert_outcomes(passed=4)


FAILING = (
    BODY
    + """
import pytest


@pytest.mark.asyncio
async def test_the_lookup_never_answers(slate_script):
    lookup = slate_script.use("availability", fake_fetch())
    await slate_script.start(booking(lookup))
    await slate_script.say(booking__date="Saturday")
    slate_script.expect_step("book")  # the lookup is still held: this fails
"""
)


def test_a_failed_expectation_says_why_the_flow_did_not_move(pytester: pytest.Pytester) -> None:
    result = run(pytester, FAILING, "strict")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*expected step 'book' to be active, but it is pending (active: check)*",
            "*flow 'booking': not complete; active: check; done: slot*",
            "*step 'check' waits for:*",
            "*'availability' must have a result: 'availability:status' is \"running\"*",
            "*recent changes:*",
            '*booking:date = "Saturday"  (extraction/script)*',
            '*availability:status = "running"  (fetch/availability)*',
        ]
    )


MARKERS = """
import pytest

pytestmark = [pytest.mark.anyio, pytest.mark.slate_conversation(tools=["a", "b"], redact=None)]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.mark.slate_conversation(tools=["c"])
async def test_the_closest_marker_wins_per_option(slate_conversation):
    assert slate_conversation.tools == ("c",)
    assert slate_conversation.redact is None  # from the module's marker


@pytest.mark.slate_state(journal_size=3)
async def test_state_options(slate_state):
    for i in range(5):
        slate_state.set("k", i)
    with pytest.raises(Exception, match="cursor"):
        slate_state.journal.since(1)  # the ring keeps 3 records: the first is gone


@pytest.fixture
def dispatched(slate_session, anyio_backend):
    from slateflow import Resolver

    slate_session.dispatch(Resolver.function("lookup", lambda state: 1))
    return anyio_backend


async def test_a_dispatch_from_a_sync_fixture_works_or_says_what_to_do(
    dispatched, slate_state, slate_clock
):
    # anyio runs trio's sync fixtures inside the run: there it works; asyncio's loop is paused.
    assert dispatched == "trio"
    await slate_clock.advance(0)
    assert slate_state.get("lookup:result") == 1


@pytest.mark.slate_session(no_such_option=1)
async def test_an_unknown_option_is_named(slate_session):
    pass


@pytest.mark.slate_session(clock=None)
async def test_a_clock_option_is_refused(slate_session):
    pass
"""


def test_option_markers_merge_and_name_what_they_cannot_use(pytester: pytest.Pytester) -> None:
    result = run(pytester, MARKERS, "strict")
    result.assert_outcomes(passed=5, errors=5)
    result.stdout.fnmatch_lines(
        [
            "*SessionError: session.dispatch() of resolver 'lookup' must run inside the "
            "session's event loop, which is not running here (called from a sync pytest "
            "fixture? make the fixture 'async def')*",
            "*UsageError: @pytest.mark.slate_session(no_such_option): *no_such_option*",
            "*UsageError: @pytest.mark.slate_session(clock=...): *override slate_clock*",
        ]
    )
