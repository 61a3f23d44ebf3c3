"""Secrets never reach the model: a secret background result is handed over as "a secret result
is available", a flow's ground may not read a secret key, and keys cannot hide characters that
make two different keys print the same (test_keys_values)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import conversation_on
from slateflow import Conversation, Flow, ManualClock, Resolver, Session, State, Step, is_set
from slateflow.resolve import BackgroundResult

pytestmark = pytest.mark.anyio

CARD = "4929 1234 5678 9012"


async def card_lookup(state: State) -> dict[str, str]:
    return {"number": CARD, "holder": "Ann"}


def secret_state() -> State:
    state = State()
    state.policy("card:*", secret=True)
    return state


async def test_a_secret_background_result_reaches_the_model_masked() -> None:
    async with Session(secret_state(), clock=ManualClock()) as session:
        conversation = Conversation(session)
        session.background(Resolver.fetch("card", card_lookup), conversation.deliver)
        ctx = await conversation.user_turn("what card do you have on file?")
        (delivered,) = ctx.deliveries
        assert delivered.secret
        assert delivered.value == "***"
        assert delivered.response == {
            "status": "completed",
            "resolver": "card",
            "result": "***",
            "note": "a secret result is available; it is not shown",
        }
        assert CARD not in ctx.full_prompt
        assert CARD not in json.dumps(ctx.to_dict())
        assert "a secret result is available" in ctx.full_prompt
        assert session.state.get("card:result")["number"] == CARD  # the State has it


async def test_a_secret_interrupt_result_is_masked_for_on_delivery_too() -> None:
    spoken: list[BackgroundResult] = []
    async with Session(secret_state(), clock=ManualClock()) as session:
        conversation = Conversation(session, on_delivery=spoken.append)
        session.background(
            Resolver.fetch("card", card_lookup), conversation.deliver, scheduling="interrupt"
        )
        await session.clock.advance(0)  # type: ignore[attr-defined]
        assert [r.value for r in spoken] == ["***"]
        assert CARD not in str(spoken[0].response)


async def test_a_deliver_callback_of_your_own_gets_the_value_but_not_in_the_response() -> None:
    mine: list[BackgroundResult] = []
    async with Session(secret_state(), clock=ManualClock()) as session:
        session.background(Resolver.fetch("card", card_lookup), mine.append)
        await session.clock.advance(0)  # type: ignore[attr-defined]
    assert mine[0].value["number"] == CARD
    assert mine[0].secret
    assert CARD not in str(mine[0].response)


async def test_a_custom_result_formatter_never_sees_a_secret_value() -> None:
    seen: list[Any] = []

    def formatter(result: BackgroundResult) -> dict[str, Any]:
        seen.append(result.value)
        return {"value": result.value}

    async with Session(secret_state(), clock=ManualClock(), result_formatter=formatter) as s:
        conversation = Conversation(s)
        s.background(Resolver.fetch("card", card_lookup), conversation.deliver)
        ctx = await conversation.user_turn("and?")
    assert seen == ["***"]
    assert ctx.deliveries[0].response == {"value": "***"}


async def test_a_ground_that_reads_a_secret_key_is_refused_when_the_flow_starts() -> None:
    from slateflow.errors import FlowError

    state = secret_state()
    plan = Flow(
        "pay",
        [Step("confirm", done=is_set("paid"), ground="Card on file: {card:number}.")],
    )
    async with Session(state, clock=ManualClock()) as session:
        conversation = Conversation(session)
        with pytest.raises(FlowError, match=r"'card:number'.*secret"):
            conversation.run_flow(plan)
        ctx = await conversation.user_turn("hello")  # the session is not wedged
        assert ctx.turn.number == 1


async def test_a_key_made_secret_after_the_flow_started_drops_the_line_not_the_turn() -> None:
    state = State()
    state.set("card:number", CARD)
    plan = Flow(
        "pay",
        [
            Step(
                "confirm",
                done=is_set("paid"),
                posture="Confirm the payment.",
                ground="Card on file: {card:number}.",
            )
        ],
    )
    async with conversation_on(state) as conversation:
        conversation.run_flow(plan)
        state.policy("card:*", secret=True)
        ctx = await conversation.user_turn("go ahead")
        assert ctx.postures == ("Confirm the payment.",)
        assert ctx.grounds == ()
        assert CARD not in ctx.full_prompt


# -- what a secret resolver produces when it fails ---------------------------------------------

DECLINED = "card 4929 1234 5678 9012 declined"


async def declined(state: State) -> None:
    raise RuntimeError(DECLINED)


def secret_pay_state(store: Any = None) -> State:
    state = State(store=store)
    state.policy("pay:*", secret=True)
    return state


async def test_a_secret_resolvers_error_reaches_the_model_masked() -> None:
    async with Session(secret_pay_state(), clock=ManualClock()) as session:
        conversation = Conversation(session)
        session.background(Resolver.fetch("pay", declined), conversation.deliver)
        ctx = await conversation.user_turn("did it go through?")
        (delivered,) = ctx.deliveries
        assert delivered.status == "error"
        assert delivered.secret
        assert delivered.error == "***"
        assert delivered.response == {
            "status": "error",
            "resolver": "pay",
            "error": "***",
            "note": "the run failed; its message is secret and not shown",
        }
        assert "4929" not in ctx.full_prompt
        assert "4929" not in json.dumps(ctx.to_dict())
        assert session.state.get("pay:error") == DECLINED  # the State has it
        assert "4929" not in session.state.describe(provenance=True)


async def test_a_secret_resolvers_error_redelivered_after_a_restart_stays_masked() -> None:
    from slateflow.stores import MemoryStore

    store = MemoryStore()
    async with Session(secret_pay_state(store), clock=ManualClock()) as first:
        conversation = Conversation(first)
        first.background(Resolver.fetch("pay", declined), conversation.deliver)
        await first.clock.advance(0)  # type: ignore[attr-defined]
        crashed = store.copy()  # the process dies before the result was handed over
    async with Session(secret_pay_state(crashed), clock=ManualClock()) as second:
        ctx = Conversation(second).context_now()
        (delivered,) = ctx.deliveries
        assert delivered.name == "pay"
        assert delivered.error == "***"
        assert "4929" not in ctx.full_prompt


async def test_a_call_mode_error_of_a_secret_resolver_is_raised_masked_and_unchained() -> None:
    import traceback

    from slateflow.errors import ResolverError

    async with Session(secret_pay_state(), clock=ManualClock()) as session:
        with pytest.raises(ResolverError) as raised:
            await session.call(Resolver.fetch("pay", declined))
    error = raised.value
    assert error.error == "***"
    assert "4929" not in str(error)
    printed = "".join(traceback.format_exception(error))
    assert "4929" not in printed
    assert "'pay:error'" in str(error)  # it says where the message is


async def test_a_call_mode_error_of_an_ordinary_resolver_quotes_and_chains_it() -> None:
    from slateflow.errors import ResolverError

    async with Session(State(), clock=ManualClock()) as session:
        with pytest.raises(ResolverError, match="4929") as raised:
            await session.call(Resolver.fetch("pay", declined))
    assert isinstance(raised.value.__cause__, RuntimeError)


async def test_a_secret_resolvers_retries_are_logged_without_the_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    from slateflow import Retry

    caplog.set_level(logging.DEBUG, logger="slateflow")
    async with Session(secret_pay_state(), clock=ManualClock()) as session:
        run = session.dispatch(Resolver.fetch("pay", declined, retry=Retry(attempts=3)))
        await session.clock.advance(60)  # type: ignore[attr-defined]
        await run.wait(raise_error=False)
    assert run.attempts == 3
    assert "retrying" in caplog.text
    assert "4929" not in caplog.text


def test_provenance_meta_of_a_secret_key_is_masked_in_exported_changes() -> None:
    state = secret_pay_state()
    changes: list[Any] = []
    state.subscribe(changes.extend)
    state.set("pay:result", "ok", source="tool", meta={"card": CARD})
    exported = json.dumps([c.to_dict() for c in changes])
    assert CARD not in exported
    assert changes[0].to_dict()["provenance"]["meta"] == {"card": "***"}
    assert state.entry("pay:result").provenance.meta["card"] == CARD  # the State has it


@settings(max_examples=30, deadline=None)
@given(secret=st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=12, max_size=40))
def test_no_secret_resolvers_error_message_ever_reaches_the_prompt(secret: str) -> None:
    from slateflow.errors import ResolverError

    async def failing(state: State) -> None:
        raise ValueError(f"declined: {secret}")

    async def main() -> None:
        async with Session(secret_pay_state(), clock=ManualClock()) as session:
            conversation = Conversation(session)
            session.background(Resolver.fetch("pay", failing), conversation.deliver)
            ctx = await conversation.user_turn("and?")
            assert ctx.deliveries
            assert secret not in ctx.full_prompt
            assert secret not in json.dumps(ctx.to_dict())
            with pytest.raises(ResolverError) as raised:
                await session.call(Resolver.fetch("pay", failing))
            assert secret not in str(raised.value)

    anyio.run(main)
