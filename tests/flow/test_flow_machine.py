"""The marking machine on its own: no State, no clock, no task (hypothesis).

Random flows (a DAG of steps with plain and conditional edges, ``join`` any or all, gates and
``before`` constraints, every guard an ``is_true`` over a few keys) are driven by random
sequences of facts read through a plain dict. Whatever the sequence, the machine never makes a
step active whose ``after`` is incomplete, never enters a step twice without a reset (flows
may carry a ``reset`` constraint), and, with facts that only become true, ends on the same
marking whether the changes come one by one or in batches of any size.
"""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slateflow.flow import Flow, Guard, Marking, Step, before, edge, is_true, reset
from slateflow.flow.compiled import compiled
from slateflow.flow.constraints import Reset
from slateflow.flow.machine import Event, Machine

KEYS = [f"k{i}" for i in range(4)]


def facts_reader(facts: dict[str, bool]) -> Any:
    """A ``holds`` function over a dict: an ``is_true`` guard holds when its key is True."""

    def holds(guard: Guard, marking: Marking) -> bool:
        return all(facts.get(k) is True for k in guard.keys_read())

    return holds


@st.composite
def flows(draw: st.DrawFn) -> Flow:
    n = draw(st.integers(2, 6))
    keys = st.sampled_from(KEYS)
    steps = []
    for i in range(n):
        after: list[Any] = []
        if i:
            for src in sorted(draw(st.sets(st.integers(0, i - 1), max_size=2))):
                conditional = draw(st.booleans())
                after.append(
                    edge(f"s{src}", when=is_true(draw(keys))) if conditional else f"s{src}"
                )
        gate = is_true(draw(keys)) if draw(st.booleans()) else None
        steps.append(
            Step(
                f"s{i}",
                after=after,
                join=draw(st.sampled_from(["all", "any"])),
                gate=gate,
                done=is_true(draw(keys)),
            )
        )
    constraints = []
    if n > 2 and draw(st.booleans()):
        first, then = sorted(
            draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
        )
        constraints.append(before(f"s{first}", f"s{then}"))
    if draw(st.integers(0, 3)) == 0:
        constraints.append(reset(f"s{draw(st.integers(0, n - 1))}").when(is_true(draw(keys))))
    return Flow("m", steps, constraints=constraints).build()


class Driven:
    """A machine over a dict of facts, checking the invariants after every settling."""

    def __init__(self, flow: Flow) -> None:
        self.flow = flow
        self.facts: dict[str, bool] = {}
        self.machine = Machine(compiled(flow), facts_reader(self.facts))
        self.entered_since_reset: set[int] = set()
        self.machine.start()
        self.machine.starting = True
        self.check(self.machine.latch())

    def apply(self, batch: list[tuple[str, bool]]) -> None:
        for key, value in batch:
            self.facts[key] = value
        self.machine.changed([key for key, _ in batch])
        self.check(self.machine.latch())

    def check(self, events: list[Event]) -> None:
        m = self.machine
        plan = m.plan
        for kind, i in events:
            if kind == "reset":
                self.entered_since_reset.discard(i)
            elif kind == "enter":
                assert i not in self.entered_since_reset, f"step s{i} entered twice"
                self.entered_since_reset.add(i)
        for i, rt in enumerate(plan.rt):
            if not (m.active[i] or m.done[i]):
                continue
            ready = [m.done[e[0]] for e in rt.edges]
            if ready:
                ok = all(ready) if rt.join_all else any(ready)
                assert ok, f"step s{i} is reached with its after incomplete"
            for src in rt.before:
                assert m.done[src], f"step s{i} is reached before s{src} is done"

    def marking(self) -> tuple[Any, ...]:
        """Done and active steps and completion (not which steps were ever entered: a step
        whose done already holds when it is reached passes through without being entered)."""
        m = self.machine
        return (tuple(m.done), tuple(m.active), m.complete)


def chunks(seq: list[Any], sizes: list[int]) -> list[list[Any]]:
    out, at = [], 0
    for size in sizes:
        if at >= len(seq):
            break
        out.append(seq[at : at + size])
        at += size
    if at < len(seq):
        out.append(seq[at:])
    return out


@settings(max_examples=300, deadline=None)
@given(
    flows(),
    st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), max_size=20),
)
def test_no_step_is_reached_early_nor_entered_twice_whatever_the_facts_do(
    flow: Flow, writes: list[tuple[str, bool]]
) -> None:
    driven = Driven(flow)
    for write in writes:
        driven.apply([write])


@settings(max_examples=300, deadline=None)
@given(
    flows(),
    st.lists(st.sampled_from(KEYS), max_size=10),
    st.lists(st.integers(1, 4), max_size=10),
)
def test_the_same_marking_whether_changes_come_one_by_one_or_in_batches(
    flow: Flow, keys: list[str], sizes: list[int]
) -> None:
    # A reset fires on an edge, which batching may merge: compared on flows without one.
    assume(not flow.constraints or not isinstance(flow.constraints[-1], Reset))
    writes = [(key, True) for key in keys]  # facts that only become true
    one_by_one = Driven(flow)
    for write in writes:
        one_by_one.apply([write])
    batched = Driven(flow)
    for batch in chunks(writes, sizes):
        batched.apply(batch)
    all_at_once = Driven(flow)
    all_at_once.apply(writes)
    assert one_by_one.marking() == batched.marking() == all_at_once.marking()


def test_a_gate_flicker_makes_a_step_active_again_without_entering_it_again() -> None:
    flow = Flow("m", [Step("a", gate=is_true("open"), done=is_true("x"))]).build()
    driven = Driven(flow)
    driven.apply([("open", True)])
    driven.apply([("open", False)])
    assert driven.machine.active_ids.ids == []
    driven.apply([("open", True)])
    assert driven.machine.active_ids.ids == ["a"]
    assert driven.entered_since_reset == {0}


def test_the_machine_moves_without_a_state() -> None:
    flow = Flow(
        "m",
        [Step("a", done=is_true("x")), Step("b", after=["a"], done=is_true("y"))],
    ).build()
    driven = Driven(flow)
    assert driven.machine.active_ids.ids == ["a"]
    driven.apply([("x", True)])
    assert driven.machine.done_ids.ids == ["a"]
    assert driven.machine.active_ids.ids == ["b"]
    driven.apply([("y", True)])
    assert driven.machine.complete
