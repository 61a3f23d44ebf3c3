"""Guards: atoms over a real State, combinators, keys_read, prose, explanations and JSON."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import fingerprint
from slateflow import ManualClock, Resolver, State
from slateflow.errors import GuardFormatError, ResolverError, StateValueError
from slateflow.flow import (
    EMPTY_MARKING,
    GUARD_FORMAT,
    Explanation,
    Guard,
    Marking,
    all_,
    always,
    any_,
    called_ok,
    captured,
    custom,
    done,
    eq,
    failed,
    fresh,
    guards,
    is_set,
    is_true,
    not_,
    pending,
    resolved,
)

quick = settings(deadline=None, max_examples=150)


def make_state(**values: Any) -> State:
    state = State()
    for key, value in values.items():
        state.set(key.replace("__", ":"), value)
    return state


def dumped(guard: Guard) -> str:
    return json.dumps(guard.to_json(), sort_keys=True, allow_nan=False)


def wrap(node: Any) -> dict[str, Any]:
    return {"format": GUARD_FORMAT, "guard": node}


def format_error(data: Any) -> str:
    with pytest.raises(GuardFormatError) as info:
        Guard.from_json(data)
    return str(info.value)


# -- public API ---------------------------------------------------------------------------------


def test_public_addresses_are_the_same_objects() -> None:
    import slateflow

    for name in guards.__all__:
        if name in slateflow.__all__:
            assert getattr(slateflow, name) is getattr(guards, name)
    assert GUARD_FORMAT == "slateflow.guard/1"
    assert issubclass(GuardFormatError, ValueError)


# -- atoms --------------------------------------------------------------------------------------


def test_always_holds_on_an_empty_state() -> None:
    assert always().evaluate(State())
    assert always() == always()
    assert always().keys_read() == frozenset()
    assert not always().reads_marking()


@pytest.mark.parametrize(
    ("value", "holds"),
    [(True, True), (1, False), (1.0, False), ("true", False), (False, False), (None, False)],
)
def test_is_true_only_for_the_boolean_true(value: Any, holds: bool) -> None:
    state = make_state(flag=value)
    assert is_true("flag").evaluate(state) is holds


def test_is_true_missing_key_is_false() -> None:
    assert not is_true("flag").evaluate(State())


@pytest.mark.parametrize("value", [None, False, 0, "", [], {}])
def test_is_set_counts_any_value_including_none(value: Any) -> None:
    state = make_state(slot=value)
    assert is_set("slot").evaluate(state)
    assert not is_set("other").evaluate(state)


def test_is_set_follows_removal() -> None:
    state = make_state(slot=None)
    state.remove("slot")
    assert not is_set("slot").evaluate(state)


@pytest.mark.parametrize(
    ("stored", "expected", "holds"),
    [
        (1, 1, True),
        (1, 1.0, False),
        (1.0, 1, False),
        (1, True, False),
        (True, 1, False),
        (0.0, -0.0, False),
        (None, None, True),
        ("19:00", "19:00", True),
        ([1, 2], [1, 2], True),
        ([1, 2], [1, True], False),
        ({"a": 1, "b": [1]}, {"b": [1], "a": 1}, True),
        ({"a": 1}, {"a": 1.0}, False),
        ({"a": 1}, {"a": 1, "b": 2}, False),
    ],
)
def test_eq_is_json_equality(stored: Any, expected: Any, holds: bool) -> None:
    state = make_state(k=stored)
    assert eq("k", expected).evaluate(state) is holds


def test_eq_none_is_not_the_same_as_missing() -> None:
    assert not eq("k", None).evaluate(State())
    assert eq("k", None).evaluate(make_state(k=None))


@pytest.mark.parametrize(
    ("ref", "expected", "holds"),
    [
        ("booking:slot.time", "19:00", True),
        ("booking:slot.time", "20:00", False),
        ("booking:slot.tables.0", 4, True),
        ("booking:slot.tables.-1", 6, True),
        ("booking:slot.tables.2", 6, False),
        ("booking:slot.tables.-3", 4, False),
        ("booking:slot.nope", None, False),
        ("booking:slot.time.0", "1", False),
        ("booking:slot.2024", "yes", True),
        ("booking:slot", {"time": "19:00", "tables": [4, 6], "2024": "yes"}, True),
        ("other.time", "19:00", False),
    ],
)
def test_eq_with_a_path(ref: str, expected: Any, holds: bool) -> None:
    state = State()
    state.set("booking:slot", {"time": "19:00", "tables": [4, 6], "2024": "yes"})
    assert eq(ref, expected).evaluate(state) is holds


def test_eq_list_index_from_the_end() -> None:
    state = make_state(items=[1, 2, 3])
    assert eq("items.-1", 3).evaluate(state)
    assert eq("items.0", 1).evaluate(state)
    assert not eq("items.3", 3).evaluate(state)
    assert not eq("items.x", 3).evaluate(state)


def test_eq_bracketed_key_with_a_dot() -> None:
    state = State()
    state.set("odd.key", {"field": 1})
    guard = eq("[odd.key].field", 1)
    assert guard.evaluate(state)
    assert not eq("[odd.key].field", 2).evaluate(state)
    assert guard.keys_read() == {"odd.key"}
    # Without brackets the key ends at the first dot: "odd" is not set.
    assert not eq("odd.key.field", 1).evaluate(state)


def test_eq_copies_its_value() -> None:
    value = {"a": [1]}
    guard = eq("k", value)
    value["a"].append(2)
    assert guard.evaluate(make_state(k={"a": [1]}))


def test_captured_needs_every_key() -> None:
    state = make_state(booking__date="2026-06-14", booking__size=None)
    assert captured("booking:date").evaluate(state)
    assert captured("booking:date", "booking:size").evaluate(state)
    assert not captured("booking:date", "booking:time").evaluate(state)


def test_called_ok_reads_the_marking() -> None:
    state = State()
    assert called_ok("book").evaluate(state, Marking(tools_ok={"book": 1}))
    assert called_ok("book").evaluate(state, Marking(tools_ok={"book": 3}))
    assert not called_ok("book").evaluate(state, Marking(tools_ok={"book": 0}))
    assert not called_ok("book").evaluate(state, Marking(tools_ok={"other": 1}))
    assert not called_ok("book").evaluate(state)
    assert not called_ok("book").evaluate(state, EMPTY_MARKING)


def test_done_reads_the_marking() -> None:
    state = make_state(greet=True)
    marking = Marking(done=frozenset({"greet", "collect"}))
    assert done("greet").evaluate(state, marking)
    assert not done("confirm").evaluate(state, marking)
    # A state key of the same name is not the marking.
    assert not done("greet").evaluate(state)


def test_resolved_means_result_is_set() -> None:
    state = State()
    assert not resolved("v").evaluate(state)
    state.set("v:status", "running")
    assert not resolved("v").evaluate(state)
    state.set("v:result", None)
    assert resolved("v").evaluate(state)


@pytest.mark.parametrize(
    ("status", "is_failed", "is_pending"),
    [
        ("error", True, False),
        ("running", False, True),
        ("done", False, False),
        ("ERROR", False, False),
        (None, False, False),
        (1, False, False),
    ],
)
def test_failed_and_pending_read_the_status(status: Any, is_failed: bool, is_pending: bool) -> None:
    state = make_state(v__status=status)
    assert failed("v").evaluate(state) is is_failed
    assert pending("v").evaluate(state) is is_pending


def test_failed_and_pending_on_missing_status() -> None:
    state = make_state(v__result=1)
    assert not failed("v").evaluate(state)
    assert not pending("v").evaluate(state)


def test_fresh_follows_the_ttl_on_the_state_clock() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    assert not fresh("v").evaluate(state)
    state.set("v:result", {"open": True}, meta={"ttl": 5})
    assert fresh("v").evaluate(state)
    anyio.run(clock.advance, 4)
    assert fresh("v").evaluate(state)
    anyio.run(clock.advance, 2)
    assert not fresh("v").evaluate(state)
    assert resolved("v").evaluate(state)


def test_fresh_without_ttl_stays_fresh() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    state.set("v:result", 1)
    anyio.run(clock.advance, 10_000)
    assert fresh("v").evaluate(state)


def test_fresh_after_a_real_resolver_run() -> None:
    clock = ManualClock()
    state = State(clock=clock)

    async def fetch(_: State) -> int:
        return 42

    async def main() -> None:
        await Resolver.fetch("avail", fetch, ttl=5).resolve(state, clock=clock)
        assert fresh("avail").evaluate(state)
        assert resolved("avail").evaluate(state)
        assert not pending("avail").evaluate(state)
        await clock.advance(6)
        assert not fresh("avail").evaluate(state)

    anyio.run(main)


def test_failed_after_a_real_resolver_error() -> None:
    state = State()

    async def boom(_: State) -> int:
        raise RuntimeError("down")

    async def main() -> None:
        with pytest.raises(ResolverError):
            await Resolver.fetch("avail", boom).resolve(state)

    anyio.run(main)
    assert failed("avail").evaluate(state)
    assert not resolved("avail").evaluate(state)


# -- combinators --------------------------------------------------------------------------------


def test_empty_all_holds_and_empty_any_does_not() -> None:
    state = State()
    assert all_().evaluate(state)
    assert not any_().evaluate(state)
    assert all_().explain(state).holds
    assert not any_().explain(state).holds


@pytest.mark.parametrize(("a", "b"), [(True, True), (True, False), (False, True), (False, False)])
def test_combinators_truth_table(a: bool, b: bool) -> None:
    state = make_state(a=a, b=b)
    ga, gb = is_true("a"), is_true("b")
    assert all_(ga, gb).evaluate(state) is (a and b)
    assert any_(ga, gb).evaluate(state) is (a or b)
    assert not_(ga).evaluate(state) is (not a)
    assert (ga & gb).evaluate(state) is (a and b)
    assert (ga | gb).evaluate(state) is (a or b)
    assert (~ga).evaluate(state) is (not a)
    assert (~(ga & gb)).evaluate(state) is (not (a and b))


def test_operators_flatten() -> None:
    a, b, c = is_set("a"), is_set("b"), is_set("c")
    assert a & b & c == all_(a, b, c)
    assert a | b | c == any_(a, b, c)
    assert ~a == not_(a)
    assert (a & b & c).to_json()["guard"]["op"] == "all"
    assert len((a & b & c).to_json()["guard"]["of"]) == 3
    assert (a & b) | c == any_(all_(a, b), c)
    assert (a | b) & c == all_(any_(a, b), c)


def test_operators_reject_non_guards() -> None:
    with pytest.raises(TypeError):
        is_set("a") & True  # type: ignore[operator]
    with pytest.raises(TypeError):
        is_set("a") | "b"  # type: ignore[operator]


def test_guards_compare_and_hash_by_value() -> None:
    assert is_set("a") == is_set("a")
    assert hash(eq("a.x", {"b": [1]})) == hash(eq("a.x", {"b": [1]}))
    assert is_set("a") != is_true("a")
    assert resolved("v") != fresh("v")
    assert failed("v") != pending("v")
    assert called_ok("x") != done("x")
    assert all_(is_set("a")) != any_(is_set("a"))
    assert len({is_set("a"), is_set("a"), is_true("a"), all_(), any_()}) == 4


# -- keys_read / reads_marking -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("guard", "keys", "marking"),
    [
        (always(), set(), False),
        (is_true("a:b"), {"a:b"}, False),
        (is_set("a:b"), {"a:b"}, False),
        (eq("booking:slot.time", "19:00"), {"booking:slot"}, False),
        (eq("[odd.key].field.0", 1), {"odd.key"}, False),
        (captured("a", "b:c", "a"), {"a", "b:c"}, False),
        (called_ok("book"), set(), True),
        (done("greet"), set(), True),
        (resolved("v"), {"v:result"}, False),
        (failed("v"), {"v:status"}, False),
        (pending("v"), {"v:status"}, False),
        (fresh("v"), {"v:result"}, False),
        (all_(), set(), False),
        (any_(), set(), False),
        (is_set("a") & ~pending("v") | done("s"), {"a", "v:status"}, True),
        (not_(called_ok("book")), set(), True),
        (any_(resolved("v"), failed("v"), eq("x.y", 1)), {"v:result", "v:status", "x"}, False),
    ],
)
def test_keys_read(guard: Guard, keys: set[str], marking: bool) -> None:
    assert guard.keys_read() == frozenset(keys)
    assert isinstance(guard.keys_read(), frozenset)
    assert guard.reads_marking() is marking


# -- custom -------------------------------------------------------------------------------------


def test_custom_evaluates_with_state_and_marking() -> None:
    seen: list[tuple[State, Marking]] = []

    def big_party(state: State, marking: Marking) -> Any:
        seen.append((state, marking))
        return (state.get("size") or 0) >= 8 and "greet" in marking.done

    guard = custom(big_party, reads=["size"], marking=True)
    state = make_state(size=9)
    marking = Marking(done=frozenset({"greet"}))
    assert guard.evaluate(state, marking) is True
    assert seen == [(state, marking)]
    assert guard.evaluate(state) is False
    assert seen[-1][1] == EMPTY_MARKING
    assert guard.keys_read() == {"size"}
    assert guard.reads_marking()
    assert "big_party" in guard.describe()


def test_custom_truthiness_becomes_a_bool() -> None:
    assert custom(lambda s, m: "yes").evaluate(State()) is True
    assert custom(lambda s, m: []).evaluate(State()) is False


def test_custom_reads_a_single_string_as_one_key() -> None:
    guard = custom(lambda s, m: True, reads="booking:size", describe="a big party")
    assert guard.keys_read() == {"booking:size"}
    assert not guard.reads_marking()
    assert guard.describe() == "a big party"


def test_custom_is_kept_when_combined() -> None:
    calls: list[int] = []

    def no(state: State, marking: Marking) -> bool:
        calls.append(1)
        return False

    c = custom(no, reads=["x"])
    state = make_state(a=True)
    assert not (is_true("a") & c).evaluate(state)
    assert not (c & is_true("a")).evaluate(state)
    assert (~c).evaluate(state)
    assert not any_(is_set("b"), c).evaluate(state)
    assert (is_set("a") & is_set("a") & c).keys_read() == {"a", "x"}
    assert calls == [1, 1, 1, 1]
    combined = is_true("a") & c
    assert combined == combined
    assert not combined.explain(state).holds


@pytest.mark.parametrize(
    ("build", "path"),
    [
        (lambda c: c, "guard"),
        (lambda c: all_(always(), c), "guard.of[1]"),
        (lambda c: always() & is_set("a") & c, "guard.of[2]"),
        (lambda c: ~c, "guard.of"),
        (lambda c: any_(always(), all_(is_set("a"), ~c)), "guard.of[1].of[1].of"),
    ],
)
def test_custom_refuses_to_serialise_naming_its_path(build: Any, path: str) -> None:
    guard = build(custom(lambda s, m: True, describe="code check"))
    with pytest.raises(GuardFormatError) as info:
        guard.to_json()
    message = str(info.value)
    assert f"{path} is a custom guard" in message
    assert "code check" in message


# -- describe / explain -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("guard", "words"),
    [
        (always(), ["always"]),
        (is_true("user:ok"), ["'user:ok'", "true"]),
        (is_set("booking:date"), ["'booking:date'", "known"]),
        (eq("booking:slot.time", "19:00"), ["'booking:slot.time'", '"19:00"']),
        (captured("a:b", "c"), ["'a:b'", "'c'"]),
        (called_ok("book"), ["'book'"]),
        (done("greet"), ["'greet'", "complete"]),
        (resolved("avail"), ["'avail'", "result"]),
        (failed("avail"), ["'avail'", "failed"]),
        (pending("avail"), ["'avail'", "running"]),
        (fresh("avail"), ["'avail'", "fresh"]),
        (~is_set("x"), ["not", "'x'"]),
    ],
)
def test_describe_mentions_what_it_reads(guard: Guard, words: list[str]) -> None:
    text = guard.describe()
    for word in words:
        assert word in text
    assert text in repr(guard)


def test_describe_of_combinations() -> None:
    a, b, c = is_set("a"), is_set("b"), is_set("c")
    assert (a & b).describe() == "'a' must be known and 'b' must be known"
    assert (a | b).describe() == "'a' must be known or 'b' must be known"
    assert ((a | b) & c).describe() == (
        "('a' must be known or 'b' must be known) and 'c' must be known"
    )
    assert all_(a).describe() == a.describe()
    assert "always" in all_().describe()
    assert "never" in any_().describe()


def test_explain_tree_names_keys_and_values() -> None:
    state = make_state(booking__date="2026-06-14", flag=1, v__status="running")
    guard = all_(is_set("booking:date"), is_true("flag") | pending("v"), ~eq("booking:date", "x"))
    explanation = guard.explain(state)
    assert isinstance(explanation, Explanation)
    assert explanation.holds
    lines = str(explanation).splitlines()
    assert lines[0] == "[true] and of 3"
    assert lines[1] == "  [true] 'booking:date' must be known: 'booking:date' is \"2026-06-14\""
    assert lines[2] == "  [true] or of 2"
    assert lines[3] == "    [false] 'flag' must be true: 'flag' is 1"
    assert lines[4] == "    [true] 'v' must be running: 'v:status' is \"running\""
    assert lines[5] == "  [true] not"
    assert lines[6].startswith("    [false] 'booking:date' must be \"x\"")
    assert lines[6].endswith("'booking:date' is \"2026-06-14\"")
    assert len(lines) == 7


def test_explain_missing_values_and_marking() -> None:
    state = State()
    marking = Marking(done=frozenset({"greet"}), tools_ok={"book": 2})
    text = str(
        (
            eq("a.b", 1) & captured("x", "y") & called_ok("book") & done("greet") & fresh("v")
        ).explain(state, marking)
    )
    assert "[false] and of 5" in text
    assert "'a.b' is not set" in text
    assert "missing 'x', 'y'" in text
    assert "[true] tool 'book' must have run successfully: 2 successful call(s)" in text
    assert "[true] step 'greet' must be complete" in text
    assert "[false] 'v' must have a fresh result: 'v:status' is not set" in text


def test_explain_value_matches_evaluate() -> None:
    state = make_state(a=True, v__status="error")
    marking = Marking(done=frozenset({"s"}))
    for guard in [
        is_true("a"),
        failed("v"),
        ~done("s"),
        any_(),
        all_(),
        captured("a"),
        eq("a", True) & is_set("zz") | done("s"),
    ]:
        assert guard.explain(state, marking).holds is guard.evaluate(state, marking)


def test_explain_never_shows_a_secret_value() -> None:
    state = State()
    state.policy("user:card", secret=True)
    state.set("user:card", {"number": "4111 1111 1111 1111", "brand": "visa"})
    guard = any_(
        is_set("user:card"),
        is_true("user:card"),
        eq("user:card.number", "0000"),
        eq("user:card.brand", "amex"),
        captured("user:card"),
    )
    text = str(guard.explain(state))
    assert "4111" not in text
    assert "visa" not in text
    assert text.count("***") == 4
    assert "'user:card' is ***" in text
    assert "'user:card.number' is ***" in text


def test_explain_secret_key_not_set_says_so() -> None:
    state = State()
    state.policy("user:*", secret=True)
    assert "'user:card' is not set" in str(is_set("user:card").explain(state))


def test_explain_hides_a_secret_status() -> None:
    state = State()
    state.policy("v:status", secret=True)
    state.set("v:status", "running-secret-token")
    for guard in (pending("v"), failed("v"), resolved("v"), fresh("v")):
        assert "secret-token" not in str(guard.explain(state))


# -- JSON ---------------------------------------------------------------------------------------

ROUND_TRIP = [
    always(),
    is_true("a"),
    is_set("booking:date"),
    eq("k", 1),
    eq("k", 1.0),
    eq("k", True),
    eq("k", -0.0),
    eq("k", None),
    eq("k", "19:00"),
    eq("k", {"a": [1, {"b": None}], "é": "ü"}),
    eq("booking:slot.time", "19:00"),
    eq("[odd.key].field", 1),
    eq("items.-1", 3),
    captured("a", "b:c"),
    called_ok("book"),
    done("greet"),
    resolved("v"),
    failed("v"),
    pending("v"),
    fresh("v"),
    all_(),
    any_(),
    not_(is_set("a")),
    is_set("a") & resolved("v") & ~pending("w"),
    any_(all_(eq("x.0", [1]), done("s")), not_(not_(any_())), captured("z")),
]


@pytest.mark.parametrize("guard", ROUND_TRIP, ids=lambda g: g.describe()[:40])
def test_json_round_trip(guard: Guard) -> None:
    data = guard.to_json()
    assert data["format"] == GUARD_FORMAT
    assert set(data) == {"format", "guard"}
    back = Guard.from_json(json.loads(json.dumps(data, allow_nan=False)))
    assert back == guard
    assert type(back) is type(guard)
    assert dumped(back) == dumped(guard)
    assert back.describe() == guard.describe()
    assert back.keys_read() == guard.keys_read()


def test_json_shapes() -> None:
    assert always().to_json() == wrap({"op": "always"})
    assert eq("a.x", 1).to_json() == wrap({"op": "eq", "key": "a.x", "value": 1})
    assert captured("a", "b").to_json() == wrap({"op": "captured", "keys": ["a", "b"]})
    assert (~resolved("v")).to_json() == wrap({"op": "not", "of": {"op": "resolved", "name": "v"}})
    assert (is_set("a") | called_ok("t")).to_json() == wrap(
        {"op": "any", "of": [{"op": "is_set", "key": "a"}, {"op": "called_ok", "tool": "t"}]}
    )
    assert done("s").to_json() == wrap({"op": "done", "step": "s"})


def test_from_json_keeps_json_number_kinds() -> None:
    g = Guard.from_json(
        json.loads(
            '{"format": "slateflow.guard/1", "guard": {"op": "eq", "key": "k", "value": 1.0}}'
        )
    )
    assert not g.evaluate(make_state(k=1))
    assert g.evaluate(make_state(k=1.0))


def test_to_json_output_does_not_alias_the_guard() -> None:
    guard = eq("k", {"a": [1]})
    guard.to_json()["guard"]["value"]["a"].append(2)
    assert guard.evaluate(make_state(k={"a": [1]}))
    assert guard.to_json()["guard"]["value"] == {"a": [1]}


@pytest.mark.parametrize(
    ("left", "right"), [(1, True), (1, 1.0), (0.0, -0.0), ([1], [True]), ({"a": 0}, {"a": False})]
)
def test_eq_guards_with_different_json_values_differ(left: Any, right: Any) -> None:
    assert eq("k", left) != eq("k", right)


# -- bad JSON -----------------------------------------------------------------------------------

A = {"op": "always"}

BAD_JSON = [
    ([], "JSON object"),
    ("guard", "JSON object"),
    ({"guard": A}, "format"),
    ({"format": "slateflow.guard/2", "guard": A}, "format"),
    ({"format": None, "guard": A}, "format"),
    ({"format": GUARD_FORMAT, "guard": A, "extra": 1}, "'extra'"),
    ({"format": GUARD_FORMAT}, "guard: a guard node is a JSON object, got null"),
    (wrap([A]), "guard: a guard node is a JSON object, got list"),
    (wrap({}), "guard.op: unknown guard None"),
    (wrap({"op": "nope"}), "guard.op: unknown guard 'nope'"),
    (wrap({"op": 1}), "guard.op: unknown guard 1"),
    (wrap({"op": "custom"}), "guard.op: unknown guard 'custom'"),
    (wrap({"op": "all", "of": [A, A, {"op": "maybe"}]}), "guard.of[2].op"),
    (wrap({"op": "all", "of": [{"op": "is_set"}]}), "guard.of[0]: missing field 'key'"),
    (wrap({"op": "is_set", "key": "a", "x": 1}), "guard: unknown field(s) ['x']"),
    (wrap({"op": "always", "key": "a"}), "guard: unknown field(s) ['key']"),
    (wrap({"op": "not", "of": {"op": "done", "step": "s", "tool": "t"}}), "guard.of: unknown"),
    (wrap({"op": "is_set", "key": 1}), "guard.key"),
    (wrap({"op": "is_true", "key": None}), "guard.key"),
    (wrap({"op": "all", "of": [A, A, {"op": "is_set", "key": "bad key"}]}), "guard.of[2].key"),
    (wrap({"op": "any", "of": [A, {"op": "is_true", "key": "a::b"}]}), "guard.of[1].key"),
    (wrap({"op": "captured", "keys": "a"}), "guard.keys"),
    (wrap({"op": "captured", "keys": []}), "guard.keys"),
    (wrap({"op": "captured", "keys": ["a", "b*"]}), "guard.keys[1]"),
    (wrap({"op": "captured", "keys": ["a", 2]}), "guard.keys[1]"),
    (wrap({"op": "any", "of": [{"op": "eq", "key": 1, "value": 1}]}), "guard.of[0].key"),
    (wrap({"op": "eq", "key": "a"}), "guard: missing field 'value'"),
    (
        wrap({"op": "all", "of": [A, {"op": "eq", "key": "a", "value": float("nan")}]}),
        "guard.of[1]",
    ),
    (wrap({"op": "eq", "key": "a", "value": [1, (2,)]}), "guard"),
    (wrap({"op": "resolved", "name": ""}), "guard.name"),
    (wrap({"op": "fresh", "name": 3}), "guard.name"),
    (wrap({"op": "failed"}), "guard: missing field 'name'"),
    (wrap({"op": "pending", "name": "v", "key": "v"}), "unknown field(s) ['key']"),
    (wrap({"op": "called_ok", "tool": ["book"]}), "guard.tool"),
    (wrap({"op": "done", "step": ""}), "guard.step"),
    (wrap({"op": "all", "of": A}), "guard.of: expected a list"),
    (wrap({"op": "any", "of": None}), "guard.of: expected a list"),
    (wrap({"op": "any"}), "guard: missing field 'of'"),
    (wrap({"op": "not", "of": [A]}), "guard.of: a guard node is a JSON object"),
    (wrap({"op": "any", "of": [A, 1]}), "guard.of[1]: a guard node is a JSON object, got int"),
    (
        wrap(
            {
                "op": "any",
                "of": [{"op": "not", "of": {"op": "all", "of": [A, {"op": "done", "step": 5}]}}],
            }
        ),
        "guard.of[0].of.of[1].step",
    ),
]


@pytest.mark.parametrize(("data", "fragment"), BAD_JSON)
def test_bad_json_names_the_bad_node(data: Any, fragment: str) -> None:
    assert fragment in format_error(data)


@pytest.mark.parametrize("key", ["bad key", "a?", "[x", "a..b", ""])
def test_bad_eq_key_in_json_names_the_path(key: str) -> None:
    message = format_error(wrap({"op": "all", "of": [A, A, {"op": "eq", "key": key, "value": 1}]}))
    assert "guard.of[2]" in message


def test_bad_eq_key_in_json_is_a_guard_format_error() -> None:
    format_error(wrap({"op": "eq", "key": "bad key", "value": 1}))


# -- bad constructor arguments ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "error", "fragment"),
    [
        (lambda: is_set("bad key"), GuardFormatError, "bad key"),
        (lambda: is_true(3), GuardFormatError, "3"),
        (lambda: is_set(""), GuardFormatError, "is_set key"),
        (lambda: is_set("a*"), GuardFormatError, "'*'"),
        (lambda: captured(), GuardFormatError, "at least one key"),
        (lambda: captured("a", "b c"), GuardFormatError, "'b c'"),
        (lambda: eq("a?", 1), GuardFormatError, "eq key"),
        (lambda: eq("a b", 1), GuardFormatError, "eq key"),
        (lambda: eq(3, 1), GuardFormatError, "eq key"),
        (lambda: eq("a", float("nan")), StateValueError, "nan"),
        (lambda: eq("a", float("inf")), StateValueError, "inf"),
        (lambda: eq("a", (1, 2)), StateValueError, "tuple"),
        (lambda: eq("a", {1: 2}), StateValueError, "dict key"),
        (lambda: called_ok(""), GuardFormatError, "called_ok tool"),
        (lambda: done(None), GuardFormatError, "done step"),
        (lambda: resolved(""), GuardFormatError, "resolved name"),
        (lambda: failed(1), GuardFormatError, "failed name"),
        (lambda: pending(""), GuardFormatError, "pending name"),
        (lambda: fresh(b"v"), GuardFormatError, "fresh name"),
        (lambda: all_(is_set("a"), 1), TypeError, "argument 1"),
        (lambda: any_("a"), TypeError, "any_()"),
        (lambda: not_(None), TypeError, "not_()"),
        (lambda: custom(3), TypeError, "callable"),
        (lambda: custom(lambda s, m: True, reads=["bad key"]), GuardFormatError, "custom reads"),
    ],
)
def test_bad_constructor_arguments(build: Any, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error) as info:
        build()
    assert fragment in str(info.value)


@pytest.mark.parametrize("maker", [resolved, failed, pending, fresh])
def test_resolver_atoms_reject_names_that_make_invalid_keys(maker: Any) -> None:
    with pytest.raises(GuardFormatError):
        maker("a b")


# -- guards never write -------------------------------------------------------------------------


def test_guards_never_write_the_state() -> None:
    clock = ManualClock()
    state = State(clock=clock)
    state.policy("user:card", secret=True)
    state.set("user:card", {"number": "4111"})
    state.set("booking:slot", {"time": "19:00", "tables": [4]})
    state.set("v:status", "running")
    state.set("v:result", 1, meta={"ttl": 5})
    before = fingerprint(state)
    guard = all_(
        always(),
        is_true("x"),
        is_set("booking:slot"),
        eq("booking:slot.tables.-1", 4),
        eq("user:card.number", "1"),
        captured("a", "booking:slot"),
        called_ok("t"),
        done("s"),
        resolved("v"),
        failed("v"),
        pending("w"),
        fresh("v"),
        ~any_(is_set("missing"), custom(lambda s, m: s.get("zzz") is None, reads=["zzz"])),
    )
    marking = Marking(done=frozenset({"s"}), tools_ok={"t": 1})
    for m in (EMPTY_MARKING, marking):
        guard.evaluate(state, m)
        str(guard.explain(state, m))
    guard.describe()
    guard.keys_read()
    assert fingerprint(state) == before


# -- property: random guard trees ---------------------------------------------------------------

KEYS = ["a", "b:c", "user:card", "odd.key"]
REFS = ["a", "b:c", "a.x", "a.0", "a.-1", "b:c.x.y", "[odd.key].f", "[odd.key]"]
NAMES = ["v", "w"]
TOOLS = ["book", "pay"]
STEPS = ["greet", "confirm"]

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False, width=16),
    st.sampled_from(["", "x", "19:00"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["x", "y", "f", "0"]), inner, max_size=3)
    ),
    max_leaves=6,
)

atoms = st.one_of(
    st.just(always()),
    st.sampled_from(KEYS).map(is_true),
    st.sampled_from(KEYS).map(is_set),
    st.builds(eq, st.sampled_from(REFS), json_values),
    st.lists(st.sampled_from(KEYS), min_size=1, max_size=3).map(lambda ks: captured(*ks)),
    st.sampled_from(TOOLS).map(called_ok),
    st.sampled_from(STEPS).map(done),
    st.sampled_from(NAMES).map(resolved),
    st.sampled_from(NAMES).map(failed),
    st.sampled_from(NAMES).map(pending),
    st.sampled_from(NAMES).map(fresh),
)
guard_trees = st.recursive(
    atoms,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda gs: all_(*gs)),
        st.lists(inner, max_size=3).map(lambda gs: any_(*gs)),
        inner.map(not_),
        st.tuples(inner, inner).map(lambda p: p[0] & p[1]),
        st.tuples(inner, inner).map(lambda p: p[0] | p[1]),
        inner.map(lambda g: ~g),
    ),
    max_leaves=12,
)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[State, Marking]:
    clock = ManualClock()
    state = State(clock=clock)
    for key in KEYS:
        if draw(st.booleans()):
            state.set(key, draw(json_values))
    for name in NAMES:
        status = draw(st.sampled_from([None, "running", "error", "done"]))
        if status is not None:
            state.set(f"{name}:status", status)
        if draw(st.booleans()):
            ttl = draw(st.sampled_from([None, 0, 5]))
            meta = None if ttl is None else {"ttl": ttl}
            state.set(f"{name}:result", draw(json_scalars), meta=meta)
    marking = Marking(
        done=frozenset(draw(st.sets(st.sampled_from(STEPS)))),
        tools_ok=draw(st.dictionaries(st.sampled_from(TOOLS), st.integers(0, 2))),
    )
    return state, marking


@quick
@given(guard_trees, worlds())
def test_property_json_round_trip(guard: Guard, world: tuple[State, Marking]) -> None:
    state, marking = world
    data = guard.to_json()
    back = Guard.from_json(json.loads(json.dumps(data, allow_nan=False)))
    assert back == guard
    assert back.to_json() == data
    assert dumped(back) == dumped(guard)
    assert back.keys_read() == guard.keys_read()
    assert back.reads_marking() == guard.reads_marking()
    assert back.describe() == guard.describe()
    value = guard.evaluate(state, marking)
    assert back.evaluate(state, marking) is value
    assert guard.explain(state, marking).holds is value
    assert str(back.explain(state, marking)) == str(guard.explain(state, marking))


@quick
@given(guard_trees, worlds())
def test_property_combinators_obey_boolean_logic(
    guard: Guard, world: tuple[State, Marking]
) -> None:
    state, marking = world
    value = guard.evaluate(state, marking)
    assert (~guard).evaluate(state, marking) is (not value)
    assert (~~guard).evaluate(state, marking) is value
    assert (guard & always()).evaluate(state, marking) is value
    assert (guard | any_()).evaluate(state, marking) is value
    assert (guard | ~guard).evaluate(state, marking)
    before = fingerprint(state)
    guard.explain(state, marking)
    assert fingerprint(state) == before


@quick
@given(guard_trees)
def test_property_keys_read_are_valid_keys(guard: Guard) -> None:
    state = State()
    for key in guard.keys_read():
        assert key not in state  # a valid key: contains() raises for an invalid one


def test_a_marking_copies_what_it_is_made_from() -> None:
    tools = {"book": 1}
    steps = {"greet"}
    marking = Marking(done=steps, tools_ok=tools)  # type: ignore[arg-type]
    tools["book"] = 0
    steps.add("confirm")
    assert marking.tools_ok["book"] == 1
    assert marking.done == frozenset({"greet"})
    assert guards.called_ok("book").evaluate(State(), marking)


@pytest.mark.parametrize("op", ["gt", "ge", "lt", "le", "between"])
@pytest.mark.parametrize("sign", [1, -1])
def test_a_comparison_with_an_int_too_long_to_print_is_a_guard_format_error(
    op: str, sign: int
) -> None:

    huge = sign * 10**5000
    node: dict[str, Any] = {"op": op, "key": "score"}
    if op == "between":
        node.update(low=0, high=huge)
    else:
        node["value"] = huge
    assert "at most 4300 digits" in format_error(wrap(node))
