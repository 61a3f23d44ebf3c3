"""Change signals: ``state.changed`` (blinker), ``state.subscribe`` and the delivery rules.

Covers: one signal per committed batch, nothing for no-op writes, the ``Change`` record, key and
pattern filtering, subscription order, closing, failure isolation (``receiver_failed`` and the
``slateflow.state`` logger), breadth-first delivery in commit order, long receiver-driven chains
and the key index.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from blinker import Signal

from slateflow import Change, Key, State
from slateflow.conversation import end_turn
from slateflow.errors import DeliveryChainError, InvalidKeyError
from slateflow.state import Provenance, Subscription
from slateflow.state.chains import MAX_CHAIN


class Recorder:
    """A ``state.changed`` receiver that keeps every (sender, changes) it is sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Change, ...]]] = []

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        assert set(kwargs) == {"changes"}
        self.calls.append((sender, kwargs["changes"]))

    @property
    def batches(self) -> list[tuple[Change, ...]]:
        return [changes for _, changes in self.calls]

    def keys(self) -> list[list[str]]:
        return [[c.key for c in changes] for changes in self.batches]


class Collector:
    """A subscription callback that keeps every batch it is given."""

    def __init__(self) -> None:
        self.batches: list[tuple[Change, ...]] = []

    def __call__(self, changes: tuple[Change, ...]) -> None:
        self.batches.append(changes)

    def keys(self) -> list[list[str]]:
        return [[c.key for c in changes] for changes in self.batches]


@pytest.fixture
def state() -> State:
    return State()


@pytest.fixture
def recorder(state: State) -> Recorder:
    rec = Recorder()
    state.changed.connect(rec)
    return rec


# -- the changed signal --------------------------------------------------------------------------


def test_changed_is_a_blinker_signal(state: State) -> None:
    assert isinstance(state.changed, Signal)
    assert isinstance(state.receiver_failed, Signal)
    assert state.changed is not State().changed


def test_set_sends_one_signal_with_a_full_change() -> None:
    state = State(clock=lambda: 1_700_000_000.5)
    rec = Recorder()
    state.changed.connect(rec)

    version = state.set(
        "booking:date", "2024-05-01", source="agent", writer="parser", confidence=0.5
    )

    assert version == 1
    assert len(rec.calls) == 1
    sender, changes = rec.calls[0]
    assert sender is state
    assert type(changes) is tuple
    assert len(changes) == 1
    change = changes[0]
    assert isinstance(change, Change)
    assert change.key == "booking:date"
    assert change.old is None
    assert change.new == "2024-05-01"
    assert change.version == 1
    assert change.seq == 1 == state.journal.cursor
    assert change.origin == "set"
    assert change.removed is False
    assert change.created is True
    assert change.at == datetime(2023, 11, 14, 22, 13, 20, 500000, tzinfo=UTC)
    assert isinstance(change.provenance, Provenance)
    assert change.provenance.source == "agent"
    assert change.provenance.writer == "parser"
    assert change.provenance.confidence == 0.5
    assert change.provenance.at == change.at


@pytest.mark.parametrize("now", [1_700_000_000.25, 1_700_000_000.001, 1_234_567.125, 86_400.0])
def test_change_at_is_the_clock_time(now: float) -> None:
    state = State(clock=lambda: now)
    rec = Recorder()
    state.changed.connect(rec)
    state.set("a", 1)
    expected = datetime.fromtimestamp(now, UTC)
    assert rec.batches[0][0].at == expected
    entry = state.entry("a")
    assert entry is not None
    assert entry.updated_at == expected


def test_second_write_reports_old_value_and_bumps_version(state: State, recorder: Recorder) -> None:
    state.set("a", 1)
    state.set("a", 2)
    change = recorder.batches[1][0]
    assert (change.old, change.new, change.version, change.seq) == (1, 2, 2, 2)
    assert change.created is False


def test_remove_sends_a_removal_change(state: State, recorder: Recorder) -> None:
    state.set("a", {"x": 1})
    assert state.remove("a") == {"x": 1}
    (change,) = recorder.batches[-1]
    assert change.removed is True
    assert change.old == {"x": 1}
    assert change.new is None
    assert change.version == 0
    assert change.origin == "remove"


def test_update_sends_one_signal_for_the_whole_batch(state: State, recorder: Recorder) -> None:
    state.set("gone", 0)
    seq = state.update({"a": 1, "b": 2}, remove=["gone", "never-there"])
    assert len(recorder.calls) == 2
    changes = recorder.batches[1]
    assert [c.key for c in changes] == ["a", "b", "gone"]
    assert {c.seq for c in changes} == {seq} == {state.journal.cursor}
    assert {c.origin for c in changes} == {"update"}
    assert [c.removed for c in changes] == [False, False, True]


def test_transaction_sends_one_signal_at_commit(state: State, recorder: Recorder) -> None:
    with state.transaction() as tx:
        tx.set("a", 1)
        state.set("b", 2)  # buffered in the transaction too
        assert recorder.calls == []
    assert recorder.keys() == [["a", "b"]]
    assert {c.origin for c in recorder.batches[0]} == {"commit"}


def test_rolled_back_transaction_sends_nothing(state: State, recorder: Recorder) -> None:
    def failing_block() -> None:
        with state.transaction() as tx:
            tx.set("a", 1)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        failing_block()
    assert recorder.calls == []
    assert "a" not in state


@pytest.mark.parametrize(
    ("op", "origin", "keys"),
    [
        (lambda s: s.clear_prefix("x:"), "clear_prefix", ["x:1", "x:2"]),
        (lambda s: end_turn(s), "clear_prefix", ["turn:a", "temp:b"]),
        (lambda s: s.rename("x:1", "y"), "rename", ["x:1", "y"]),
        (lambda s: s.modify("x:1", 0, lambda v: v + 1), "modify", ["x:1"]),
    ],
)
def test_each_multi_key_operation_is_one_signal(
    state: State, op: Any, origin: str, keys: list[str]
) -> None:
    state.update({"x:1": 1, "x:2": 2, "turn:a": 3, "temp:b": 4, "keep": 5})
    rec = Recorder()
    state.changed.connect(rec)
    op(state)
    assert len(rec.calls) == 1
    assert sorted(c.key for c in rec.batches[0]) == sorted(keys)
    assert {c.origin for c in rec.batches[0]} == {origin}


def test_writes_that_change_nothing_send_nothing(state: State, recorder: Recorder) -> None:
    state.update({"a": 1, "b": [1, {"c": 2.5}], "n": None})
    before = (state.journal.cursor, len(recorder.calls), state.version("a"))

    assert state.set("a", 1) == 1
    state.set("b", [1, {"c": 2.5}])
    state.set("n", None)
    state.update({"a": 1, "b": [1, {"c": 2.5}]})
    state.update({}, remove=["missing"])
    state.modify("a", 0, lambda v: v)
    assert state.remove("missing", None) is None
    assert state.clear_prefix("nothing:") == 0
    assert end_turn(state) == 0
    with state.transaction() as tx:
        tx.set("a", 1)

    assert (state.journal.cursor, len(recorder.calls), state.version("a")) == before


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (1, 1.0),
        (1, True),
        (0, False),
        (0.0, -0.0),
        ({"a": 1}, {"a": 1.0}),
        ([1, 2], [1, True]),
        ("1", 1),
    ],
)
def test_values_equal_in_python_but_different_in_json_do_signal(
    state: State, recorder: Recorder, first: Any, second: Any
) -> None:
    state.set("k", first)
    state.set("k", second)
    assert len(recorder.calls) == 2
    assert state.version("k") == 2


def test_change_old_and_new_are_private_copies(state: State, recorder: Recorder) -> None:
    state.set("k", {"items": [1]})
    state.set("k", {"items": [1, 2]})
    change = recorder.batches[1][0]

    change.new["items"].append(99)
    change.old["items"].clear()

    assert change.new == {"items": [1, 2]}
    assert change.old == {"items": [1]}
    assert state.get("k") == {"items": [1, 2]}


def test_receiver_connected_to_one_state_ignores_another() -> None:
    s1, s2 = State(), State()
    rec = Recorder()
    s1.changed.connect(rec, sender=s1)
    s2.set("a", 1)
    s1.set("b", 1)
    assert rec.keys() == [["b"]]


def test_disconnected_receiver_is_not_called(state: State, recorder: Recorder) -> None:
    state.set("a", 1)
    state.changed.disconnect(recorder)
    state.set("a", 2)
    assert len(recorder.calls) == 1


# -- subscribe -----------------------------------------------------------------------------------


def test_subscribe_without_filters_gets_every_batch(state: State) -> None:
    got = Collector()
    sub = state.subscribe(got)
    assert isinstance(sub, Subscription)
    state.set("a", 1)
    state.update({"b": 1, "c:d": 2})
    state.remove("a")
    assert got.keys() == [["a"], ["b", "c:d"], ["a"]]


def test_subscribe_by_keys_gets_only_matching_changes_once_per_batch(state: State) -> None:
    got = Collector()
    state.subscribe(got, keys=["a", "c"])
    state.set("b", 1)
    state.update({"a": 1, "b": 2, "c": 3})
    state.set("c", 4)
    assert got.keys() == [["a", "c"], ["c"]]
    assert [c.new for c in got.batches[0]] == [1, 3]


def test_subscribe_accepts_typed_keys(state: State) -> None:
    got = Collector()
    state.subscribe(got, keys=[Key("party", int)])
    state.set("party", 4)
    state.set("other", 4)
    assert got.keys() == [["party"]]


def test_subscribe_by_pattern(state: State) -> None:
    got = Collector()
    state.subscribe(got, pattern="user:*")
    state.update({"user:name": "Ada", "session:id": 1, "user:card:last4": "1234"})
    state.set("users", 1)
    state.set("user", 1)
    assert got.keys() == [["user:name", "user:card:last4"]]


def test_subscribe_by_several_patterns(state: State) -> None:
    got = Collector()
    state.subscribe(got, pattern=["*:result", "booking:*"])
    state.update({"verify:result": 1, "booking:date": 2, "verify:status": 3})
    state.set("a:b:result", 4)
    assert got.keys() == [["verify:result", "booking:date"], ["a:b:result"]]


def test_pattern_without_star_is_an_exact_key(state: State) -> None:
    got = Collector()
    state.subscribe(got, pattern="user")
    state.update({"user": 1, "user:name": 2, "username": 3})
    assert got.keys() == [["user"]]


def test_keys_and_pattern_overlap_delivers_each_change_once(state: State) -> None:
    got = Collector()
    state.subscribe(got, keys=["user:name", "other"], pattern="user:*")
    state.update({"user:name": "Ada", "user:age": 3, "other": 1, "x": 0})
    assert got.keys() == [["user:name", "user:age", "other"]]
    state.set("user:name", "Bo")
    assert got.keys()[-1] == ["user:name"]
    assert len(got.batches) == 2


def test_subscribe_rejects_bad_arguments(state: State) -> None:
    with pytest.raises(TypeError, match="callable"):
        state.subscribe("not callable")  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError):
        state.subscribe(Collector(), keys=["bad key"])
    with pytest.raises(InvalidKeyError):
        state.subscribe(Collector(), pattern="bad pattern*")
    assert state.engine.delivery.subscriptions.count == 0


def test_subscriptions_are_called_in_the_order_they_were_made(state: State) -> None:
    calls: list[str] = []

    def sub(name: str) -> Any:
        return lambda changes: calls.append(name)

    state.subscribe(sub("pattern-1"), pattern="a*")
    state.subscribe(sub("key-2"), keys=["a"])
    state.subscribe(sub("all-3"))
    state.subscribe(sub("key-4"), keys=["b", "a"])
    state.subscribe(sub("pattern-5"), pattern="*")

    state.set("a", 1)
    assert calls == ["pattern-1", "key-2", "all-3", "key-4", "pattern-5"]
    calls.clear()
    state.update({"b": 1, "a": 2})
    assert calls == ["pattern-1", "key-2", "all-3", "key-4", "pattern-5"]
    calls.clear()
    state.set("b", 2)
    assert calls == ["all-3", "key-4", "pattern-5"]


def test_close_stops_delivery_and_is_idempotent(state: State) -> None:
    got = Collector()
    sub = state.subscribe(got, keys=["a"])
    state.set("a", 1)
    sub.close()
    sub.close()
    state.set("a", 2)
    assert got.keys() == [["a"]]
    assert state.engine.delivery.subscriptions.count == 0


def test_subscription_is_a_context_manager(state: State) -> None:
    got = Collector()
    with state.subscribe(got, pattern="a*") as sub:
        assert isinstance(sub, Subscription)
        state.set("ab", 1)
    state.set("ab", 2)
    assert got.keys() == [["ab"]]
    assert state.engine.delivery.subscriptions.count == 0


def test_closing_one_subscription_leaves_others(state: State) -> None:
    a, b, c = Collector(), Collector(), Collector()
    state.subscribe(a, keys=["k"])
    sub_b = state.subscribe(b, keys=["k"])
    state.subscribe(c, pattern="k")
    sub_b.close()
    state.set("k", 1)
    assert (len(a.batches), len(b.batches), len(c.batches)) == (1, 0, 1)


def test_closing_inside_a_callback_stops_later_batches(state: State) -> None:
    got = Collector()
    subs: list[Subscription] = []

    def closer(changes: tuple[Change, ...]) -> None:
        subs[1].close()

    subs.append(state.subscribe(closer, keys=["k"]))
    subs.append(state.subscribe(got, keys=["k"]))
    state.set("k", 1)
    state.set("k", 2)
    assert all(c.new != 2 for batch in got.batches for c in batch)


def test_subscription_repr_names_what_it_watches(state: State) -> None:
    def on_booking(changes: tuple[Change, ...]) -> None:
        pass

    sub = state.subscribe(on_booking, keys=["booking:date"], pattern="user:*")
    text = repr(sub)
    assert "on_booking" in text
    assert "booking:date" in text
    assert "user:*" in text


def test_callback_reads_the_committed_value(state: State) -> None:
    seen: list[Any] = []
    state.subscribe(lambda changes: seen.append(state.get("a")), keys=["a"])
    state.set("a", 1)
    assert seen == [1]


# -- failure isolation ---------------------------------------------------------------------------


class FailureLog:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        self.calls.append({"sender": sender, **kwargs})


def test_failing_subscriber_does_not_break_the_write_or_others(
    state: State, caplog: pytest.LogCaptureFixture
) -> None:
    failures = FailureLog()
    state.receiver_failed.connect(failures)
    before, after = Collector(), Collector()
    error = ValueError("subscriber exploded")

    def bad(changes: tuple[Change, ...]) -> None:
        raise error

    state.subscribe(before)
    state.subscribe(bad, keys=["a"])
    state.subscribe(after)

    with caplog.at_level(logging.ERROR, logger="slateflow.state"):
        assert state.set("a", 1) == 1

    assert state.get("a") == 1
    assert state.journal.cursor == 1
    assert len(before.batches) == len(after.batches) == 1
    assert len(failures.calls) == 1
    call = failures.calls[0]
    assert call["sender"] is state
    assert call["receiver"] is bad
    assert call["error"] is error
    assert [c.key for c in call["changes"]] == ["a"]
    records = [r for r in caplog.records if r.name == "slateflow.state"]
    assert len(records) == 1
    assert records[0].levelno == logging.ERROR
    assert records[0].exc_info is not None
    assert records[0].exc_info[1] is error
    assert "bad" in records[0].getMessage()


def test_failing_subscriber_in_a_batch(state: State) -> None:
    failures = FailureLog()
    state.receiver_failed.connect(failures)
    after = Collector()

    def bad(changes: tuple[Change, ...]) -> None:
        raise KeyError("nope")

    state.subscribe(bad, pattern="x:*")
    state.subscribe(after, pattern="x:*")
    state.update({"x:1": 1, "x:2": 2})
    assert state.pick("x:1", "x:2") == {"x:1": 1, "x:2": 2}
    assert after.keys() == [["x:1", "x:2"]]
    assert len(failures.calls) == 1
    assert isinstance(failures.calls[0]["error"], KeyError)


def test_failing_blinker_receiver_is_isolated_and_reported(
    state: State, caplog: pytest.LogCaptureFixture
) -> None:
    failures = FailureLog()
    state.receiver_failed.connect(failures)
    later = Recorder()
    got = Collector()

    def bad(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver exploded")

    state.changed.connect(bad)
    state.changed.connect(later)
    state.subscribe(got)

    with caplog.at_level(logging.ERROR, logger="slateflow.state"):
        state.set("a", 1)
        state.set("a", 2)

    assert state.get("a") == 2
    assert len(later.calls) == 2
    assert len(got.batches) == 2
    assert [c["receiver"] for c in failures.calls] == [bad, bad]
    assert all(isinstance(c["error"], RuntimeError) for c in failures.calls)
    assert [c["changes"][0].new for c in failures.calls] == [1, 2]
    assert len([r for r in caplog.records if r.name == "slateflow.state"]) == 2


def test_failing_receiver_failed_handler_is_only_logged(
    state: State, caplog: pytest.LogCaptureFixture
) -> None:
    def bad_handler(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("handler exploded too")

    def bad(changes: tuple[Change, ...]) -> None:
        raise ValueError("first")

    after = Collector()
    state.receiver_failed.connect(bad_handler)
    state.subscribe(bad)
    state.subscribe(after)
    with caplog.at_level(logging.ERROR, logger="slateflow.state"):
        state.set("a", 1)
    assert state.get("a") == 1
    assert len(after.batches) == 1
    assert len([r for r in caplog.records if r.name == "slateflow.state"]) == 2
    state.set("a", 2)
    assert len(after.batches) == 2


def test_base_exceptions_are_not_swallowed(state: State) -> None:
    class Stop(BaseException):
        pass

    def stop(changes: tuple[Change, ...]) -> None:
        raise Stop

    sub = state.subscribe(stop)
    with pytest.raises(Stop):
        state.set("a", 1)
    assert state.get("a") == 1  # committed before delivery
    sub.close()
    got = Collector()
    state.subscribe(got)
    state.set("a", 2)  # delivery still works afterwards
    assert got.keys() == [["a"]]


# -- breadth-first delivery ----------------------------------------------------------------------


def test_receiver_write_is_visible_at_once_but_delivered_after(state: State) -> None:
    log: list[str] = []

    def first(changes: tuple[Change, ...]) -> None:
        for c in changes:
            log.append(f"first:{c.key}")
            if c.key == "a":
                state.set("b", 1)
                log.append(f"b is {state.get('b')}")

    def second(changes: tuple[Change, ...]) -> None:
        log.extend(f"second:{c.key}" for c in changes)

    state.subscribe(first)
    state.subscribe(second)
    state.set("a", 1)
    assert log == ["first:a", "b is 1", "second:a", "first:b", "second:b"]


def test_receiver_writes_are_delivered_in_commit_order(state: State) -> None:
    seen: list[tuple[str, int]] = []

    def react(changes: tuple[Change, ...]) -> None:
        for c in changes:
            seen.append((c.key, c.seq))
            if c.key == "start":
                state.set("x", 1)
                state.update({"y": 1, "z": 1})
                state.set("x", 2)

    state.subscribe(react)
    state.set("start", True)
    assert seen == [("start", 1), ("x", 2), ("y", 3), ("z", 3), ("x", 4)]


def test_blinker_receiver_write_is_breadth_first_too(state: State) -> None:
    log: list[str] = []

    def receiver(sender: State, changes: tuple[Change, ...]) -> None:
        change = changes[0]
        log.append(f"signal:{change.key}={change.new}")
        if change.key == "a":
            sender.set("b", sender.get("a") + 1)
            log.append(f"b={sender.get('b')}")

    state.changed.connect(receiver)
    state.subscribe(lambda changes: log.append(f"sub:{changes[0].key}"))
    state.set("a", 1)
    assert log == ["signal:a=1", "b=2", "sub:a", "signal:b=2", "sub:b"]


def test_long_chain_of_receiver_writes_does_not_recurse(state: State) -> None:
    n = MAX_CHAIN - 1  # as deep as a chain may go (deeper ones are stopped: see below)
    seen: list[int] = []

    def step(changes: tuple[Change, ...]) -> None:
        value = changes[0].new
        seen.append(value)
        if value < n:
            state.set("counter", value + 1)

    state.subscribe(step, keys=["counter"])
    state.set("counter", 0)
    assert state.get("counter") == n
    assert len(seen) == n + 1
    assert seen[0] == 0
    assert seen[-1] == n
    assert seen == sorted(seen)
    assert state.journal.cursor == n + 1


def test_write_during_delivery_reaches_a_receiver_that_already_ran(state: State) -> None:
    got = Collector()
    state.subscribe(got)

    def later(changes: tuple[Change, ...]) -> None:
        if changes[0].key == "a":
            state.set("b", 1)

    state.subscribe(later)
    state.set("a", 1)
    assert got.keys() == [["a"], ["b"]]


# -- the key index -------------------------------------------------------------------------------


def test_many_subscriptions_on_other_keys_are_not_called(state: State) -> None:
    called: list[str] = []

    def make(name: str) -> Any:
        return lambda changes: called.append(name)

    for i in range(10_000):
        state.subscribe(make(f"key{i}"), keys=[f"other:{i}"])
    for i in range(100):
        state.subscribe(make(f"pattern{i}"), pattern=f"other:{i}:*")
    target = Collector()
    state.subscribe(target, keys=["target"])

    state.set("target", 1)
    state.update({"target": 2, "unrelated": 1})

    assert called == []
    assert target.keys() == [["target"], ["target"]]
    state.set("other:42", 1)
    state.set("other:7:x", 1)
    assert called == ["key42", "pattern7"]


def test_a_receiver_writing_the_key_it_listens_to_is_stopped_and_reported(state: State) -> None:
    failures: list[tuple[object, BaseException, tuple[Change, ...]]] = []
    state.receiver_failed.connect(
        lambda sender, receiver, error, changes: failures.append((receiver, error, changes)),
        weak=False,
    )
    state.subscribe(lambda changes: state.set("n", changes[0].new + 1), keys=["n"])
    state.set("n", 0)  # returns: the chain is stopped, not endless
    assert state.get("n") == MAX_CHAIN  # every write stands
    ((receiver, error, changes),) = failures
    assert receiver == "delivery chain"
    assert isinstance(error, DeliveryChainError)
    assert "stopped at n" in str(error)
    assert [c.key for c in changes] == ["n"]
    state.set("other", 1)  # the State still delivers: a new write starts a new chain
    state.set("n", -5)
    assert len(failures) == 2


def test_a_legitimate_cascade_past_the_cap_names_its_first_key_and_catches_up_on_resume(
    state: State,
) -> None:
    from slateflow.state import Derived

    failures: list[BaseException] = []
    state.receiver_failed.connect(
        lambda sender, receiver, error, changes: failures.append(error), weak=False
    )
    depth = MAX_CHAIN + 200  # 1,200 derived values, each built on the one before
    Derived(state, "d0", lambda s: s.get("base", 0) + 1, reads=["base"])
    for i in range(1, depth):
        Derived(
            state,
            f"d{i}",
            lambda s, i=i: s.get(f"derived:d{i - 1}", 0) + 1,
            reads=[f"derived:d{i - 1}"],
        )
    state.set("base", 10)
    (error,) = failures
    assert isinstance(error, DeliveryChainError)
    assert "began with a write to base" in str(error)
    assert "state.changed.resume()" in str(error)
    assert state.get(f"derived:d{depth - 1}") != 10 + depth  # stale: the chain was stopped
    assert state.changed.resume() == 1
    assert state.get(f"derived:d{depth - 1}") == 10 + depth  # caught up
    assert state.changed.resume() == 0  # nothing left held back
