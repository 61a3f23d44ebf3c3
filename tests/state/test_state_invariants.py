"""State invariants at the edges: invalid keys fail the same inside a transaction, a change
never hands out the stored value, a raising clock leaves everything as it was, nested blocks
and scoped views route writes where they belong, and a refused nested commit merges nothing."""

from __future__ import annotations

import contextvars

import pytest

from helpers import fingerprint
from slateflow import Change, State
from slateflow.errors import InvalidKeyError, TransactionError, VersionConflictError
from slateflow.state import ScopedView


@pytest.mark.parametrize(
    "read",
    [
        lambda s: "a b" in s,
        lambda s: s.pick("ok", "a b"),
        lambda s: s.remove("a b", None),
        lambda s: s.update({}, remove=["a b"]),
    ],
    ids=["in", "pick", "remove-default", "update-remove"],
)
# type: ignore[no-untyped-def]
def test_invalid_keys_raise_inside_a_transaction_as_outside(read) -> None:
    state = State()
    with pytest.raises(InvalidKeyError, match="a b"):
        read(state)
    with state.transaction(), pytest.raises(InvalidKeyError, match="a b"):
        read(state)


def test_a_change_never_hands_out_the_stored_value() -> None:
    state = State()
    seen: list[Change] = []
    state.subscribe(seen.extend)
    state.set("cart", {"items": [1]})
    change = seen[0]
    change.new["items"].append(2)
    with pytest.raises(TypeError):
        change[2]  # type: ignore[index]
    with pytest.raises(TypeError):
        list(change)  # type: ignore[call-overload]
    assert state.get("cart") == {"items": [1]}
    assert state.journal.since(0)[0].new == {"items": [1]}


def test_a_clock_that_raises_leaves_the_state_and_cursor_untouched() -> None:
    ticks = iter([1.0, RuntimeError("clock broke"), 3.0])

    def clock() -> float:
        tick = next(ticks)
        if isinstance(tick, Exception):
            raise tick
        return tick

    state = State(clock=clock)
    state.set("a", 1)
    before = fingerprint(state)
    with pytest.raises(RuntimeError, match="clock broke"):
        state.set("a", 2)
    assert fingerprint(state) == before
    state.set("a", 3)
    assert state.journal.cursor == 2
    assert [c.seq for c in state.journal.since(0)] == [1, 2]


def test_code_run_in_an_inner_blocks_context_after_it_exits_writes_to_the_outer_one() -> None:
    state = State()
    with state.transaction():
        with state.transaction():
            context = contextvars.copy_context()
        context.run(state.set, "late", 1)
        assert state.get("late") == 1
        assert state.journal.cursor == 0
    assert state.get("late") == 1
    assert state.journal.cursor == 1


def test_modify_does_not_call_fn_on_an_ended_transaction_or_an_invalid_key() -> None:
    calls: list[object] = []
    state = State()
    with state.transaction() as tx:
        tx.rollback()
        with pytest.raises(TransactionError):
            tx.modify("n", 0, calls.append)
    with pytest.raises(InvalidKeyError):
        state.modify("a b", 0, calls.append)
    assert calls == []


def test_scoped_update_prefixes_removals_and_expected_versions() -> None:
    state = State()
    state.update({"name": "top-level", "user:name": "Ada", "user:age": 36})
    ScopedView(state, "user").update({"age": 37}, remove=["name"], expected_versions={"age": 1})
    assert state.get("name") == "top-level"
    assert state.pick("user:name", "user:age") == {"user:age": 37}
    with pytest.raises(VersionConflictError, match="user:age"):
        ScopedView(state, "user").update({"age": 38}, expected_versions={"age": 1})


def test_is_secret_of_an_invalid_key_raises() -> None:
    with pytest.raises(InvalidKeyError):
        State().is_secret("a b")


def test_state_refuses_a_sink_without_record() -> None:
    with pytest.raises(TypeError, match="journal sink"):
        State(sinks=[object()])  # type: ignore[list-item]


def test_a_nested_commit_refused_for_conflicting_expectations_merges_nothing() -> None:
    state = State()
    state.set("a", 1)
    with state.transaction() as outer:
        outer.set("a", 2, expected_version=1)
        inner = state.transaction()
        inner.__enter__()
        inner.set("b", 1)
        inner.set("a", 3, expected_version=5)
        with pytest.raises(VersionConflictError, match="'a'"):
            inner.__exit__(None, None, None)
        assert inner.status == "rolled_back"
        assert state.get("a") == 2
        assert "b" not in state
    assert state.get("a") == 2
    assert state.journal.cursor == 2
