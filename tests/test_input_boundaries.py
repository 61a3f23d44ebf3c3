"""Every input a user can get wrong fails at the boundary with a typed error: values nested too
deep, integers too long to print, guard documents nested too deep, wait timeouts that are not
numbers of seconds."""

from __future__ import annotations

import math
from typing import Any

import pytest

from slateflow import State
from slateflow.errors import GuardFormatError, StateValueError, UsageError
from slateflow.flow import Guard
from slateflow.state.values import MAX_DEPTH, MAX_INT_DIGITS


def nested(levels: int) -> list[Any]:
    """``levels`` lists, each inside the last."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_a_value_may_nest_exactly_as_deep_as_documented() -> None:
    state = State()
    state.set("deep", nested(MAX_DEPTH))
    with pytest.raises(StateValueError, match=f"nested more than {MAX_DEPTH} levels deep"):
        state.set("deeper", nested(MAX_DEPTH + 1))
    assert "deeper" not in state


@pytest.mark.parametrize(
    "value",
    [
        10**MAX_INT_DIGITS,
        -(10**MAX_INT_DIGITS),
        [1, 10**MAX_INT_DIGITS],
        {"x": {"y": 10**MAX_INT_DIGITS}},
    ],
    ids=["int", "negative", "in a list", "in a dict"],
)
def test_an_integer_too_long_to_print_is_refused_when_written(value: Any) -> None:
    state = State()
    state.set("n", 1)
    with pytest.raises(StateValueError, match=f"more than {MAX_INT_DIGITS} digits"):
        state.set("n", value)
    with pytest.raises(StateValueError):
        state.update({"m": value})
    assert state.get("n") == 1
    assert "m" not in state
    assert "n" in state.describe()  # still printable


def test_the_longest_integer_allowed_still_prints_and_snapshots() -> None:
    state = State()
    state.set("n", 10**MAX_INT_DIGITS - 1)
    assert str(10**MAX_INT_DIGITS - 1)[:20] in state.describe()
    assert State.restore(state.snapshot()).get("n") == 10**MAX_INT_DIGITS - 1


def test_a_guard_document_nested_too_deep_is_a_format_error_not_a_recursion_error() -> None:
    node: dict[str, Any] = {"op": "is_set", "key": "a"}
    for _ in range(1000):
        node = {"op": "not", "of": node}
    with pytest.raises(GuardFormatError, match="nests more than 100 levels"):
        Guard.from_json({"format": "slateflow.guard/1", "guard": node})


@pytest.mark.anyio
@pytest.mark.parametrize("timeout", [True, math.nan, "1", -1, math.inf, [1]])
async def test_a_wait_timeout_that_is_not_a_number_of_seconds_is_a_usage_error(
    timeout: Any,
) -> None:
    state = State()
    with pytest.raises(UsageError, match="timeout must be a finite number of seconds"):
        await state.wait_for("x", timeout=timeout)
    with pytest.raises(UsageError, match="wait_until: timeout"):
        await state.wait_until(lambda s: False, timeout=timeout)
