"""Derived values: ``Derived(state, name, fn, reads=[...])`` keeps ``derived:<name>`` computed
from other keys, with provenance naming the input versions."""

from __future__ import annotations

import pytest

from slateflow import State
from slateflow.errors import ReadOnlyError, UsageError
from slateflow.state import Derived, ReadOnlyView


def test_a_derived_value_is_computed_at_once_and_recomputed_when_an_input_changes() -> None:
    state = State()
    state.update({"b:size": 4, "b:price": 25})
    total = Derived(
        state,
        "total",
        lambda s: s.get("b:size", 0) * s.get("b:price", 0),
        reads=["b:size", "b:price"],
    )
    assert state.get("derived:total") == 100
    state.set("b:size", 6)
    assert state.get("derived:total") == 150
    prov = state.provenance("derived:total")
    assert (prov.source, prov.writer) == ("derived", "total")
    assert prov.meta == {"inputs": {"b:size": 2, "b:price": 1}}
    total.close()
    state.set("b:size", 1)
    assert state.get("derived:total") == 150  # closed: the last value stays


def test_derived_keys_are_read_only_through_their_view_and_say_who_computes_them() -> None:
    state = State()
    state.set("x", 1)
    Derived(state, "double", lambda s: s.get("x") * 2, reads=["x"])
    assert ReadOnlyView(state, "derived").get("double") == 2
    with pytest.raises(ReadOnlyError, match=r"computed by Derived\(state"):
        ReadOnlyView(state, "derived").set("double", 3)


def test_a_failing_computation_is_reported_and_keeps_the_last_value() -> None:
    state = State()
    failures: list[BaseException] = []
    state.receiver_failed.connect(lambda s, **kw: failures.append(kw["error"]), weak=False)
    state.set("x", 2)
    Derived(state, "inverse", lambda s: 1 / s.get("x"), reads=["x"])
    assert state.get("derived:inverse") == 0.5
    state.set("x", 0)
    assert state.get("derived:inverse") == 0.5
    assert [type(e).__name__ for e in failures] == ["ZeroDivisionError"]


@pytest.mark.parametrize(
    ("reads", "message"),
    [([], "give the keys it is computed from"), (["derived:self"], "may not read")],
)
def test_a_derived_value_must_read_other_keys(reads: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Derived(State(), "self", lambda s: 1, reads=reads)
