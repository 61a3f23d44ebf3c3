"""Watchers: ``state.watch(key, when, action)`` and the predicates of :mod:`slateflow.when`."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slateflow import Change, Key, State
from slateflow.state import Subscription, when
from slateflow.state import Transition as Trigger


class Actions:
    """A watch action that keeps every change it is called with."""

    def __init__(self) -> None:
        self.changes: list[Change] = []

    def __call__(self, change: Change) -> None:
        self.changes.append(change)

    @property
    def pairs(self) -> list[tuple[Any, Any]]:
        return [(c.old, c.new) for c in self.changes]


def fires(trigger: Trigger, *writes: Any) -> list[tuple[Any, Any]]:
    """Apply ``writes`` to key ``k`` of a fresh state (``REMOVE`` removes it); return the
    ``(old, new)`` pairs the watcher fired on."""
    state = State()
    action = Actions()
    state.watch("k", trigger, action)
    for value in writes:
        if value is REMOVE:
            state.remove("k")
        else:
            state.set("k", value)
    return action.pairs


REMOVE: Any = object()


# -- watch itself --------------------------------------------------------------------------------


def test_watch_calls_action_with_the_change() -> None:
    state = State()
    action = Actions()
    sub = state.watch("score", when.changed(), action)
    assert isinstance(sub, Subscription)
    state.set("score", 1, source="agent")
    (change,) = action.changes
    assert isinstance(change, Change)
    assert (change.key, change.old, change.new, change.seq) == ("score", None, 1, 1)
    assert change.provenance.source == "agent"


def test_watch_ignores_other_keys_even_in_the_same_batch() -> None:
    state = State()
    action = Actions()
    state.watch("a", when.changed(), action)
    state.update({"b": 1, "a": 1, "a:b": 2})
    state.set("b", 2)
    assert [c.key for c in action.changes] == ["a"]


def test_watch_accepts_a_typed_key() -> None:
    state = State()
    action = Actions()
    state.watch(Key("party", int), when.changed_to(4), action)
    state.set("party", 4)
    assert action.pairs == [(None, 4)]


def test_watch_accepts_a_plain_callable() -> None:
    state = State()
    action = Actions()
    state.watch("n", lambda old, new: new == 2, action)
    for v in (1, 2, 3, 2):
        state.set("n", v)
    assert action.pairs == [(1, 2), (3, 2)]


def test_closing_a_watch_stops_it() -> None:
    state = State()
    action = Actions()
    with state.watch("n", when.changed(), action):
        state.set("n", 1)
    state.set("n", 2)
    assert action.pairs == [(None, 1)]
    assert state.engine.delivery.subscriptions.count == 0


def test_failing_action_is_reported_and_the_write_stands() -> None:
    state = State()
    failures: list[dict[str, Any]] = []
    state.receiver_failed.connect(lambda sender, **kw: failures.append(kw), weak=False)
    other = Actions()

    def bad(change: Change) -> None:
        raise ValueError("action exploded")

    state.watch("n", when.changed(), bad)
    state.watch("n", when.changed(), other)
    assert state.set("n", 1) == 1
    assert state.get("n") == 1
    assert other.pairs == [(None, 1)]
    assert len(failures) == 1
    assert isinstance(failures[0]["error"], ValueError)


def test_failing_predicate_is_reported_and_the_write_stands() -> None:
    state = State()
    failures: list[dict[str, Any]] = []
    state.receiver_failed.connect(lambda sender, **kw: failures.append(kw), weak=False)

    def broken(old: Any, new: Any) -> bool:
        raise ZeroDivisionError

    state.watch("n", when.custom(broken), Actions())
    state.set("n", 1)
    assert state.get("n") == 1
    assert [type(f["error"]) for f in failures] == [ZeroDivisionError]


def test_action_writing_the_watched_key_is_delivered_breadth_first() -> None:
    state = State()
    seen: list[int] = []

    def clamp(change: Change) -> None:
        seen.append(change.new)
        state.set("level", 10)

    state.watch("level", when.crossed_above(10), clamp)
    state.set("level", 50)
    assert state.get("level") == 10
    assert seen == [50]


def test_predicate_gets_copies() -> None:
    state = State()
    action = Actions()

    def meddle(old: Any, new: Any) -> bool:
        new.append("meddled")
        if old is not None:
            old.clear()
        return True

    state.watch("items", when.custom(meddle), action)
    state.set("items", [1])
    state.set("items", [1, 2])
    assert state.get("items") == [1, 2]
    assert action.pairs == [(None, [1]), ([1], [1, 2])]


def test_trigger_repr_names_the_predicate() -> None:
    assert repr(when.changed()) == "when.changed()"
    assert repr(when.changed_to("done")) == "when.changed_to('done')"
    assert repr(when.changed_from(3)) == "when.changed_from(3)"
    assert repr(when.crossed_above(0.8)) == "when.crossed_above(0.8)"
    assert repr(when.crossed_below(2)) == "when.crossed_below(2)"
    assert repr(when.became_true()) == "when.became_true()"
    assert repr(when.became_false()) == "when.became_false()"

    def is_big(old: Any, new: Any) -> bool:
        return bool(new)

    assert repr(when.custom(is_big)) == "when.custom(is_big)"
    assert repr(when.custom(is_big, "big")) == "when.big"


def test_triggers_return_real_bools() -> None:
    assert when.custom(lambda old, new: new)(None, [1]) is True
    assert when.custom(lambda old, new: new)(None, "") is False
    assert when.became_true()(None, "x") is True


# -- changed -------------------------------------------------------------------------------------


def test_changed_fires_on_every_change_and_removal_but_not_no_ops() -> None:
    assert fires(when.changed(), 1, 1, 2, REMOVE, None) == [
        (None, 1),
        (1, 2),
        (2, None),
        (None, None),
    ]


# -- changed_to / changed_from -------------------------------------------------------------------


def test_changed_to_fires_when_the_value_becomes_the_target() -> None:
    assert fires(when.changed_to("done"), "running", "done", "running", "done") == [
        ("running", "done"),
        ("running", "done"),
    ]


def test_changed_to_fires_on_creation() -> None:
    assert fires(when.changed_to("done"), "done") == [(None, "done")]


def test_changed_to_none_fires_on_removal_and_explicit_none() -> None:
    assert fires(when.changed_to(None), 1, REMOVE) == [(1, None)]
    assert fires(when.changed_to(None), 1, None) == [(1, None)]
    # Missing counts as None: creating the key as None is not a change *to* None.
    assert fires(when.changed_to(None), None, REMOVE) == []


@pytest.mark.parametrize(
    ("target", "written", "expected"),
    [
        (1, True, False),
        (True, 1, False),
        (1, 1.0, False),
        (0, False, False),
        (0.0, -0.0, False),
        (1, 1, True),
        (True, True, True),
        ({"a": 1}, {"a": 1}, True),
        ({"a": 1}, {"a": True}, False),
        ([1, 2], [1, 2], True),
    ],
)
def test_changed_to_uses_json_equality(target: Any, written: Any, expected: bool) -> None:
    assert bool(fires(when.changed_to(target), "start", written)) is expected


def test_changed_from_fires_when_the_value_leaves_the_source() -> None:
    assert fires(when.changed_from("idle"), "idle", "busy", "idle", "idle", "done") == [
        ("idle", "busy"),
        ("idle", "done"),
    ]


def test_changed_from_fires_on_removal() -> None:
    assert fires(when.changed_from(5), 5, REMOVE) == [(5, None)]


def test_changed_from_none_fires_on_creation() -> None:
    assert fires(when.changed_from(None), 0, 1) == [(None, 0)]
    assert fires(when.changed_from(None), None, 1) == [(None, 1)]


def test_changed_from_distinguishes_bool_int_float() -> None:
    # True is not 1, so the value never was 1.
    assert fires(when.changed_from(1), True, "x") == []
    assert fires(when.changed_from(True), True, 1) == [(True, 1)]
    assert fires(when.changed_from(1), 1, 1.0) == [(1, 1.0)]
    assert fires(when.changed_from(0.0), 0.0, -0.0) == [(0.0, -0.0)]
    assert fires(when.changed_from(0), False, 0) == []


# -- crossed_above / crossed_below ---------------------------------------------------------------


def test_crossed_above_fires_only_on_the_crossing() -> None:
    trigger = when.crossed_above(0.8)
    assert fires(trigger, 0.1, 0.8, 0.81, 0.9, 0.5, 1) == [(0.8, 0.81), (0.5, 1)]


def test_crossed_above_from_missing_counts_as_crossing() -> None:
    assert fires(when.crossed_above(10), 11) == [(None, 11)]
    assert fires(when.crossed_above(10), 11, REMOVE, 12) == [(None, 11), (None, 12)]


def test_crossed_above_threshold_itself_is_not_above() -> None:
    assert fires(when.crossed_above(10), 5, 10, 10.0) == []


def test_crossed_above_ignores_non_numbers() -> None:
    trigger = when.crossed_above(0)
    # True is not a number here, even though True > 0 in Python.
    assert fires(trigger, -1, True) == []
    assert fires(trigger, -1, "5", [5], {"v": 5}) == []
    # Coming from a non-number (or removal) counts like coming from below.
    assert fires(trigger, "high", 5) == [("high", 5)]
    assert fires(trigger, True, 5) == [(True, 5)]
    assert fires(trigger, 5, REMOVE) == [(None, 5)]


def test_crossed_above_direct_calls() -> None:
    trigger = when.crossed_above(1)
    assert trigger(None, 2) is True
    assert trigger(1, 1.5) is True
    assert trigger(0.99, 1) is False
    assert trigger(2, 3) is False
    assert trigger(2, None) is False
    assert trigger(False, 2) is True
    assert trigger(0, True) is False


def test_crossed_below_fires_only_on_the_crossing() -> None:
    trigger = when.crossed_below(0.2)
    assert fires(trigger, 0.9, 0.2, 0.19, 0.1, 0.5, 0) == [(0.2, 0.19), (0.5, 0)]


def test_crossed_below_from_missing_counts_as_crossing() -> None:
    assert fires(when.crossed_below(0), -1) == [(None, -1)]


def test_crossed_below_threshold_itself_is_not_below() -> None:
    assert fires(when.crossed_below(0), 5, 0, 0.0, -0.0) == []


def test_crossed_below_ignores_non_numbers() -> None:
    trigger = when.crossed_below(1)
    assert fires(trigger, 5, False) == []
    assert fires(trigger, 5, "0", None) == []
    assert fires(trigger, 5, REMOVE) == []
    assert fires(trigger, "low", 0) == [("low", 0)]
    assert fires(trigger, False, 0) == [(False, 0)]


# -- became_true / became_false ------------------------------------------------------------------


def test_became_true_fires_from_falsy_or_missing_to_truthy() -> None:
    trigger = when.became_true()
    assert fires(trigger, True) == [(None, True)]
    assert fires(trigger, False, True, 1, False) == [(False, True)]
    assert fires(trigger, 0, "yes", [1], 0, {"a": 1}) == [(0, "yes"), (0, {"a": 1})]
    assert fires(trigger, "", [], {}, 0.0, None) == []
    assert fires(trigger, True, REMOVE, True) == [(None, True), (None, True)]


def test_became_false_fires_from_truthy_to_falsy_including_removal() -> None:
    trigger = when.became_false()
    assert fires(trigger, True, False) == [(True, False)]
    assert fires(trigger, "x", REMOVE) == [("x", None)]
    assert fires(trigger, 1, 0, "", [1], []) == [(1, 0), ([1], [])]
    # Creating a key with a falsy value is not a change from truthy.
    assert fires(trigger, 0) == []
    assert fires(trigger, False) == []
    assert fires(trigger, 0, REMOVE) == []


# -- custom --------------------------------------------------------------------------------------


def test_custom_gets_old_and_new() -> None:
    calls: list[tuple[Any, Any]] = []

    def doubled(old: Any, new: Any) -> bool:
        calls.append((old, new))
        return isinstance(old, int) and new == old * 2

    assert fires(when.custom(doubled), 1, 2, 3, 6, REMOVE) == [(1, 2), (3, 6)]
    assert calls == [(None, 1), (1, 2), (2, 3), (3, 6), (6, None)]


# -- a property: the watcher fires exactly where a reference model says --------------------------

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, -0.5, 1.0, 2.5]),
    st.sampled_from(["", "a"]),
)


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


@given(st.lists(st.one_of(_values, st.just(REMOVE)), max_size=12), st.integers(-2, 2))
def test_watchers_match_a_reference_model(writes: list[Any], threshold: int) -> None:
    state = State()
    triggers = {
        "above": when.crossed_above(threshold),
        "below": when.crossed_below(threshold),
        "true": when.became_true(),
        "false": when.became_false(),
        "to": when.changed_to(1),
        "from": when.changed_from(1),
        "changed": when.changed(),
    }
    got: dict[str, list[tuple[Any, Any]]] = {name: [] for name in triggers}
    for name, trigger in triggers.items():
        state.watch("k", trigger, lambda c, name=name: got[name].append((c.old, c.new)))

    expected: dict[str, list[tuple[Any, Any]]] = {name: [] for name in triggers}
    current: Any = None
    present = False
    for value in writes:
        if value is REMOVE:
            if not present:
                continue
            old, new, present = current, None, False
            state.remove("k")
        else:
            if present and _same(current, value):
                state.set("k", value)
                continue
            old, new, present = current, value, True
            state.set("k", value)
        current = new
        pair = (old, new)
        expected["changed"].append(pair)
        if _number(new) and new > threshold and not (_number(old) and old > threshold):
            expected["above"].append(pair)
        if _number(new) and new < threshold and not (_number(old) and old < threshold):
            expected["below"].append(pair)
        if not old and new:
            expected["true"].append(pair)
        if old and not new:
            expected["false"].append(pair)
        if _same(new, 1) and not _same(old, 1):
            expected["to"].append(pair)
        if _same(old, 1) and not _same(new, 1):
            expected["from"].append(pair)

    for name in triggers:
        assert [(type(o), o, type(n), n) for o, n in got[name]] == [
            (type(o), o, type(n), n) for o, n in expected[name]
        ], name
