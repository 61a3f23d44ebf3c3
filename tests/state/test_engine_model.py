"""The engine agrees with a plain-dict model on any sequence of writes (hypothesis).

The model is a dict of key -> (value, version) and a commit counter. Each step applies a random
set / update / modify / remove / transaction (committed or rolled back) / recovery (a new State
recovered from the store) to both, then compares: keys, values, versions, the cursor, and the
journal's changes for that step. A store that decides the seq (as a shared store would) and a
replica applying commits it did not make go through the same path.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slateflow import State
from slateflow.errors import MissingKeyError
from slateflow.stores import MemoryStore

KEYS = ["a", "b", "c:d"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-1, 2),
    st.sampled_from([0.0, -0.0, 1.0, 2.5]),
    st.sampled_from(["", "x", "y"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["p", "q"]), inner)
    ),
    max_leaves=5,
)
keys = st.sampled_from(KEYS)


def tagged(value: Any) -> Any:
    """A form where 1, 1.0 and True differ, as the State's equality says."""
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, tagged(v)) for k, v in value.items())))
    if isinstance(value, list):
        return ("list", tuple(tagged(v) for v in value))
    if isinstance(value, float):
        return ("float", value, math.copysign(1.0, value))  # 0.0 and -0.0 differ
    return (type(value).__name__, value)


class Model:
    def __init__(self) -> None:
        self.entries: dict[str, tuple[Any, int]] = {}
        self.seq = 0

    def batch(self, ops: list[tuple[str, Any]]) -> list[tuple[str, Any, int]]:
        """Apply one batch of (key, value or REMOVE) in order; returns its effective changes
        (key, new value or None, version)."""
        changes = []
        for key, value in ops:
            row = self.entries.get(key)
            if value is REMOVE:
                if row is not None:
                    del self.entries[key]
                    changes.append((key, None, 0))
                continue
            if row is not None and tagged(row[0]) == tagged(value):
                continue
            version = 1 if row is None else row[1] + 1
            self.entries[key] = (value, version)
            changes.append((key, value, version))
        if changes:
            self.seq += 1
        return changes


REMOVE = "<remove>"

# Values equal under == that the State must keep apart (written one after the other).
TWINS = [(1, 1.0), (1, True), (0.0, -0.0), ([1], [True]), ({"p": 0}, {"p": 0.0}), (0, False)]

ops = st.one_of(
    st.tuples(st.just("set"), keys, values),
    st.tuples(st.just("twins"), keys, st.sampled_from(TWINS)),
    st.tuples(
        st.just("update"), st.dictionaries(keys, values, max_size=3), st.lists(keys, max_size=2)
    ),
    st.tuples(st.just("modify"), keys, values),
    st.tuples(st.just("remove"), keys),
    st.tuples(
        st.just("transaction"),
        st.lists(st.tuples(keys, st.one_of(values, st.just(REMOVE))), max_size=4),
        st.booleans(),
    ),
    st.tuples(st.just("recover")),
)


def apply(state: State, model: Model, op: tuple[Any, ...], store: MemoryStore) -> State:
    kind = op[0]
    expected: list[tuple[str, Any, int]]
    before = state.journal.cursor
    if kind == "twins":
        _, key, (first, second) = op
        state = apply(state, model, ("set", key, first), store)
        return apply(state, model, ("set", key, second), store)
    if kind == "set":
        _, key, value = op
        expected = model.batch([(key, value)])
        version = state.set(key, value)
        assert version == model.entries[key][1]
    elif kind == "update":
        _, writes, removes = op
        removes = [k for k in removes if k not in writes]
        expected = model.batch([*writes.items(), *((k, REMOVE) for k in removes)])
        state.update(writes, remove=removes)
    elif kind == "modify":
        _, key, value = op
        expected = model.batch([(key, value)])
        assert state.modify(key, None, lambda _old: value) == value
    elif kind == "remove":
        _, key = op
        expected = model.batch([(key, REMOVE)])
        if expected:
            state.remove(key)
        else:
            with pytest.raises(MissingKeyError):
                state.remove(key)
    elif kind == "transaction":
        _, body, commit = op
        # The last write of a key in the block wins, at the place of its first write; removing
        # a key neither stored nor written in the block buffers nothing.
        buffered: dict[str, Any] = {}
        for key, value in body:
            if value == REMOVE and key not in buffered and key not in model.entries:
                continue
            buffered[key] = value
        expected = model.batch(list(buffered.items())) if commit else []
        try:
            with state.transaction():
                for key, value in body:
                    if value == REMOVE:
                        state.remove(key, None)
                    else:
                        state.set(key, value)
                if not commit:
                    raise _Rollback
        except _Rollback:
            pass
    else:  # recover: a new State from the store holds exactly what the old one did
        recovered = State(store=store)
        assert recovered.journal.cursor == state.journal.cursor
        return recovered
    if expected:
        assert state.journal.cursor == before + 1, op
        got = [(c.key, c.new, c.version) for c in state.journal.since(before)]
        assert [(k, tagged(v), n) for k, v, n in got] == [(k, tagged(v), n) for k, v, n in expected]
    else:
        assert state.journal.cursor == before
    return state


class _Rollback(Exception):
    pass


def check(state: State, model: Model) -> None:
    assert sorted(state.keys()) == sorted(model.entries)
    for key, (value, version) in model.entries.items():
        assert tagged(state.get(key)) == tagged(value), key
        assert state.version(key) == version, key
    assert state.journal.cursor == model.seq


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=25))
def test_engine_agrees_with_a_dict_model_on_any_sequence(sequence: list[tuple[Any, ...]]) -> None:
    store = MemoryStore()
    state = State(store=store)
    model = Model()
    for op in sequence:
        state = apply(state, model, op, store)
        check(state, model)
    # A replica fed every commit from the store reaches the same state through apply().
    replica = State()
    for commit in store.commits():
        replica.engine.apply(commit)
    check(replica, model)
    assert replica.snapshot() == state.snapshot()


def test_a_replica_refuses_a_commit_that_does_not_follow_its_cursor() -> None:
    from slateflow.errors import StoreCorruptError

    source = State(store=(store := MemoryStore()))
    source.set("a", 1)
    source.set("a", 2)
    replica = State()
    commits = list(store.commits())
    with pytest.raises(StoreCorruptError, match="does not follow seq 0"):
        replica.engine.apply(commits[1])
    assert replica.journal.cursor == 0
    assert "a" not in replica
    replica.engine.apply(commits[0])
    replica.engine.apply(commits[1])
    assert replica.get("a") == 2
    assert replica.version("a") == 2


def test_a_replica_delivers_applied_commits_like_local_ones() -> None:
    source = State(store=(store := MemoryStore()))
    replica = State()
    got: list[tuple[str, Any]] = []
    replica.subscribe(lambda changes: got.extend((c.key, c.new) for c in changes), keys=["a"])
    source.set("a", "x")
    for commit in store.commits():
        replica.engine.apply(commit)
    assert got == [("a", "x")]
    assert replica.provenance("a") == source.provenance("a")
