"""Properties of the State checked with hypothesis over random keys, values and histories."""

from __future__ import annotations

import copy
import json
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import fingerprint, tagged
from slateflow import State
from slateflow.conversation import end_turn
from slateflow.errors import (
    InvalidKeyError,
    KeyExistsError,
    MissingKeyError,
    ReadOnlyError,
    StateValueError,
)

quick = settings(deadline=None)


# -- helpers ---------------------------------------------------------------------------------


def as_json(value: Any) -> str:
    return json.dumps(value, allow_nan=False)


def is_valid_key(key: str) -> bool:
    """The key rules, written independently of the library."""
    return (
        0 < len(key) <= 256
        and not any(
            c.isspace()
            or c == "*"
            or unicodedata.category(c) in ("Cc", "Cf", "Cs")  # control, invisible, surrogate
            or c in "\ufffe\uffff"
            for c in key
        )
        and all(key.split(":"))
    )


# -- strategies ------------------------------------------------------------------------------

segments = st.text(
    st.characters(
        exclude_categories=("Cc", "Cf", "Cs", "Zs", "Zl", "Zp"),
        exclude_characters=":*\ufffe\uffff",
    ),
    min_size=1,
    max_size=6,
).filter(lambda s: not any(c.isspace() for c in s))
random_keys = (
    st.lists(segments, min_size=1, max_size=3)
    .map(":".join)
    .filter(lambda k: not k.startswith("state_meta:"))
)
POOL = ["a", "a:b", "a:c", "b", "b:a", "turn:x", "temp:y", "user:z"]
PREFIXES = ["", "a", "a:", "b:", "turn:", "user:", "zz"]
pool_keys = st.sampled_from(POOL)
keys = pool_keys | random_keys

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)
# Values that often collide, to exercise "equal value is a no-op" and "1 != 1.0 != True".
close_values = st.sampled_from(
    [0, 1, 1.0, True, False, None, -0.0, 0.0, "a", [], {}, [1], [True], {"a": 1}, {"a": 1.0}]
)
values = close_values | json_values

sources = st.sampled_from(["user", "llm", "tool", "agent"])
provenances = st.fixed_dictionaries(
    {},
    optional={
        "source": sources | st.text(min_size=1, max_size=8),
        "writer": st.none() | st.text(min_size=1, max_size=8),
        "confidence": st.none() | st.floats(min_value=0.0, max_value=1.0),
        "meta": st.none() | st.dictionaries(st.text(max_size=4), json_values, max_size=3),
    },
)


# -- snapshot round trip ---------------------------------------------------------------------

write_ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), keys, values, provenances),
        st.tuples(st.just("remove"), pool_keys),
        st.tuples(st.just("update"), st.dictionaries(keys, values, max_size=3), provenances),
    ),
    max_size=25,
)


def apply_writes(state: State, ops: list[tuple[Any, ...]]) -> None:
    for op in ops:
        if op[0] == "set":
            state.set(op[1], op[2], **op[3])
        elif op[0] == "remove":
            state.remove(op[1], None)
        else:
            state.update(op[1], **op[2])


@quick
@given(write_ops)
def test_snapshot_round_trip_is_exact(ops: list[tuple[Any, ...]]) -> None:
    state = State()
    apply_writes(state, ops)
    snap = state.snapshot()
    text = as_json(snap)
    restored = State.restore(json.loads(text))

    assert as_json(restored.snapshot()) == text
    assert restored.journal.cursor == state.journal.cursor
    keys_in_order = state.keys()
    assert restored.keys() == keys_in_order
    assert len(restored) == len(state)
    for key in keys_in_order:
        assert tagged(restored.get(key)) == tagged(state.get(key))
        original, copy_ = state.entry(key), restored.entry(key)
        assert (copy_.version, copy_.seq) == (original.version, original.seq)
        assert copy_.provenance == original.provenance
        assert copy_.updated_at == original.updated_at

    # Both continue identically.
    for s in (state, restored):
        s.set("zz:after", "x")
    assert restored.entry("zz:after").seq == state.entry("zz:after").seq == snap["seq"] + 1
    if state.keys():
        first = state.keys()[0]
        assert restored.set(first, ["changed"]) == state.set(first, ["changed"])


# -- random operations against a dict model --------------------------------------------------


class Model:
    """The state as a plain dict of key -> (value, version, source), plus a commit counter."""

    def __init__(self) -> None:
        self.data: dict[str, tuple[Any, int, str]] = {}
        self.cursor = 0
        self.changes = 0

    def write(self, key: str, value: Any, source: str) -> bool:
        current = self.data.get(key)
        if current is not None and tagged(current[0]) == tagged(value):
            return False
        version = 1 if current is None else current[1] + 1
        self.data[key] = (copy.deepcopy(value), version, source)
        self.changes += 1
        return True

    def drop(self, key: str) -> bool:
        if key not in self.data:
            return False
        del self.data[key]
        self.changes += 1
        return True

    def commit(self, changed: bool) -> None:
        if changed:
            self.cursor += 1


model_ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), pool_keys, values, sources),
        st.tuples(st.just("remove"), pool_keys),
        st.tuples(
            st.just("update"),
            st.dictionaries(pool_keys, values, max_size=3),
            st.lists(pool_keys, max_size=2),
            sources,
        ),
        st.tuples(st.just("rename"), pool_keys, pool_keys, st.booleans()),
        st.tuples(st.just("clear_prefix"), st.sampled_from(PREFIXES)),
        st.tuples(st.just("end_turn")),
    ),
    max_size=40,
)


def step(state: State, model: Model, op: tuple[Any, ...]) -> None:
    """Apply ``op`` to both; the state must return or raise what the model predicts."""
    kind = op[0]
    if kind == "set":
        _, key, value, source = op
        model.commit(model.write(key, value, source))
        assert state.set(key, value, source=source) == model.data[key][1]
    elif kind == "remove":
        key = op[1]
        if key not in model.data:
            with pytest.raises(MissingKeyError):
                state.remove(key)
            return
        old = model.data[key][0]
        model.commit(model.drop(key))
        assert tagged(state.remove(key)) == tagged(old)
    elif kind == "update":
        _, mapping, removes, source = op
        if set(mapping) & set(removes):
            with pytest.raises(StateValueError):
                state.update(mapping, remove=removes, source=source)
            return
        changed = [model.write(k, v, source) for k, v in mapping.items()]
        changed += [model.drop(k) for k in removes]
        model.commit(any(changed))
        assert state.update(mapping, remove=removes, source=source) == model.cursor
    elif kind == "rename":
        _, old, new, overwrite = op
        if old not in model.data:
            with pytest.raises(MissingKeyError):
                state.rename(old, new, overwrite=overwrite)
            return
        if new != old and new in model.data and not overwrite:
            with pytest.raises(KeyExistsError):
                state.rename(old, new, overwrite=overwrite)
            return
        if new != old:
            value, _, source = model.data[old]
            model.drop(old)
            model.write(new, value, source)
            model.commit(True)
        assert state.rename(old, new, overwrite=overwrite) == model.data[new][1]
    elif kind == "clear_prefix":
        doomed = [k for k in model.data if k.startswith(op[1])]
        dropped = [model.drop(k) for k in doomed]
        model.commit(any(dropped))
        assert state.clear_prefix(op[1]) == len(doomed)
    else:
        doomed = [k for k in model.data if k.startswith(("turn:", "temp:"))]
        dropped = [model.drop(k) for k in doomed]
        model.commit(any(dropped))
        assert end_turn(state) == len(doomed)


def assert_agrees(state: State, model: Model) -> None:
    assert state.keys() == list(model.data)
    assert len(state) == len(model.data)
    assert state.journal.cursor == model.cursor
    assert len(state.journal.since(0)) == model.changes
    for key in POOL:
        if key in model.data:
            value, version, source = model.data[key]
            assert tagged(state.get(key)) == tagged(value)
            assert state.version(key) == version
            assert state.provenance(key).source == source
            assert key in state
        else:
            assert key not in state
            assert state.version(key) == 0
            assert state.get(key, "absent") == "absent"
    for prefix in PREFIXES:
        expected = [k for k in model.data if k.startswith(prefix)]
        assert state.keys(prefix) == expected
        assert [k for k, _ in state.items(prefix)] == expected


@settings(quick, max_examples=200)
@given(model_ops)
def test_random_operations_agree_with_a_dict_model(ops: list[tuple[Any, ...]]) -> None:
    state, model = State(), Model()
    for op in ops:
        step(state, model, op)
        assert_agrees(state, model)


# -- values read back equal what was written -------------------------------------------------


@quick
@given(random_keys, json_values)
def test_values_read_back_exactly_as_written(key: str, value: Any) -> None:
    state = State()
    written = copy.deepcopy(value)
    state.set(key, written)
    assert as_json(state.get(key)) == as_json(value)
    assert tagged(state.get(key)) == tagged(value)
    assert tagged(state.entry(key).value) == tagged(value)
    assert state.items() == [(key, value)]

    # Mutating what was written or read leaves the state alone.
    if isinstance(written, list):
        written.append("mutated")
    elif isinstance(written, dict):
        written["mutated"] = True
    read = state.get(key)
    if isinstance(read, list):
        read.append("mutated")
    elif isinstance(read, dict):
        read["mutated"] = True
    assert tagged(state.get(key)) == tagged(value)

    # The value survives JSON: a snapshot sent over the wire restores it exactly.
    restored = State.restore(json.loads(as_json(state.snapshot())))
    assert tagged(restored.get(key)) == tagged(value)

    # Writing it again is a no-op.
    assert state.set(key, copy.deepcopy(value)) == 1
    assert state.journal.cursor == 1


@quick
@given(values, values)
def test_a_write_is_a_change_exactly_when_the_json_differs(first: Any, second: Any) -> None:
    state = State()
    state.set("k", first)
    differs = tagged(first) != tagged(second)
    assert state.set("k", second) == (2 if differs else 1)
    assert state.journal.cursor == (2 if differs else 1)


def retyped(value: Any, how: str) -> Any:
    """``value`` with its dicts reordered and, depending on ``how``, leaves that compare equal
    under ``==`` but are different JSON (1 -> 1.0, True -> 1, 0.0 -> -0.0)."""
    if isinstance(value, dict):
        return {k: retyped(v, how) for k, v in reversed(value.items())}
    if isinstance(value, list):
        return [retyped(v, how) for v in value]
    if how == "int_to_float" and type(value) is int and abs(value) < 2**1000:
        return float(value)
    if how == "bool_to_int" and type(value) is bool:
        return int(value)
    if how == "flip_zero_sign" and type(value) is float and value == 0:
        return -value
    return value


@quick
@given(values, st.sampled_from(["reorder_only", "int_to_float", "bool_to_int", "flip_zero_sign"]))
def test_equal_looking_values_of_other_json_types_are_changes(value: Any, how: str) -> None:
    state = State()
    state.set("k", value)
    other = retyped(value, how)
    differs = tagged(other) != tagged(value)
    assert state.set("k", other) == (2 if differs else 1)
    assert tagged(state.get("k")) == tagged(other)
    assert len(state.journal.since(0)) == (2 if differs else 1)


# -- update is atomic ------------------------------------------------------------------------

BAD_ENTRIES = [
    ("k:nan", float("nan"), StateValueError),
    ("k:inf", {"x": [float("-inf")]}, StateValueError),
    ("k:tuple", (1, 2), StateValueError),
    ("k:set", {1}, StateValueError),
    ("k:bytes", b"x", StateValueError),
    ("k:intkey", {1: "a"}, StateValueError),
    ("k:object", object(), StateValueError),
    ("bad key", 1, InvalidKeyError),
    ("k::empty", 1, InvalidKeyError),
    ("k:*", 1, InvalidKeyError),
    ("state_meta:a", 1, ReadOnlyError),
]


@quick
@given(
    history=write_ops,
    batch=st.dictionaries(keys, values, max_size=6),
    bad=st.sampled_from(BAD_ENTRIES),
    position=st.integers(min_value=0, max_value=6),
)
def test_update_is_all_or_nothing(
    history: list[tuple[Any, ...]],
    batch: dict[str, Any],
    bad: tuple[str, Any, type[Exception]],
    position: int,
) -> None:
    state = State()
    apply_writes(state, history)
    bad_key, bad_value, error = bad
    batch.pop(bad_key, None)
    items = list(batch.items())
    items.insert(min(position, len(items)), (bad_key, bad_value))
    before = fingerprint(state)
    calls: list[object] = []
    with state.subscribe(calls.append), pytest.raises(error):
        state.update(dict(items), source="llm")
    assert fingerprint(state) == before
    assert calls == []

    # Without the bad entry the same batch commits whole, as one seq.
    cursor = state.journal.cursor
    seq = state.update(batch, source="llm")
    for key, value in batch.items():
        assert tagged(state.get(key)) == tagged(value)
    new_changes = state.journal.since(cursor)
    assert {c.seq for c in new_changes} <= {seq}
    assert state.journal.cursor == (cursor + 1 if new_changes else cursor)


# -- key validity ----------------------------------------------------------------------------

candidate_keys = (
    st.text(max_size=12)
    | st.text(st.sampled_from("ab:* \t\n\x00\x1f\x7f\x85\xa0\u2028\u3000é"), max_size=8)
    | st.text(st.sampled_from("ab:"), min_size=250, max_size=262)
)


@quick
@given(candidate_keys)
def test_a_key_is_accepted_exactly_when_it_follows_the_rules(key: str) -> None:
    state = State()
    if key.startswith("state_meta:"):
        with pytest.raises((ReadOnlyError, InvalidKeyError)):
            state.set(key, 1)
    elif is_valid_key(key):
        assert state.set(key, 1) == 1
        assert state.get(key) == 1
        assert state.keys() == [key]
    else:
        with pytest.raises(InvalidKeyError) as info:
            state.set(key, 1)
        assert repr(key) in str(info.value)
        with pytest.raises(InvalidKeyError):
            state.get(key)
        assert len(state) == 0
