"""Transactions: buffered writes, read-your-writes, atomic commit, rollback, isolation, nesting."""

from __future__ import annotations

import contextvars
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import committed_view
from slateflow import Change, Key, State
from slateflow.conversation import end_turn
from slateflow.errors import (
    InvalidKeyError,
    KeyExistsError,
    MissingKeyError,
    PolicyViolation,
    ReadOnlyError,
    SchemaError,
    StateValueError,
    TransactionError,
    VersionConflictError,
)
from slateflow.state import Transaction

# -- helpers -------------------------------------------------------------------------------------


class Boom(Exception):
    """Raised inside a transaction block to abort it."""


def in_other_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a fresh thread (no open transaction there) and return its result."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


def run_in(tx: Transaction, body: Callable[[Transaction], Any]) -> None:
    """Run ``body(tx)`` inside ``with tx:`` (so ``pytest.raises`` wraps one statement)."""
    with tx:
        body(tx)


def committed_items(state: State) -> dict[str, Any]:
    """The committed values, as seen from outside the current transaction."""
    return dict(contextvars.Context().run(state.items))


class Recorder:
    """Records every ``state.changed`` signal and every subscriber call."""

    def __init__(self, state: State) -> None:
        self.signals: list[tuple[Change, ...]] = []
        self.calls: list[tuple[Change, ...]] = []
        state.changed.connect(self.on_signal, sender=state, weak=False)
        self.sub = state.subscribe(self.calls.append)

    def on_signal(self, sender: State, *, changes: tuple[Change, ...]) -> None:
        self.signals.append(changes)


@pytest.fixture
def state() -> State:
    s = State()
    s.set("a", 1)
    s.set("b", {"x": [1, 2]}, source="agent", writer="seed")
    s.set("p:one", "one")
    s.set("p:two", "two")
    return s


# -- buffering and read-your-writes --------------------------------------------------------------


def test_writes_are_buffered_and_visible_inside_through_tx_and_state(state: State) -> None:
    before = committed_view(state)
    with state.transaction() as tx:
        tx.set("a", 10)
        state.set("new", "n")
        tx.remove("p:one")
        state.remove("b")

        # Through the transaction.
        assert tx.get("a") == 10
        assert tx.get("new") == "n"
        assert tx.get("p:one") is None
        assert tx.get("b", "dflt") == "dflt"
        assert "new" in tx
        assert "b" not in tx
        assert sorted(tx.keys()) == ["a", "new", "p:two"]
        assert tx.keys("p:") == ["p:two"]
        assert dict(tx.items()) == {"a": 10, "new": "n", "p:two": "two"}
        assert tx.pick("a", "b", "new") == {"a": 10, "new": "n"}
        assert tx["new"] == "n"
        with pytest.raises(MissingKeyError):
            tx["b"]

        # Through the state, in the same thread.
        assert state.get("a") == 10
        assert state.get("new") == "n"
        assert state.get("b") is None
        assert state["a"] == 10
        assert "new" in state
        assert "new" in state
        assert "b" not in state
        assert "p:one" not in state
        assert sorted(state.keys()) == ["a", "new", "p:two"]
        assert state.keys("p:") == ["p:two"]
        assert dict(state.items()) == {"a": 10, "new": "n", "p:two": "two"}
        assert dict(state.items("p:")) == {"p:two": "two"}
        assert state.pick("a", "b", "new", "p:one") == {"a": 10, "new": "n"}

        # Nothing is committed yet.
        assert committed_view(state) == before
    assert dict(state.items()) == {"a": 10, "new": "n", "p:two": "two"}


def test_other_threads_do_not_see_buffered_writes_before_commit(state: State) -> None:
    with state.transaction() as tx:
        tx.set("a", 99)
        state.set("fresh", True)
        state.remove("p:one")
        seen = in_other_thread(
            lambda: (
                state.get("a"),
                state.get("fresh"),
                "fresh" in state,
                state.get("p:one"),
                sorted(state.keys()),
                state.pick("a", "fresh"),
                state.journal.cursor,
            )
        )
        assert seen == (1, None, False, "one", ["a", "b", "p:one", "p:two"], {"a": 1}, 4)
    seen = in_other_thread(lambda: (state.get("a"), state.get("fresh"), state.get("p:one")))
    assert seen == (99, True, None)


def test_reads_inside_return_private_copies(state: State) -> None:
    with state.transaction() as tx:
        tx.set("list", [1, 2])
        got = state.get("list")
        got.append(3)
        assert tx.get("list") == [1, 2]
        items = dict(state.items())
        items["b"]["x"].append(99)
        assert state.get("b") == {"x": [1, 2]}
    assert state.get("list") == [1, 2]
    assert state.get("b") == {"x": [1, 2]}


def test_commit_is_one_batch_one_seq_one_signal_one_subscriber_call(state: State) -> None:
    rec = Recorder(state)
    start = state.journal.cursor
    with state.transaction() as tx:
        tx.set("a", 2)
        tx.set("c", [1])
        tx.remove("p:one")
        state.set("d", "dee", source="agent", writer="w")
        assert rec.signals == []
        assert rec.calls == []
    assert state.journal.cursor == start + 1
    assert len(rec.signals) == 1
    assert len(rec.calls) == 1
    signal_batch = rec.signals[0]
    assert rec.calls[0] == signal_batch
    by_key = {c.key: c for c in signal_batch}
    assert set(by_key) == {"a", "c", "p:one", "d"}
    assert {c.seq for c in signal_batch} == {start + 1}
    assert {c.origin for c in signal_batch} == {"commit"}
    assert (by_key["a"].old, by_key["a"].new, by_key["a"].version) == (1, 2, 2)
    assert by_key["c"].created
    assert by_key["c"].version == 1
    assert by_key["p:one"].removed
    assert by_key["p:one"].old == "one"
    assert by_key["d"].provenance.writer == "w"
    journal = state.journal.since(start)
    assert {m.key for m in journal} == {"a", "c", "p:one", "d"}
    assert {m.seq for m in journal} == {start + 1}
    assert state.entry("a").seq == start + 1  # type: ignore[union-attr]
    assert state.entry("c").seq == start + 1  # type: ignore[union-attr]
    assert state.provenance("d").source == "agent"  # type: ignore[union-attr]


def test_commit_returns_seq_and_marks_committed(state: State) -> None:
    with state.transaction() as tx:
        tx.set("a", 5)
        assert tx.status == "open"
        seq = tx.commit()
        assert tx.status == "committed"
    assert seq == state.journal.cursor == 5
    assert state.get("a") == 5


def test_commit_with_no_net_change_writes_nothing(state: State) -> None:
    rec = Recorder(state)
    before = committed_view(state)
    with state.transaction() as tx:
        tx.set("a", 1)  # same value as committed
        tx.set("tmp", 1)
        tx.remove("tmp")
    assert committed_view(state) == before
    assert rec.signals == []
    assert rec.calls == []


def test_versions_bump_once_per_key_per_commit(state: State) -> None:
    with state.transaction() as tx:
        tx.set("a", 2)
        tx.set("a", 3)
        state.set("a", 4)
    assert state.version("a") == 2
    assert state.get("a") == 4


def test_set_returns_the_version_the_key_will_have(state: State) -> None:
    with state.transaction() as tx:
        assert tx.set("a", 7) == 2
        assert state.set("brand:new", 1) == 1
    assert state.version("a") == 2
    assert state.version("brand:new") == 1


# -- rollback ------------------------------------------------------------------------------------


def _buffer_everything(state: State, tx: Any) -> None:
    tx.set("a", 100)
    tx.update({"u1": 1, "u2": [2]}, remove=["p:two"])
    tx.modify("counter", 0, lambda v: v + 1)
    tx.remove("b")
    state.set("turn:x", 1)
    state.set("temp:y", 2)
    state.update({"v": "w"})
    state.modify("a", 0, lambda v: v * 2)
    state.rename("p:one", "moved")
    state.clear_prefix("u")
    end_turn(state)


def test_exception_in_block_discards_everything(state: State) -> None:
    rec = Recorder(state)
    before = committed_view(state)
    tx = state.transaction()

    def body(tx: Transaction) -> None:
        _buffer_everything(state, tx)
        raise Boom

    with pytest.raises(Boom):
        run_in(tx, body)
    assert tx.status == "rolled_back"
    assert committed_view(state) == before
    assert rec.signals == []
    assert rec.calls == []


def test_explicit_rollback_discards_everything(state: State) -> None:
    rec = Recorder(state)
    before = committed_view(state)
    with state.transaction() as tx:
        _buffer_everything(state, tx)
        tx.rollback()
        assert tx.status == "rolled_back"
    assert committed_view(state) == before
    assert rec.signals == []
    assert rec.calls == []
    assert state.get("a") == 1


def test_rollback_outside_with_block(state: State) -> None:
    before = committed_view(state)
    tx = state.transaction()
    with tx:
        tx.set("a", 2)
        tx.rollback()
    assert committed_view(state) == before


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda tx: tx.set("a", 1), id="set"),
        pytest.param(lambda tx: tx.update({"a": 1}), id="update"),
        pytest.param(lambda tx: tx.remove("a", None), id="remove"),
        pytest.param(lambda tx: tx.modify("a", 0, lambda v: v + 1), id="modify"),
        pytest.param(lambda tx: tx.commit(), id="commit"),
        pytest.param(lambda tx: tx.rollback(), id="rollback"),
    ],
)
@pytest.mark.parametrize("ending", ["commit", "rollback", "exception", "explicit_commit"])
def test_operations_after_the_end_raise_transaction_error(
    state: State, op: Callable[[Any], Any], ending: str
) -> None:
    if ending == "exception":
        with pytest.raises(Boom), state.transaction() as tx:
            raise Boom
    else:
        with state.transaction() as tx:
            tx.set("k", 1)
            if ending == "rollback":
                tx.rollback()
            elif ending == "explicit_commit":
                tx.commit()
    after = committed_view(state)
    with pytest.raises(TransactionError):
        op(tx)
    assert committed_view(state) == after


def test_state_writes_after_rollback_inside_block_raise_transaction_error(state: State) -> None:
    before = committed_view(state)
    with state.transaction() as tx:
        tx.set("a", 2)
        tx.rollback()
        with pytest.raises(TransactionError):
            state.set("a", 3)
    assert committed_view(state) == before


def test_state_is_writable_again_after_the_block(state: State) -> None:
    with pytest.raises(Boom), state.transaction():
        raise Boom
    state.set("a", 2)
    assert state.get("a") == 2
    assert state.version("a") == 2


# -- optimistic isolation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda s, tx: tx.get("a"), id="tx.get"),
        pytest.param(lambda s, tx: "a" in tx, id="tx.contains"),
        pytest.param(lambda s, tx: tx["a"], id="tx.require"),
        pytest.param(lambda s, tx: tx.pick("a"), id="tx.pick"),
        pytest.param(lambda s, tx: s.get("a"), id="state.get"),
        pytest.param(lambda s, tx: "a" in s, id="state.contains"),
        pytest.param(lambda s, tx: s.pick("a"), id="state.pick"),
        pytest.param(lambda s, tx: tx.modify("a", 0, lambda v: v + 1), id="tx.modify"),
        pytest.param(lambda s, tx: s.modify("a", 0, lambda v: v + 1), id="state.modify"),
    ],
)
def test_stale_read_makes_commit_raise_version_conflict(
    state: State, read: Callable[[State, Any], Any]
) -> None:
    rec = Recorder(state)
    tx = state.transaction()

    def body(tx: Transaction) -> None:
        read(state, tx)
        tx.set("side", "effect")
        in_other_thread(lambda: state.set("a", 50))

    with pytest.raises(VersionConflictError, match="'a'"):
        run_in(tx, body)
    assert tx.status == "rolled_back"
    assert state.get("a") == 50
    assert state.version("a") == 2
    assert "side" not in state
    assert state.journal.cursor == 5
    assert len(rec.calls) == 1  # only the other thread's write


def test_read_of_absent_key_conflicts_when_another_writer_creates_it(state: State) -> None:
    def body(tx: Transaction) -> None:
        if tx.get("slot") is None:
            tx.set("slot", "mine")
        in_other_thread(lambda: state.set("slot", "theirs"))

    with pytest.raises(VersionConflictError, match="'slot'"):
        run_in(state.transaction(), body)
    assert state.get("slot") == "theirs"


def test_read_then_remove_by_other_writer_conflicts(state: State) -> None:
    def body(tx: Transaction) -> None:
        tx.set("copy", tx.get("p:one"))
        in_other_thread(lambda: state.remove("p:one"))

    with pytest.raises(VersionConflictError, match="'p:one'"):
        run_in(state.transaction(), body)
    assert "copy" not in state


def test_blind_writes_do_not_conflict(state: State) -> None:
    with state.transaction() as tx:
        tx.set("mine", 1)
        in_other_thread(lambda: state.set("a", 77))
    assert state.get("mine") == 1
    assert state.get("a") == 77


def test_read_modify_write_retry_never_loses_an_update(state: State) -> None:
    attempts = 0
    while True:
        attempts += 1
        try:
            with state.transaction() as tx:
                current = tx.get("a")
                if attempts == 1:
                    in_other_thread(lambda: state.modify("a", 0, lambda v: v + 10))
                tx.set("a", current + 1)
            break
        except VersionConflictError:
            continue
    assert attempts == 2
    assert state.get("a") == 12


def test_other_threads_own_transaction_is_independent(state: State) -> None:
    with state.transaction() as tx:
        tx.set("a", "outer")

        def other() -> Any:
            with state.transaction() as inner:
                inner.set("other", 1)
                return state.get("a")

        assert in_other_thread(other) == 1
        assert committed_items(state)["other"] == 1
        assert state.get("a") == "outer"
    assert state.get("a") == "outer"
    assert state.get("other") == 1


# -- expected_version inside a transaction -------------------------------------------------------


def test_expected_version_matching_commits(state: State) -> None:
    with state.transaction() as tx:
        tx.set("a", 2, expected_version=1)
        state.set("brand", "new", expected_version=0)
    assert state.get("a") == 2
    assert state.get("brand") == "new"


def test_expected_version_mismatch_writes_nothing(state: State) -> None:
    before = committed_view(state)

    def body(tx: Transaction) -> None:
        tx.set("other", 1)
        tx.set("a", 2, expected_version=7)

    with pytest.raises(VersionConflictError, match="'a'"):
        run_in(state.transaction(), body)
    assert committed_view(state) == before


def test_expected_version_zero_for_existing_key_writes_nothing(state: State) -> None:
    before = committed_view(state)
    with pytest.raises(VersionConflictError, match="'a'"), state.transaction():
        state.set("a", 2, expected_version=0)
    assert committed_view(state) == before


def test_expected_version_checked_against_concurrent_writer_at_commit(state: State) -> None:
    def body(tx: Transaction) -> None:
        tx.set("a", 2, expected_version=1)
        in_other_thread(lambda: state.set("a", 3))

    with pytest.raises(VersionConflictError, match="'a'"):
        run_in(state.transaction(), body)
    assert state.get("a") == 3


@pytest.mark.parametrize("bad", [-1, 1.0, "1", True])
def test_bad_expected_version_raises_at_the_line(state: State, bad: Any) -> None:
    with state.transaction() as tx:
        with pytest.raises(StateValueError):
            tx.set("a", 2, expected_version=bad)
        tx.set("c", 3)
    assert state.get("a") == 1
    assert state.get("c") == 3


def test_two_different_expected_versions_for_one_key_conflict(state: State) -> None:
    before = committed_view(state)

    def body(tx: Transaction) -> None:
        tx.set("a", 2, expected_version=1)
        tx.set("a", 3, expected_version=2)

    with pytest.raises(VersionConflictError):
        run_in(state.transaction(), body)
    assert committed_view(state) == before


def test_update_expected_versions_inside_transaction_are_checked(state: State) -> None:
    # BUG: state.update(expected_versions=...) inside a transaction ignores the versions.
    before = committed_view(state)
    with pytest.raises(VersionConflictError, match="'a'"), state.transaction():
        state.update({"a": 3}, expected_versions={"a": 5})
    assert committed_view(state) == before


# -- nesting -------------------------------------------------------------------------------------


def test_inner_commit_merges_into_outer_and_commits_once(state: State) -> None:
    rec = Recorder(state)
    start = state.journal.cursor
    with state.transaction() as outer:
        outer.set("a", "outer")
        with state.transaction() as inner:
            inner.set("b", "inner")
            state.set("c", "inner-too")
            assert state.get("a") == "outer"
        assert inner.status == "committed"
        assert state.get("b") == "inner"
        assert outer.get("c") == "inner-too"
        assert committed_items(state)["b"] == {"x": [1, 2]}
        assert "c" not in committed_items(state)
        assert state.journal.cursor == start
        assert rec.calls == []
    assert state.journal.cursor == start + 1
    assert len(rec.calls) == 1
    assert {c.key for c in rec.calls[0]} == {"a", "b", "c"}
    assert (state.get("a"), state.get("b"), state.get("c")) == ("outer", "inner", "inner-too")


def test_exception_in_inner_block_discards_only_inner_writes(state: State) -> None:
    with state.transaction() as outer:
        outer.set("a", "outer")
        try:
            with state.transaction() as inner:
                inner.set("a", "inner")
                inner.set("inner-only", 1)
                state.remove("p:one")
                raise Boom
        except Boom:
            pass
        assert inner.status == "rolled_back"
        assert state.get("a") == "outer"
        assert "inner-only" not in state
        assert state.get("p:one") == "one"
        outer.set("after", True)
    assert state.get("a") == "outer"
    assert state.get("after") is True
    assert "inner-only" not in state
    assert state.get("p:one") == "one"
    assert {m.key for m in state.journal.since(4)} == {"a", "after"}


def test_explicit_inner_rollback_discards_only_inner_writes(state: State) -> None:
    with state.transaction() as outer:
        outer.set("x", 1)
        with state.transaction() as inner:
            inner.set("y", 2)
            inner.rollback()
        assert state.get("y") is None
        assert state.get("x") == 1
    assert state.get("x") == 1
    assert "y" not in state


def test_outer_exception_discards_committed_inner_writes(state: State) -> None:
    before = committed_view(state)

    def body(outer: Transaction) -> None:
        with state.transaction() as inner:
            inner.set("y", 2)
        assert state.get("y") == 2
        raise Boom

    with pytest.raises(Boom):
        run_in(state.transaction(), body)
    assert committed_view(state) == before


def test_inner_transaction_sees_and_removes_outer_writes(state: State) -> None:
    with state.transaction() as outer:
        outer.set("o", 1)
        with state.transaction() as inner:
            assert inner.get("o") == 1
            assert inner.keys() == ["a", "b", "p:one", "p:two", "o"]
            assert inner.remove("o") == 1
            assert "o" not in state
        assert "o" not in outer
    assert "o" not in state


def test_inner_read_conflict_fails_the_outer_commit(state: State) -> None:
    def body(outer: Transaction) -> None:
        outer.set("z", 1)
        with state.transaction() as inner:
            inner.set("a", inner.get("a") + 1)
        in_other_thread(lambda: state.set("a", 40))

    with pytest.raises(VersionConflictError, match="'a'"):
        run_in(state.transaction(), body)
    assert state.get("a") == 40
    assert "z" not in state


def test_three_levels(state: State) -> None:
    with state.transaction():
        state.set("l1", 1)
        with state.transaction():
            state.set("l2", 2)

            def level3(tx: Transaction) -> None:
                state.set("l3", 3)
                raise Boom

            with pytest.raises(Boom):
                run_in(state.transaction(), level3)
            assert "l3" not in state
        assert state.get("l2") == 2
    assert state.pick("l1", "l2", "l3") == {"l1": 1, "l2": 2}


# -- state.* methods inside a block are buffered --------------------------------------------------


def test_all_state_write_methods_are_buffered_and_commit_together() -> None:
    state = State()
    state.update({"a": 1, "old": "v", "p:x": 1, "p:y": 2, "turn:t": 1, "temp:t": 2, "keep": 0})
    start = state.journal.cursor
    rec = Recorder(state)
    with state.transaction():
        assert state.set("s", 1) == 1
        assert state.update({"u": 2, "a": 5}) is not None
        assert state.modify("m", 10, lambda v: v + 1) == 11
        assert state.remove("keep") == 0
        state.rename("old", "new")
        assert state.clear_prefix("p:") == 2
        assert end_turn(state) == 2
        inside = dict(state.items())
        assert inside == {"a": 5, "s": 1, "u": 2, "m": 11, "new": "v"}
        assert in_other_thread(lambda: dict(state.items())) == {
            "a": 1,
            "old": "v",
            "p:x": 1,
            "p:y": 2,
            "turn:t": 1,
            "temp:t": 2,
            "keep": 0,
        }
        assert state.journal.cursor == start
        assert rec.calls == []
    assert dict(state.items()) == inside
    assert state.journal.cursor == start + 1
    assert len(rec.calls) == 1
    assert {c.origin for c in rec.calls[0]} == {"commit"}
    assert {c.key for c in rec.calls[0]} == {
        "s",
        "u",
        "a",
        "m",
        "keep",
        "old",
        "new",
        "p:x",
        "p:y",
        "turn:t",
        "temp:t",
    }


def test_end_turn_inside_transaction_only_clears_turn_and_temp() -> None:
    state = State()
    state.update({"turn:a": 1, "temp:b": 2, "session:c": 3})
    with state.transaction():
        state.set("turn:new", 4)
        assert end_turn(state) == 3
        assert state.keys() == ["session:c"]
    assert state.keys() == ["session:c"]


def test_clear_prefix_inside_transaction_sees_buffered_keys() -> None:
    state = State()
    state.set("p:a", 1)
    with state.transaction():
        state.set("p:b", 2)
        state.set("q", 3)
        assert state.clear_prefix("p:") == 2
    assert state.keys() == ["q"]


def test_state_remove_of_missing_key_inside_transaction_raises_missing_key_error(
    state: State,
) -> None:
    # BUG: inside a transaction state.remove(missing) returns an internal sentinel object.
    with state.transaction():
        with pytest.raises(MissingKeyError, match="'nope'"):
            state.remove("nope")
        assert state.remove("nope", "dflt") == "dflt"


def test_rename_inside_transaction_moves_value(state: State) -> None:
    with state.transaction():
        state.rename("p:one", "p:uno")
        assert state.get("p:uno") == "one"
        assert "p:one" not in state
    assert state.get("p:uno") == "one"
    assert "p:one" not in state


def test_rename_of_missing_key_inside_transaction_raises(state: State) -> None:
    with state.transaction(), pytest.raises(MissingKeyError):
        state.rename("nope", "other")
    assert "other" not in state


def test_rename_inside_transaction_refuses_existing_target_without_overwrite(
    state: State,
) -> None:
    # BUG: rename() inside a transaction ignores overwrite=False and clobbers the target.
    before = committed_view(state)
    with state.transaction():
        with pytest.raises(KeyExistsError):
            state.rename("a", "p:one")
        assert state.get("p:one") == "one"
        assert state.get("a") == 1
    assert committed_view(state) == before


def test_rename_inside_transaction_keeps_provenance(state: State) -> None:
    # BUG: outside a transaction rename keeps the value's provenance; inside it is replaced.
    with state.transaction():
        state.rename("b", "b2")
    prov = state.provenance("b2")
    assert prov is not None
    assert (prov.source, prov.writer) == ("agent", "seed")


def test_modify_inside_transaction_keeps_confidence_and_meta() -> None:
    # BUG: state.modify(confidence=, meta=) inside a transaction drops both.
    state = State()
    with state.transaction():
        state.modify("n", 0, lambda v: v + 1, source="agent", confidence=0.5, meta={"why": "t"})
    prov = state.provenance("n")
    assert prov is not None
    assert (prov.source, prov.confidence, prov.meta) == ("agent", 0.5, {"why": "t"})


def test_update_writing_and_removing_same_key_inside_transaction_raises(state: State) -> None:
    # BUG: outside a transaction this raises StateValueError; inside it silently removes.
    with pytest.raises(StateValueError, match="'a'"):
        state.update({"a": 5}, remove=["a"])
    with state.transaction():
        with pytest.raises(StateValueError, match="'a'"):
            state.update({"a": 5}, remove=["a"])
        assert state.get("a") == 1
    assert state.get("a") == 1


def test_state_meta_read_inside_transaction_returns_provenance(state: State) -> None:
    # BUG: state.get("state_meta:<key>") returns None inside a transaction.
    outside = state.get("state_meta:b")
    assert outside is not None
    with state.transaction():
        assert state.get("state_meta:b") == outside


def test_get_of_invalid_key_inside_transaction_raises_like_outside(state: State) -> None:
    # BUG: state.get("bad key") raises InvalidKeyError outside a transaction but not inside.
    with pytest.raises(InvalidKeyError):
        state.get("bad key")
    with state.transaction(), pytest.raises(InvalidKeyError):
        state.get("bad key")


# -- validation raises at the offending line ----------------------------------------------------


def _governed_state() -> State:
    state = State()
    state.set("ro", "fixed")
    state.set("lim", "x")
    state.policy("ro", read_only=True)
    state.policy("verify:*", writers=["verify"])
    state.policy("lim", max_bytes=5)
    state.declare("n", int)
    return state


@pytest.mark.parametrize(
    ("write", "error"),
    [
        pytest.param(lambda s: s.set("bad key", 1), InvalidKeyError, id="key-space"),
        pytest.param(lambda s: s.set("a::b", 1), InvalidKeyError, id="key-empty-segment"),
        pytest.param(lambda s: s.set("a*", 1), InvalidKeyError, id="key-star"),
        pytest.param(lambda s: s.set(7, 1), InvalidKeyError, id="key-int"),
        pytest.param(lambda s: s.update({"ok": 1, "bad key": 2}), InvalidKeyError, id="update"),
        pytest.param(lambda s: s.set("v", {1, 2}), StateValueError, id="set-value"),
        pytest.param(lambda s: s.set("v", float("nan")), StateValueError, id="nan"),
        pytest.param(lambda s: s.set("v", {1: "x"}), StateValueError, id="int-dict-key"),
        pytest.param(lambda s: s.set("v", 1, confidence=2.0), StateValueError, id="confidence"),
        pytest.param(lambda s: s.set("v", 1, source=""), StateValueError, id="source"),
        pytest.param(lambda s: s.set("n", "five"), SchemaError, id="schema"),
        pytest.param(lambda s: s.set(Key("k", int), "x"), SchemaError, id="typed-key"),
        pytest.param(lambda s: s.update({"ok": 1, "n": "x"}), SchemaError, id="update-schema"),
        pytest.param(lambda s: s.modify("n", 0, lambda v: "x"), SchemaError, id="modify-schema"),
        pytest.param(lambda s: s.set("ro", 1), ReadOnlyError, id="read-only"),
        pytest.param(lambda s: s.remove("ro"), ReadOnlyError, id="remove-read-only"),
        pytest.param(lambda s: s.clear_prefix("r"), ReadOnlyError, id="clear-read-only"),
        pytest.param(lambda s: s.rename("ro", "x"), ReadOnlyError, id="rename-read-only"),
        pytest.param(lambda s: s.set("state_meta:x", 1), ReadOnlyError, id="state-meta"),
        pytest.param(lambda s: s.set("verify:r", 1), PolicyViolation, id="writer"),
        pytest.param(lambda s: s.set("lim", "toolong"), PolicyViolation, id="size"),
    ],
)
def test_failing_validation_raises_at_that_line(
    write: Callable[[State], Any], error: type[Exception]
) -> None:
    state = _governed_state()
    before = committed_view(state)
    with state.transaction() as tx:
        tx.set("first", 1)
        with pytest.raises(error):
            write(state)
        assert tx.status == "open"
        assert "ok" not in state
        assert state.get("ro") == "fixed"
        assert state.get("n") is None
        tx.set("second", 2)
    assert state.pick("first", "second", "ok", "v", "n", "k", "verify:r", "x") == {
        "first": 1,
        "second": 2,
    }
    assert state.get("ro") == "fixed"
    assert state.get("lim") == "x"
    assert state.journal.cursor == before[1] + 1


def test_uncaught_validation_error_rolls_the_whole_block_back() -> None:
    state = _governed_state()
    before = committed_view(state)

    def body(tx: Transaction) -> None:
        state.set("fine", 1)
        state.set("n", "not a number")

    with pytest.raises(SchemaError):
        run_in(state.transaction(), body)
    assert committed_view(state) == before


def test_max_keys_violation_at_commit_writes_nothing() -> None:
    state = State()
    state.policy(max_keys=2)
    state.set("a", 1)
    before = committed_view(state)
    tx = state.transaction()

    def body(tx: Transaction) -> None:
        tx.set("a", 2)
        tx.set("b", 1)
        tx.set("c", 1)

    with pytest.raises(PolicyViolation, match="capped at 2 keys"):
        run_in(tx, body)
    assert tx.status == "rolled_back"
    assert committed_view(state) == before


def test_typed_key_inside_transaction() -> None:
    state = State()
    count = Key("count", int)
    with state.transaction() as tx:
        tx.set(count, "5")
        assert tx.get(count) == 5
        assert state.get(count) == 5
        assert state.get("count") == 5
    assert state.get("count") == 5


# -- property: rollback restores, commit equals the dict model -----------------------------------

KEYS = ["a", "b", "p:x", "p:y", "q", "turn:t", "temp:u"]
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.text(alphabet="xyé", max_size=3)
)
VALUES = st.one_of(
    _scalars,
    st.lists(_scalars, max_size=3),
    st.dictionaries(st.sampled_from(["k", "l"]), _scalars, max_size=2),
)
_key = st.sampled_from(KEYS)

OPS = st.one_of(
    st.tuples(st.just("set"), st.booleans(), _key, VALUES),
    st.tuples(st.just("remove"), st.booleans(), _key),
    st.tuples(
        st.just("update"),
        st.booleans(),
        st.dictionaries(_key, VALUES, max_size=3),
        st.lists(_key, max_size=2),
    ),
    st.tuples(st.just("modify"), st.booleans(), _key, st.integers(0, 9)),
    st.tuples(st.just("rename"), _key, _key),
    st.tuples(st.just("clear_prefix"), st.sampled_from(["p:", "t", "", "zz"])),
    st.tuples(st.just("end_turn")),
)


def _canon(d: dict[str, Any]) -> str:
    return json.dumps(d, sort_keys=True)


def _apply(state: State, tx: Any, model: dict[str, Any], op: tuple[Any, ...]) -> None:
    """Apply ``op`` through the transaction (or the state) and to the dict model."""
    kind = op[0]
    if kind == "set":
        _, via_tx, key, value = op
        (tx if via_tx else state).set(key, value)
        model[key] = value
    elif kind == "remove":
        _, via_tx, key = op
        got = (tx if via_tx else state).remove(key, "<absent>")
        assert got == model.pop(key, "<absent>")
    elif kind == "update":
        _, via_tx, mapping, removes = op
        removes = [k for k in removes if k not in mapping]
        (tx if via_tx else state).update(mapping, remove=removes)
        model.update(mapping)
        for k in removes:
            model.pop(k, None)
    elif kind == "modify":
        _, via_tx, key, n = op
        expected = [model.get(key, 0), n]
        got = (tx if via_tx else state).modify(key, 0, lambda cur: [cur, n])
        assert _canon({"v": got}) == _canon({"v": expected})
        model[key] = expected
    elif kind == "rename":
        _, old, new = op
        if old not in model or new in model:
            return
        state.rename(old, new)
        model[new] = model.pop(old)
    elif kind == "clear_prefix":
        _, prefix = op
        doomed = [k for k in model if k.startswith(prefix)]
        assert state.clear_prefix(prefix) == len(doomed)
        for k in doomed:
            del model[k]
    elif kind == "end_turn":
        doomed = [k for k in model if k.startswith(("turn:", "temp:"))]
        assert end_turn(state) == len(doomed)
        for k in doomed:
            del model[k]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    initial=st.lists(st.tuples(_key, VALUES), max_size=8),
    initial_removes=st.lists(_key, max_size=2),
    ops=st.lists(OPS, max_size=12),
    ending=st.sampled_from(["commit", "rollback", "exception"]),
)
def test_property_rollback_restores_and_commit_matches_model(
    initial: list[tuple[str, Any]],
    initial_removes: list[str],
    ops: list[tuple[Any, ...]],
    ending: str,
) -> None:
    state = State()
    for key, value in initial:
        state.set(key, value)
    for key in initial_removes:
        state.remove(key, None)
    snapshot, cursor, journal = committed_view(state)
    start_model = {k: v["value"] for k, v in snapshot["entries"].items()}
    start_versions = {k: v["version"] for k, v in snapshot["entries"].items()}
    calls: list[tuple[Change, ...]] = []
    state.subscribe(calls.append)

    model = dict(start_model)
    try:
        with state.transaction() as tx:
            for op in ops:
                _apply(state, tx, model, op)
                assert _canon(dict(state.items())) == _canon(model)
                assert sorted(tx.keys()) == sorted(model)
            # Still invisible from outside the transaction.
            assert _canon(committed_items(state)) == _canon(start_model)
            assert state.journal.cursor == cursor
            if ending == "rollback":
                tx.rollback()
            elif ending == "exception":
                raise Boom
    except Boom:
        assert ending == "exception"

    if ending != "commit":
        assert tx.status == "rolled_back"
        assert state.snapshot() == snapshot
        assert state.journal.cursor == cursor
        assert state.journal.since(0) == journal
        assert calls == []
        return

    assert tx.status == "committed"
    assert _canon(dict(state.items())) == _canon(model)
    changed = {
        k
        for k in set(start_model) | set(model)
        if k not in start_model
        or k not in model
        or _canon({"v": start_model[k]}) != _canon({"v": model[k]})
    }
    new = state.journal.since(cursor)
    assert {m.key for m in new} == changed
    if not changed:
        assert state.journal.cursor == cursor
        assert calls == []
        assert state.snapshot() == snapshot
        return
    assert state.journal.cursor == cursor + 1
    assert {m.seq for m in new} == {cursor + 1}
    assert {m.origin for m in new} == {"commit"}
    assert len(calls) == 1
    assert {c.key for c in calls[0]} == changed
    for key in model:
        if key not in changed:
            assert state.version(key) == start_versions[key]
        else:
            assert state.version(key) == start_versions.get(key, 0) + 1
    for key in set(start_model) - set(model):
        assert state.version(key) == 0
