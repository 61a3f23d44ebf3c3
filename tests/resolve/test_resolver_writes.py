"""A resolver writes its own ``<name>:*`` keys and, when it declares them, others: declared keys
are fenced by the same machinery, stamped with the resolver in their provenance, and still
subject to the State's policies."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from slateflow import Key, Resolver, Session, State
from slateflow.errors import PolicyViolation, ResolverDefinitionError, ResolverError

pytestmark = pytest.mark.anyio


class Table(BaseModel):
    number: int


TABLE = Key("booking:table", Table)


async def book(state: State) -> dict[str, Any]:
    state.set("booking:table", 7)
    state.set("booking:status", "held")
    return {"ok": True}


async def test_a_resolver_writes_the_keys_it_declares_stamped_as_itself() -> None:
    state = State()
    async with Session(state) as session:
        run = session.dispatch(Resolver.fetch("book", book, writes=["booking:*"]))
        await run.wait()
    assert state.get("book:result") == {"ok": True}
    assert state.get("booking:table") == 7
    record = state.provenance("booking:table")
    assert record is not None
    assert (record.source, record.writer) == ("fetch", "book")


async def test_an_undeclared_key_fails_the_run_and_says_how_to_declare_it() -> None:
    state = State()
    with pytest.raises(ResolverError) as info:
        await Resolver.fetch("book", book).resolve(state)
    cause = info.value.__cause__
    assert isinstance(cause, PolicyViolation)
    assert "'book' may not write 'booking:table'" in str(cause)
    assert "writes=[...]" in str(cause)
    assert "booking:table" not in state
    assert "book:error" in state


async def test_declaring_keys_does_not_open_the_runtimes_keys() -> None:
    async def forge(state: State) -> int:
        state.set("book:status", "done")
        return 1

    state = State()
    with pytest.raises(ResolverError) as info:
        await Resolver.fetch("book", forge, writes=["*"]).resolve(state)
    assert isinstance(info.value.__cause__, PolicyViolation)
    assert "belong to the runtime" in str(info.value.__cause__)


async def test_the_states_policies_still_govern_declared_keys() -> None:
    state = State()
    state.policy("booking:*", writers=["front_desk"])
    with pytest.raises(ResolverError) as info:
        await Resolver.fetch("book", book, writes="booking:*").resolve(state)
    assert isinstance(info.value.__cause__, PolicyViolation)
    assert "booking:table" not in state


async def test_a_declared_typed_key_is_validated_like_any_write() -> None:
    async def typed(state: State) -> int:
        state.set(TABLE, Table(number=3))
        return 1

    state = State()
    await Resolver.fetch("book", typed, writes=[TABLE]).resolve(state)
    assert state.get(TABLE) == Table(number=3)


def test_only_the_declared_keys_are_opened() -> None:
    r = Resolver.fetch("book", book, writes=["booking:table", "booking:table", "notes"])
    assert r.writes == ("booking:table", "notes")
    assert Resolver.fetch("book", book).writes == ()


@pytest.mark.parametrize(
    ("writes", "says"),
    [
        (["bad key"], "writes: invalid state key"),
        (["state_meta:x"], "read-only views of provenance"),
        (5, "writes must be a key"),
        ([""], "writes: invalid key pattern"),
    ],
)
def test_bad_declarations_are_refused_when_the_resolver_is_made(writes: Any, says: str) -> None:
    with pytest.raises(ResolverDefinitionError, match=says):
        Resolver.fetch("book", book, writes=writes)
