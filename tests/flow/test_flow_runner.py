"""FlowRunner, synchronously (no session): latching, re-evaluating only what a change can affect,
resets, completion, the published keys and signals, tool admission, several runners on one State,
writes from other threads, and latching properties against a reference model."""

from __future__ import annotations

import itertools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import run_threads, tagged
from slateflow import (
    Flow,
    Resolver,
    State,
    Step,
    all_,
    any_,
    before,
    called_ok,
    captured,
    commit,
    custom,
    done,
    edge,
    eq,
    is_set,
    is_true,
    never,
    not_,
    once,
    require,
    reset,
    run,
)
from slateflow.errors import FlowDefinitionError, FlowError
from slateflow.flow import (
    Admission,
    Enforcement,
    FlowExplanation,
    FlowRunner,
    Guard,
    Marking,
    Verdict,
    Violation,
    signals,
)

props = settings(deadline=None, max_examples=120)

# -- helpers ------------------------------------------------------------------------------------


class Recorder:
    """Every flow signal sent while it is connected: (kind, sender, flow, step, thread)."""

    KINDS = (
        ("entered", signals.step_entered),
        ("done", signals.step_done),
        ("reset", signals.step_reset),
        ("completed", signals.flow_completed),
    )

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any, str, str | None, int]] = []
        self._receivers: list[tuple[Any, Callable[..., None]]] = []

    def _receiver(self, kind: str) -> Callable[..., None]:
        def receiver(sender: Any, **kw: Any) -> None:
            self.seen.append((kind, sender, kw["flow"], kw.get("step"), threading.get_ident()))

        return receiver

    def connect(self) -> None:
        for kind, signal in self.KINDS:
            fn = self._receiver(kind)
            signal.connect(fn, weak=False)
            self._receivers.append((signal, fn))

    def disconnect(self) -> None:
        for signal, fn in self._receivers:
            signal.disconnect(fn)
        self._receivers.clear()

    def of(self, flow: str) -> list[tuple[str, str | None]]:
        return [(kind, step) for kind, _, name, step, _ in self.seen if name == flow]

    def clear(self) -> None:
        self.seen.clear()


@contextmanager
def recording() -> Iterator[Recorder]:
    rec = Recorder()
    rec.connect()
    try:
        yield rec
    finally:
        rec.disconnect()


@pytest.fixture
def events() -> Iterator[Recorder]:
    with recording() as rec:
        yield rec


def chain(name: str, n: int, **extra: Any) -> Flow:
    """s0 -> s1 -> ... -> s{n-1}; step i is done once key k{i} is set."""
    steps = [
        Step(f"s{i}", after=[f"s{i - 1}"] if i else [], done=is_set(f"k{i}")) for i in range(n)
    ]
    return Flow(name, steps, **extra)


def writes_of(state: State, key: str, since: int) -> int:
    return sum(1 for change in state.journal.since(since) if change.key == key)


class Counted:
    """custom() guards that count their evaluations, by label."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def key_set(self, label: str, key: str) -> Guard:
        def fn(state: State, marking: Marking) -> bool:
            self.calls[label] += 1
            return key in state

        return custom(fn, reads=[key], describe=f"{label}: {key!r} is set")

    def marking(self, label: str, test: Callable[[Marking], bool]) -> Guard:
        def fn(state: State, marking: Marking) -> bool:
            self.calls[label] += 1
            return test(marking)

        return custom(fn, marking=True, describe=f"{label} over the marking")

    def take(self) -> Counter[str]:
        taken, self.calls = self.calls, Counter()
        return taken


# -- latching -----------------------------------------------------------------------------------


def test_a_linear_flow_advances_step_by_step(events: Recorder) -> None:
    state = State()
    runner = FlowRunner(chain("lin", 3), state)
    assert runner.active_steps == ["s0"]
    assert runner.done_steps == []
    assert events.of("lin") == [("entered", "s0")]
    state.set("k0", "x")
    assert runner.active_steps == ["s1"]
    assert runner.done_steps == ["s0"]
    state.set("k1", "x")
    assert runner.active_steps == ["s2"]
    state.set("k2", "x")
    assert runner.active_steps == []
    assert runner.done_steps == ["s0", "s1", "s2"]
    assert runner.is_complete
    assert events.of("lin") == [
        ("entered", "s0"),
        ("done", "s0"),
        ("entered", "s1"),
        ("done", "s1"),
        ("entered", "s2"),
        ("done", "s2"),
        ("completed", None),
    ]


def test_a_later_steps_guard_holding_early_does_not_skip_the_order() -> None:
    state = State()
    runner = FlowRunner(chain("order", 3), state)
    state.set("k2", 1)
    state.set("k1", 1)
    assert runner.active_steps == ["s0"]
    assert runner.done_steps == []
    state.set("k0", 1)
    assert runner.done_steps == ["s0", "s1", "s2"]


def test_join_all_waits_for_every_predecessor() -> None:
    state = State()
    flow = Flow(
        "join",
        [
            Step("a", done=is_set("a")),
            Step("b", done=is_set("b")),
            Step("c", done=is_set("c")),
            Step("end", after=["a", "b", "c"], done=is_set("end")),
        ],
    )
    runner = FlowRunner(flow, state)
    assert runner.active_steps == ["a", "b", "c"]
    state.set("b", 1)
    state.set("a", 1)
    assert runner.active_steps == ["c"]
    assert runner.verdict("end") is Verdict.PENDING
    state.set("c", 1)
    assert runner.active_steps == ["end"]


def test_join_any_starts_after_the_first_predecessor() -> None:
    state = State()
    flow = Flow(
        "any",
        [
            Step("a", done=is_set("a")),
            Step("b", done=is_set("b")),
            Step("end", after=["a", "b"], join="any", done=is_set("end")),
        ],
    )
    runner = FlowRunner(flow, state)
    state.set("b", 1)
    assert runner.active_steps == ["a", "end"]
    state.set("end", 1)
    assert runner.done_steps == ["b", "end"]
    assert runner.active_steps == ["a"]


def branching(name: str = "br") -> Flow:
    return Flow(
        name,
        [
            Step("check", done=is_set("open")),
            Step("confirm", after=[edge("check", when=eq("open", True))], done=is_set("yes")),
            Step("offer", after=[edge("check", when=eq("open", False))], done=is_set("other")),
            Step("bye", after=["confirm", "offer"], join="any", terminal=True),
        ],
    )


def test_conditional_edges_take_only_the_branch_whose_guard_holds() -> None:
    state = State()
    runner = FlowRunner(branching(), state)
    state.set("open", False)
    assert runner.active_steps == ["offer"]
    assert runner.verdict("confirm") is Verdict.PENDING
    state.set("yes", 1)  # the other branch's done guard: it is not reachable, so not done
    assert runner.verdict("confirm") is Verdict.PENDING
    state.set("other", 1)
    assert runner.done_steps == ["check", "offer", "bye"]
    assert runner.is_complete
    assert runner.verdict("confirm") is Verdict.SKIPPED


def test_a_branch_guard_that_turns_true_later_opens_the_branch() -> None:
    state = State()
    runner = FlowRunner(branching(), state)
    state.set("open", "unknown")  # check is done, but neither branch holds
    assert runner.done_steps == ["check"]
    assert runner.active_steps == []
    state.set("open", True)
    assert runner.active_steps == ["confirm"]


def test_join_all_needs_every_edge_guard_to_hold() -> None:
    state = State()
    flow = Flow(
        "cond_all",
        [
            Step("a", done=is_set("a")),
            Step("b", done=is_set("b")),
            Step("c", after=[edge("a", when=is_true("go")), "b"], done=is_set("c")),
        ],
    )
    runner = FlowRunner(flow, state)
    state.update({"a": 1, "b": 1})
    assert runner.active_steps == []
    state.set("go", True)
    assert runner.active_steps == ["c"]


def test_gate_controls_whether_a_reachable_step_is_active(events: Recorder) -> None:
    state = State()
    flow = Flow(
        "gate",
        [
            Step("a", done=is_set("a")),
            Step("b", after=["a"], gate=is_true("open"), done=is_set("b"), posture="B"),
        ],
    )
    runner = FlowRunner(flow, state)
    state.set("a", 1)
    assert runner.active_steps == []
    assert runner.verdict("b") is Verdict.PENDING
    state.set("open", True)
    assert runner.active_steps == ["b"]
    assert state.get("flow:gate:active") == ["b"]
    state.set("open", False)  # the gate closes on an active step: it is no longer active
    assert runner.active_steps == []
    assert runner.verdict("b") is Verdict.PENDING
    assert state.get("flow:gate:active") == []
    assert list(runner.brief().postures) == []
    state.set("b", 1)  # not reachable: its done guard is not enough
    assert runner.done_steps == ["a"]
    state.set("open", True)  # open again: active again, but entered only once
    assert runner.done_steps == ["a", "b"]
    state.set("open", False)  # a done step stays done when its gate closes
    assert runner.done_steps == ["a", "b"]
    assert events.of("gate").count(("entered", "b")) == 1


def test_a_gate_flicker_does_not_enter_the_step_again(events: Recorder) -> None:
    state = State()
    flow = Flow("flicker", [Step("a", gate=is_true("open"), done=is_set("a"))])
    runner = FlowRunner(flow, state)
    assert runner.active_steps == []
    for _ in range(3):
        state.set("open", True)
        assert runner.active_steps == ["a"]
        state.set("open", False)
        assert runner.active_steps == []
    assert events.of("flicker") == [("entered", "a")]


def test_before_orders_steps_without_an_edge() -> None:
    state = State()
    flow = Flow(
        "bef",
        [Step("greet", done=is_set("hello")), Step("ask", done=is_set("date"))],
        constraints=[before("greet", "ask")],
    )
    runner = FlowRunner(flow, state)
    assert runner.active_steps == ["greet"]
    state.set("date", "mon")
    assert runner.done_steps == []
    state.set("hello", True)
    assert runner.done_steps == ["greet", "ask"]


def test_a_terminal_step_is_done_as_soon_as_it_is_reached(events: Recorder) -> None:
    state = State()
    flow = Flow(
        "term",
        [Step("a", done=is_set("a")), Step("bye", after=["a"], terminal=True)],
    )
    runner = FlowRunner(flow, state)
    assert runner.verdict("bye") is Verdict.PENDING
    state.set("a", 1)
    assert runner.verdict("bye") is Verdict.DONE
    assert runner.is_complete
    assert ("entered", "bye") not in events.of("term")
    assert ("done", "bye") in events.of("term")


def test_a_flow_that_starts_with_a_terminal_step_is_complete_at_once(events: Recorder) -> None:
    state = State()
    runner = FlowRunner(Flow("only", [Step("bye", terminal=True)]), state)
    assert runner.is_complete
    assert state.get("flow:only:complete") is True
    assert events.of("only") == [("done", "bye"), ("completed", None)]


def test_done_stays_done_when_its_keys_are_removed() -> None:
    state = State()
    runner = FlowRunner(chain("sticky", 2), state)
    state.set("k0", 1)
    state.remove("k0")
    assert runner.done_steps == ["s0"]
    assert runner.active_steps == ["s1"]
    runner.advance()
    assert runner.done_steps == ["s0"]
    assert state.get("flow:sticky:done") == ["s0"]


def test_a_step_already_done_when_reached_is_done_without_being_entered(
    events: Recorder,
) -> None:
    state = State()
    state.set("k1", "already")
    runner = FlowRunner(chain("pre", 3), state)
    state.set("k0", 1)
    assert runner.done_steps == ["s0", "s1"]
    assert runner.active_steps == ["s2"]
    assert events.of("pre") == [
        ("entered", "s0"),
        ("done", "s0"),
        ("done", "s1"),
        ("entered", "s2"),
    ]


def test_steps_already_done_at_start_are_latched_by_the_constructor(events: Recorder) -> None:
    state = State()
    state.update({"k0": 1, "k1": 1})
    runner = FlowRunner(chain("start", 3), state)
    assert runner.done_steps == ["s0", "s1"]
    assert runner.active_steps == ["s2"]
    assert events.of("start") == [("done", "s0"), ("done", "s1"), ("entered", "s2")]
    assert state.get("flow:start:done") == ["s0", "s1"]


def test_a_chain_completes_to_its_fixed_point_in_one_write(events: Recorder) -> None:
    n = 12
    state = State()
    state.update({f"k{i}": i for i in range(1, n)})
    runner = FlowRunner(chain("fix", n), state)
    assert runner.active_steps == ["s0"]
    events.clear()
    cursor = state.journal.cursor
    state.set("k0", 0)
    assert runner.done_steps == [f"s{i}" for i in range(n)]
    assert runner.is_complete
    assert events.of("fix") == [("done", f"s{i}") for i in range(n)] + [("completed", None)]
    # The settling is published once: one write of each flow key, not one per step.
    for key in ("done", "active", "complete"):
        assert writes_of(state, f"flow:fix:{key}", cursor) == 1


def test_writes_in_a_transaction_advance_the_flow_at_commit() -> None:
    state = State()
    runner = FlowRunner(chain("tx", 3), state)
    with state.transaction():
        state.set("k0", 1)
        state.set("k1", 1)
        assert runner.done_steps == []
        assert runner.active_steps == ["s0"]
    assert runner.done_steps == ["s0", "s1"]
    assert runner.active_steps == ["s2"]


def test_a_rolled_back_transaction_advances_nothing() -> None:
    state = State()
    runner = FlowRunner(chain("rollback", 2), state)

    def abandon() -> None:
        with state.transaction():
            state.set("k0", 1)
            raise RuntimeError("abandon")

    with pytest.raises(RuntimeError, match="abandon"):
        abandon()
    assert runner.done_steps == []
    assert runner.active_steps == ["s0"]


def test_an_update_batch_advances_in_one_settling() -> None:
    state = State()
    runner = FlowRunner(chain("batch", 3), state)
    cursor = state.journal.cursor
    state.update({"k2": 1, "k0": 1, "k1": 1})
    assert runner.done_steps == ["s0", "s1", "s2"]
    assert writes_of(state, "flow:batch:done", cursor) == 1


def test_a_removal_in_an_update_can_close_a_gate() -> None:
    state = State()
    flow = Flow("rm", [Step("a", gate=is_set("g"), done=is_set("a"))])
    state.set("g", 1)
    runner = FlowRunner(flow, state)
    assert runner.active_steps == ["a"]
    state.update({"other": 1}, remove=["g"])
    assert runner.active_steps == []


# -- re-evaluating only what a change can affect ------------------------------------------------


def test_a_write_evaluates_only_the_guards_that_read_the_key() -> None:
    counted = Counted()
    steps = [Step(f"s{i}", done=counted.key_set(f"s{i}", f"k{i}")) for i in range(30)]
    state = State()
    runner = FlowRunner(Flow("sel", steps), state)
    assert counted.take() == Counter({f"s{i}": 1 for i in range(30)})
    state.set("k7", 1)
    assert counted.take() == Counter({"s7": 1})
    assert runner.done_steps == ["s7"]
    state.update({"k3": 1, "k11": 1})
    assert counted.take() == Counter({"s3": 1, "s11": 1})
    state.set("k7", 2)  # s7 is done: its guard is not evaluated again
    assert counted.take() == Counter()


def test_a_write_to_a_key_no_guard_reads_evaluates_nothing() -> None:
    counted = Counted()
    steps = [Step(f"s{i}", done=counted.key_set(f"s{i}", f"k{i}")) for i in range(10)]
    steps.append(Step("m", done=counted.marking("m", lambda m: "s0" in m.done)))
    state = State()
    runner = FlowRunner(Flow("unread", steps), state)
    counted.take()
    cursor = state.journal.cursor
    state.set("nobody:reads:this", 1)
    state.update({"nor:this": 1, "nor:that": 2})
    assert counted.take() == Counter()
    assert writes_of(state, "flow:unread:active", cursor) == 0
    assert runner.active_steps == [f"s{i}" for i in range(10)] + ["m"]


def test_a_done_step_evaluates_its_successors() -> None:
    counted = Counted()
    steps = [
        Step("a", done=is_set("a")),
        Step("b", after=["a"], done=counted.key_set("b", "b")),
        Step("c", done=counted.key_set("c", "c")),
    ]
    state = State()
    FlowRunner(Flow("succ", steps), state)
    assert counted.take() == Counter({"c": 1})  # b is not reachable yet
    state.set("a", 1)
    assert counted.take() == Counter({"b": 1})


def test_a_marking_guard_is_evaluated_again_when_the_marking_changes() -> None:
    counted = Counted()
    steps = [
        Step("a", done=is_set("a")),
        Step("b", done=is_set("b")),
        Step("m", done=counted.marking("m", lambda m: {"a", "b"} <= m.done)),
        Step("plain", done=counted.key_set("plain", "p")),
    ]
    state = State()
    runner = FlowRunner(Flow("mark", steps), state)
    counted.take()
    state.set("a", 1)
    assert counted.take() == Counter({"m": 1})
    assert runner.verdict("m") is Verdict.ACTIVE
    runner.on_tool_ok("anything")  # a tool call changes the marking too
    assert counted.take() == Counter({"m": 1})
    state.set("b", 1)
    assert counted.take() == Counter({"m": 1})
    assert runner.verdict("m") is Verdict.DONE


def test_a_custom_guard_without_marking_is_not_evaluated_on_marking_changes() -> None:
    counted = Counted()
    steps = [
        Step("a", done=is_set("a")),
        Step("plain", done=counted.key_set("plain", "p")),
    ]
    state = State()
    runner = FlowRunner(Flow("nomark", steps), state)
    counted.take()
    state.set("a", 1)
    runner.on_tool_ok("tool")
    assert counted.take() == Counter()


def test_called_ok_counts_successful_tool_calls() -> None:
    counted = Counted()
    steps = [
        Step("book", done=called_ok("book_slot"), allow=["book_slot", "search"]),
        Step("other", done=counted.key_set("other", "o")),
    ]
    state = State()
    runner = FlowRunner(Flow("tools", steps), state)
    counted.take()
    runner.on_tool_ok("search")
    assert runner.verdict("book") is Verdict.ACTIVE
    runner.on_tool_ok("book_slot")
    assert runner.verdict("book") is Verdict.DONE
    assert counted.take() == Counter()
    assert dict(runner.marking.tools_ok) == {"search": 1, "book_slot": 1}
    runner.on_tool_ok("book_slot")
    assert runner.marking.tools_ok["book_slot"] == 2
    assert runner.marking.done == frozenset({"book"})


def test_done_guards_across_steps() -> None:
    state = State()
    flow = Flow(
        "across",
        [
            Step("a", done=is_set("a")),
            Step("b", done=is_set("b")),
            Step("both", done=all_(done("a"), done("b"))),
            Step("either", done=any_(done("a"), done("b"))),
            Step("not_a", gate=not_(done("a")), done=is_set("n")),
        ],
    )
    runner = FlowRunner(flow, state)
    assert runner.active_steps == ["a", "b", "both", "either", "not_a"]
    state.set("b", 1)
    assert runner.done_steps == ["b", "either"]
    state.set("a", 1)
    assert runner.done_steps == ["a", "b", "both", "either"]
    assert runner.active_steps == []  # not_a's gate closed when a was done
    state.set("n", 1)
    assert runner.verdict("not_a") is Verdict.PENDING


def test_advance_re_evaluates_every_guard() -> None:
    outside = {"ready": False}
    flow = Flow("adv", [Step("a", done=custom(lambda s, m: outside["ready"]))])
    runner = FlowRunner(flow, State())
    outside["ready"] = True
    assert runner.done_steps == []
    runner.advance()
    assert runner.done_steps == ["a"]


# -- resets -------------------------------------------------------------------------------------


def reset_flow(name: str, when: Guard) -> Flow:
    return Flow(
        name,
        [
            Step("greet", done=is_set("hello")),
            Step("date", after=["greet"], done=is_set("date")),
            Step("time", after=["date"], done=is_set("time")),
            Step("side", after=["greet"], done=is_set("side")),
            Step("confirm", after=["time"], done=is_true("confirmed")),
        ],
        constraints=[reset("date").when(when)],
    )


def test_a_reset_re_opens_its_steps_and_every_step_after_them(events: Recorder) -> None:
    state = State()
    runner = FlowRunner(reset_flow("rs", is_true("change")), state)
    state.update({"hello": 1, "date": "mon", "time": "9", "side": 1})
    assert runner.done_steps == ["greet", "date", "time", "side"]
    assert runner.active_steps == ["confirm"]
    state.remove("time")  # so time waits again once re-opened
    events.clear()
    state.set("change", True)
    # date's done guard still holds: it latches again at once; time waits for its key.
    assert runner.done_steps == ["greet", "date", "side"]
    assert runner.active_steps == ["time"]
    assert events.of("rs") == [
        ("reset", "date"),
        ("reset", "time"),
        ("reset", "confirm"),
        ("done", "date"),
        ("entered", "time"),
    ]
    assert state.get("flow:rs:done") == ["greet", "date", "side"]
    assert state.get("flow:rs:active") == ["time"]


def test_a_reset_re_opens_the_steps_a_before_constraint_orders_after_them() -> None:
    # before("ask", "pay") orders pay after ask without an edge: re-opening ask re-opens pay,
    # or pay would stay done while ask is not (found by the machine's hypothesis test).
    flow = Flow(
        "ordered",
        [Step("ask", done=is_true("asked")), Step("pay", done=is_true("paid"))],
        constraints=[before("ask", "pay"), reset("ask").when(is_true("again"))],
    )
    state = State()
    runner = FlowRunner(flow, state)
    state.update({"asked": True, "paid": True})
    assert runner.done_steps == ["ask", "pay"]
    state.remove("asked")
    state.set("again", True)
    assert runner.active_steps == ["ask"]
    assert runner.done_steps == []  # pay waits for ask again
    assert runner.verdict("pay") is Verdict.PENDING


def test_a_reset_fires_on_the_rising_edge_only(events: Recorder) -> None:
    state = State()
    runner = FlowRunner(reset_flow("edge", is_true("change")), state)
    state.update({"hello": 1, "date": "mon"})
    state.set("change", True)
    assert events.of("edge").count(("reset", "date")) == 1
    events.clear()
    state.set("date", "tue")  # the guard still holds: no new reset
    state.set("change", True)  # an equal write is not a change
    runner.advance()
    assert events.of("edge") == []
    state.set("change", False)
    assert events.of("edge") == []
    state.set("change", True)
    assert ("reset", "date") in events.of("edge")
    assert runner.done_steps == ["greet", "date"]


def test_a_reset_whose_guard_holds_at_start_does_not_fire(events: Recorder) -> None:
    state = State()
    state.update({"hello": 1, "date": "mon", "change": True})
    runner = FlowRunner(reset_flow("early", is_true("change")), state)
    assert runner.done_steps == ["greet", "date"]
    assert not [e for e in events.of("early") if e[0] == "reset"]


def test_a_reset_leaves_steps_never_reached_alone(events: Recorder) -> None:
    state = State()
    runner = FlowRunner(reset_flow("unreached", is_true("change")), state)
    state.set("hello", 1)
    events.clear()
    state.set("change", True)
    # date was active: it is re-opened (and entered again); time and confirm were never reached.
    assert events.of("unreached") == [("reset", "date"), ("entered", "date")]
    assert runner.active_steps == ["date", "side"]


def test_a_reset_re_enters_an_active_step(events: Recorder) -> None:
    state = State()
    runner = FlowRunner(reset_flow("reenter", is_true("change")), state)
    state.update({"hello": 1})
    state.set("change", True)
    state.set("change", False)
    state.set("change", True)
    assert events.of("reenter").count(("entered", "date")) == 3
    assert runner.active_steps == ["date", "side"]


def test_a_reset_whose_guard_reads_done_of_a_step_it_re_opens_terminates(
    events: Recorder,
) -> None:
    state = State()
    flow = Flow(
        "loop",
        [
            Step("a", done=is_set("a")),
            Step("b", after=["a"], done=is_set("b")),
            Step("c", after=["b"], done=is_set("c")),
        ],
        constraints=[reset("a").when(done("b"))],
    )
    runner = FlowRunner(flow, state)
    state.set("a", 1)
    state.set("b", 1)  # b done -> reset a (and b, c) -> a and b latch again -> guard rises again
    assert runner.done_steps == ["a", "b"]
    assert runner.active_steps == ["c"]
    resets = [e for e in events.of("loop") if e[0] == "reset"]
    assert resets == [("reset", "a"), ("reset", "b")]
    events.clear()
    runner.advance()  # the guard holds and held: no further reset
    state.set("c", 1)
    assert [e for e in events.of("loop") if e[0] == "reset"] == []
    assert runner.is_complete


def test_a_reset_on_a_removal_and_completion_again(events: Recorder) -> None:
    state = State()
    flow = Flow(
        "again",
        [Step("date", done=is_set("date")), Step("bye", after=["date"], terminal=True)],
        constraints=[reset("date").when(not_(is_set("date")))],
    )
    runner = FlowRunner(flow, state)
    state.set("date", "mon")
    assert runner.is_complete
    state.remove("date")
    assert not runner.is_complete
    assert runner.active_steps == ["date"]
    assert state.get("flow:again:complete") is False
    state.set("date", "tue")
    assert runner.is_complete
    assert events.of("again").count(("completed", None)) == 2


# -- completion, verdicts, postures, grounds ----------------------------------------------------


def test_complete_without_require_or_terminals_means_every_step_done() -> None:
    state = State()
    flow = Flow("all", [Step("a", done=is_set("a")), Step("b", done=is_set("b"))])
    runner = FlowRunner(flow, state)
    state.set("a", 1)
    assert not runner.is_complete
    state.set("b", 1)
    assert runner.is_complete


def test_complete_with_terminals_needs_one_of_them() -> None:
    state = State()
    runner = FlowRunner(branching("terms"), state)
    state.update({"open": True, "yes": 1})
    assert runner.is_complete
    assert "offer" not in runner.done_steps


def test_complete_with_require_needs_the_required_steps(events: Recorder) -> None:
    state = State()
    flow = Flow(
        "req",
        [
            Step("name", done=is_set("name")),
            Step("phone", done=is_set("phone")),
            Step("extra", done=is_set("extra")),
        ],
        constraints=[require("phone", "name")],
    )
    runner = FlowRunner(flow, state)
    assert list(runner.brief().unmet) == ["phone", "name"]
    state.set("name", "Ann")
    assert list(runner.brief().unmet) == ["phone"]
    assert not runner.is_complete
    state.set("phone", "555")
    assert list(runner.brief().unmet) == []
    assert runner.is_complete
    assert runner.verdict("extra") is Verdict.ACTIVE  # still open, but not needed
    state.set("extra", 1)
    assert events.of("req").count(("completed", None)) == 1


def test_complete_with_require_and_terminals_needs_both() -> None:
    state = State()
    flow = Flow(
        "both",
        [
            Step("name", done=is_set("name")),
            Step("bye", after=[edge("name", when=is_true("leaving"))], terminal=True),
            Step("phone", done=is_set("phone")),
        ],
        constraints=[require("phone")],
    )
    runner = FlowRunner(flow, state)
    state.set("phone", 1)
    assert not runner.is_complete
    state.update({"name": 1, "leaving": True})
    assert runner.is_complete


def test_flow_completed_is_sent_once_per_completion(events: Recorder) -> None:
    state = State()
    flow = Flow(
        "twice",
        [
            Step("a", done=is_set("a")),
            Step("end1", after=["a"], terminal=True),
            Step("b", done=is_set("b")),
            Step("end2", after=["b"], terminal=True),
        ],
    )
    runner = FlowRunner(flow, state)
    state.set("a", 1)
    state.set("b", 1)
    runner.advance()
    assert runner.done_steps == ["a", "end1", "b", "end2"]
    assert events.of("twice").count(("completed", None)) == 1


def test_verdicts() -> None:
    state = State()
    flow = Flow(
        "verdict",
        [
            Step("a", done=is_set("a")),
            Step("opt", after=["a"], done=is_set("opt")),
            Step("b", after=["a"], done=is_set("b")),
            Step("c", after=["opt", "b"], join="any", done=is_set("c")),
            Step("late", after=["c"], done=is_set("late")),
        ],
        constraints=[require("c")],
    )
    runner = FlowRunner(flow, state)
    assert [runner.verdict(s) for s in ("a", "opt", "b", "c", "late")] == [
        Verdict.ACTIVE,
        Verdict.PENDING,
        Verdict.PENDING,
        Verdict.PENDING,
        Verdict.PENDING,
    ]
    state.set("a", 1)
    state.set("b", 1)
    assert runner.verdict("opt") is Verdict.ACTIVE
    assert runner.verdict("b") is Verdict.DONE
    assert runner.verdict("c") is Verdict.ACTIVE
    state.set("c", 1)
    assert runner.is_complete
    # Still reachable and not done: an open step stays active after the flow completed.
    assert runner.verdict("opt") is Verdict.ACTIVE
    assert runner.verdict("late") is Verdict.ACTIVE


def test_skipped_when_a_later_step_is_done_or_the_flow_completed() -> None:
    state = State()
    flow = Flow(
        "skip",
        [
            Step("a", done=is_set("a")),
            Step("opt", after=[edge("a", when=is_true("want"))], done=is_set("opt")),
            Step("b", after=["a", "opt"], join="any", done=is_set("b")),
            Step("never", after=[edge("b", when=is_true("nope"))], done=is_set("never")),
            Step("bye", after=["b"], terminal=True),
        ],
    )
    runner = FlowRunner(flow, state)
    state.set("a", 1)
    assert runner.verdict("opt") is Verdict.PENDING
    assert runner.verdict("b") is Verdict.ACTIVE
    assert runner.verdict("never") is Verdict.PENDING
    state.set("b", 1)
    assert runner.is_complete
    assert runner.verdict("opt") is Verdict.SKIPPED  # b, after it, is done
    assert runner.verdict("never") is Verdict.SKIPPED  # the flow completed without it
    assert runner.verdict("bye") is Verdict.DONE


def test_verdict_of_an_unknown_step_raises() -> None:
    runner = FlowRunner(chain("unknown", 2), State())
    with pytest.raises(FlowError, match=r"no step 'zz'.*s0, s1"):
        runner.verdict("zz")


def test_postures_and_grounds_of_the_active_steps() -> None:
    state = State()
    flow = Flow(
        "talk",
        [
            Step("a", done=is_set("a"), posture="Greet the caller.", ground="Caller: {name}"),
            Step("b", done=is_set("b"), ground="{vip?A VIP caller.:}"),
            Step("c", done=is_set("c"), posture="", ground="Date {date?unknown}"),
            Step("d", after=["a"], done=is_set("d"), posture="Ask the date.", ground="Later"),
        ],
    )
    runner = FlowRunner(flow, state)
    assert list(runner.brief().postures) == ["Greet the caller."]  # an empty posture is not one
    # "Caller: " renders (the name is missing, not the line); the VIP line renders blank.
    assert list(runner.brief().grounds) == ["Caller: ", "Date unknown"]
    state.update({"name": "Ann", "vip": True, "date": "mon"})
    assert list(runner.brief().grounds) == ["Caller: Ann", "A VIP caller.", "Date mon"]
    state.set("a", 1)
    assert list(runner.brief().postures) == ["Ask the date."]
    assert list(runner.brief().grounds) == ["A VIP caller.", "Date mon", "Later"]


def test_blank_grounds_are_dropped() -> None:
    state = State()
    flow = Flow(
        "blank",
        [
            Step("a", done=is_set("a"), ground="{x}"),
            Step("b", done=is_set("b"), ground="   {y?:}  "),
            Step("c", done=is_set("c"), ground="{z?yes:no}"),
        ],
    )
    runner = FlowRunner(flow, state)
    assert list(runner.brief().grounds) == ["no"]
    state.update({"x": "X", "z": 0})
    assert list(runner.brief().grounds) == ["X", "no"]


# -- published keys and signals -----------------------------------------------------------------


def test_flow_keys_hold_ids_in_flow_order_with_flow_provenance() -> None:
    state = State()
    flow = Flow("keys", [Step(f"s{i}", done=is_set(f"k{i}")) for i in range(4)])
    runner = FlowRunner(flow, state)
    assert state.get("flow:keys:active") == ["s0", "s1", "s2", "s3"]
    assert state.get("flow:keys:done") == []
    assert state.get("flow:keys:complete") is False
    state.set("k3", 1)
    state.set("k0", 1)
    state.set("k2", 1)
    assert state.get("flow:keys:done") == ["s0", "s2", "s3"]  # flow order, not done order
    assert state.get("flow:keys:active") == ["s1"]
    for key in ("active", "done", "complete"):
        prov = state.provenance(f"flow:keys:{key}")
        assert prov is not None
        assert (prov.source, prov.writer) == ("flow", "keys")
    state.set("k1", 1)
    assert state.get("flow:keys:complete") is True
    assert runner.done_steps == state.get("flow:keys:done")


def test_flow_keys_are_written_only_when_they_change() -> None:
    state = State()
    flow = Flow("quiet", [Step("a", done=is_set("a")), Step("b", done=is_set("b"))])
    runner = FlowRunner(flow, state)
    cursor = state.journal.cursor
    runner.advance()
    runner.on_tool_ok("x")
    assert state.journal.since(cursor) == []
    state.set("a", 1)
    assert writes_of(state, "flow:quiet:active", cursor) == 1
    assert writes_of(state, "flow:quiet:done", cursor) == 1
    assert writes_of(state, "flow:quiet:complete", cursor) == 0


def test_a_guard_can_read_another_flows_keys() -> None:
    state = State()
    first = FlowRunner(chain("first", 1), state)
    second = FlowRunner(Flow("second", [Step("go", done=is_true("flow:first:complete"))]), state)
    assert second.active_steps == ["go"]
    state.set("k0", 1)
    assert first.is_complete
    assert second.is_complete


def test_signals_carry_the_runner_and_can_be_filtered_by_sender() -> None:
    state = State()
    one = FlowRunner(chain("one", 2), state)
    two = FlowRunner(chain("two", 2), state)
    seen: list[tuple[Any, str, str]] = []

    def on_done(sender: Any, **kw: Any) -> None:
        seen.append((sender, kw["flow"], kw["step"]))

    signals.step_done.connect(on_done, sender=one)
    try:
        state.update({"k0": 1, "k1": 1})
    finally:
        signals.step_done.disconnect(on_done, sender=one)
    assert two.done_steps == ["s0", "s1"]
    assert seen == [(one, "one", "s0"), (one, "one", "s1")]


def test_a_raising_receiver_does_not_break_the_flow(
    events: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(sender: Any, **kw: Any) -> None:
        raise RuntimeError("receiver bug")

    state = State()
    runner = FlowRunner(chain("robust", 2), state)
    signals.step_done.connect(broken, weak=False)
    signals.step_entered.connect(broken, weak=False)
    try:
        with caplog.at_level(logging.ERROR, logger="slateflow.flow"):
            state.set("k0", 1)
            state.set("k1", 1)
    finally:
        signals.step_done.disconnect(broken)
        signals.step_entered.disconnect(broken)
    assert runner.is_complete
    assert state.get("flow:robust:complete") is True
    assert ("done", "s1") in events.of("robust")
    assert ("completed", None) in events.of("robust")
    failures = [r for r in caplog.records if r.name == "slateflow.flow"]
    assert len(failures) == 3  # done s0, entered s1, done s1
    assert all("receiver failed" in r.getMessage() for r in failures)


# -- admission ----------------------------------------------------------------------------------


def admission_flow(name: str = "adm", *, allow_charge: bool = False, **kw: Any) -> Flow:
    book_tools = ["book", "charge"] if allow_charge else ["book"]
    return Flow(
        name,
        [
            Step(
                "ask",
                done=is_set("date"),
                allow=["search", "lookup"],
                deny=["book"],
                posture="Ask for the date.",
            ),
            Step("book", after=["ask"], done=called_ok("book"), allow=book_tools, posture="Book."),
        ],
        constraints=[
            once("book"),
            never("pay").until(is_true("total")),
            commit("charge", until=is_true("confirmed")),
        ],
        ambient=["escalate", "pay"],
        **kw,
    )


def test_admission_allows_the_active_steps_tools_and_ambient_ones() -> None:
    state = State()
    runner = FlowRunner(admission_flow(), state)
    for tool in ("search", "lookup", "escalate"):
        assert runner.admit(tool) == Admission(tool, True)
        assert not runner.admit(tool, record=False).reason
    assert bool(runner.admit("search")) is True
    assert bool(runner.admit("unknown_tool")) is False


def test_refusal_reasons_say_what_is_missing_and_what_is_available() -> None:
    state = State()
    runner = FlowRunner(admission_flow(), state)
    available = "Available now: escalate, lookup, search. Ask for the date."
    assert runner.admit("book").reason == (
        f"'book' is not allowed during the current step ('ask'). {available}"
    )
    assert runner.admit("pay").reason == (
        f"'pay' is not permitted yet: first, 'total' must be true. {available}"
    )
    assert runner.admit("charge").reason == (
        f"'charge' is not permitted yet: first, 'confirmed' must be true. {available}"
    )
    assert runner.admit("weather").reason == (
        f"'weather' is not part of the current step ('ask'). {available}"
    )
    assert runner.admit("weather", record=False).reason == runner.admit("weather").reason
    state.set("date", "mon")
    assert runner.admit("search").reason == (
        "'search' is not part of the current step ('book'). Available now: book, escalate. Book."
    )


def test_admission_check_order() -> None:
    state = State()
    flow = Flow(
        "order",
        [Step("a", done=is_set("a"), allow=["listed"], deny=["both", "amb"], posture="P.")],
        constraints=[
            once("both"),
            never("both").until(is_true("never_ok")),
            never("guarded").until(is_true("never_ok")),
        ],
        ambient=["amb", "free", "guarded"],
    )
    runner = FlowRunner(flow, state)
    # never/commit before deny: 'both' is denied by the step and not yet permitted.
    assert "not permitted yet" in runner.admit("both").reason
    state.set("never_ok", True)
    assert "not allowed during the current step ('a')" in runner.admit("both").reason
    # once before everything: spent, whatever else holds.
    runner.on_tool_ok("both")
    state.set("never_ok", False)
    assert "already run" in runner.admit("both").reason
    # deny before ambient; ambient before allow lists; never still binds an ambient tool.
    assert "not allowed during the current step" in runner.admit("amb").reason
    assert runner.admit("free").allowed
    assert "not permitted yet" in runner.admit("guarded").reason
    assert "not part of the current step" in runner.admit("other").reason


def test_a_spent_once_tool_says_do_not_call_it_again_and_offers_nothing() -> None:
    state = State()
    runner = FlowRunner(admission_flow(), state)
    state.set("date", "mon")
    assert runner.admit("book").allowed
    runner.on_tool_ok("book")
    reason = runner.admit("book").reason
    assert reason == (
        "'book' has already run and may run only once in this conversation. Do not call it again."
    )
    assert "Available" not in reason


def test_commit_is_refused_until_its_guard_and_then_only_once() -> None:
    state = State()
    runner = FlowRunner(admission_flow(allow_charge=True), state)
    state.set("date", "mon")
    assert "first, 'confirmed' must be true" in runner.admit("charge").reason
    state.set("confirmed", True)
    assert runner.admit("charge").allowed
    runner.on_tool_ok("charge")
    assert "already run" in runner.admit("charge").reason
    state.set("confirmed", False)
    assert "already run" in runner.admit("charge").reason


def test_a_commit_tool_is_still_bound_by_the_allow_lists_once_its_guard_holds() -> None:
    state = State()
    runner = FlowRunner(admission_flow(), state)
    state.set("date", "mon")  # the active step 'book' allows only 'book'
    state.set("confirmed", True)
    assert "not part of the current step" in runner.admit("charge").reason


def test_a_complete_flow_admits_only_its_ambient_tools_and_the_constraints_hold() -> None:
    state = State()
    runner = FlowRunner(admission_flow(), state)
    state.set("date", "mon")
    runner.on_tool_ok("book")
    assert runner.is_complete
    assert runner.active_steps == []
    for tool in ("anything", "search"):
        reason = runner.admit(tool).reason
        assert "may not run any more: the conversation's plan is complete" in reason
    assert runner.admit("escalate").allowed  # an ambient tool: a transfer, an end-call tool
    assert not runner.admit("pay").allowed  # ambient, but never() still binds
    state.set("total", True)
    assert runner.admit("pay").allowed


def test_a_flow_with_nothing_active_that_is_not_complete_restricts_no_tool() -> None:
    state = State()
    side = Flow("side", [Step("consent", gate=is_true("asked"), done=is_set("consent"))])
    runner = FlowRunner(side, state)
    assert runner.active_steps == []
    assert not runner.is_complete
    assert runner.admit("anything").allowed


def test_two_active_steps_allow_the_union_of_their_lists() -> None:
    state = State()
    flow = Flow(
        "union",
        [
            Step("a", done=is_set("a"), allow=["x"]),
            Step("b", done=is_set("b"), allow=["y"], posture="B first."),
            Step("c", done=is_set("c")),  # no allow list: admits nothing of its own
        ],
    )
    runner = FlowRunner(flow, state)
    assert runner.admit("x").allowed
    assert runner.admit("y").allowed
    reason = runner.admit("z").reason
    assert reason == (
        "'z' is not part of the current step ('a', 'b', 'c'). Available now: x, y. B first."
    )


def test_a_step_without_allow_admits_no_tool_and_allow_star_admits_any() -> None:
    flow = Flow(
        "defaults",
        [
            Step("ask", done=is_set("asked")),
            Step("open", after=["ask"], done=is_set("open"), allow="*", deny=["pay"]),
        ],
        ambient=["transfer_to_human"],
    )
    state = State()
    runner = FlowRunner(flow, state)
    assert not runner.admit("transfer").allowed  # a hand-off is not offered from turn one
    assert runner.admit("transfer_to_human").allowed  # ambient tools are always there
    state.set("asked", True)
    assert runner.admit("anything").allowed
    assert not runner.admit("pay").allowed  # deny still binds under allow="*"
    assert Flow.from_json(flow.to_json()) == flow


def test_a_refusal_with_nothing_available_says_so() -> None:
    state = State()
    flow = Flow("none", [Step("a", done=is_set("a"), deny=["book"])])
    runner = FlowRunner(flow, state)
    assert runner.admit("book").reason == (
        "'book' is not allowed during the current step ('a'). "
        "No tool is available right now; continue the conversation instead."
    )


def test_the_compile_registry_adds_tools_to_available_now() -> None:
    flow = Flow("reg", [Step("a", done=is_set("a"), allow="*", deny=["book"])]).compile(
        tools=["book", "weather", "search"]
    )
    runner = FlowRunner(flow, State())
    assert runner.admit("book").reason == (
        "'book' is not allowed during the current step ('a'). Available now: search, weather."
    )
    assert runner.explain().allowed_tools == ("search", "weather")


def test_observe_mode_admits_and_records_the_violation() -> None:
    state = State()
    enforced = FlowRunner(admission_flow("enf"), state)
    observed = FlowRunner(admission_flow("obs"), state, enforcement="observe")
    assert observed.enforcement is Enforcement.OBSERVE
    assert observed.admit("search") == Admission("search", True)
    assert observed.violations == []
    got = observed.admit("book")
    assert got.allowed
    assert got.violation
    assert got.reason == enforced.admit("book").reason
    assert observed.violations == [Violation("book", got.reason, ("ask",))]
    assert observed.admit("pay", record=False).reason == enforced.admit("pay").reason
    assert len(observed.violations) == 1  # admit(record=False) records nothing
    assert enforced.violations == []


def test_an_unknown_enforcement_mode_is_refused() -> None:
    with pytest.raises(FlowError, match="enforcement must be"):
        FlowRunner(chain("mode", 1), State(), enforcement="strict")


def test_explain() -> None:
    state = State()
    flow = Flow(
        "exp",
        [
            Step("ask", done=is_set("date"), allow=["search"]),
            Step("gated", after=["ask"], gate=is_true("open"), done=is_set("g")),
            Step("later", after=["gated"], done=is_set("l")),
            Step("ordered", done=is_set("o"), allow=["search"]),
        ],
        constraints=[require("gated"), before("ask", "ordered"), never("pay").until(is_set("t"))],
        ambient=["pay"],
    )
    runner = FlowRunner(flow, state)
    ex = runner.explain()
    assert isinstance(ex, FlowExplanation)
    assert (ex.flow, ex.active, ex.done, ex.complete) == ("exp", ("ask",), (), False)
    assert set(ex.waiting) == {"ask", "ordered"}  # 'gated' and 'later' are not next in line
    assert not ex.waiting["ask"].holds
    assert "'date' must be known" in str(ex.waiting["ask"])
    assert "step 'ask' must be done first (before)" in str(ex.waiting["ordered"])
    assert ex.allowed_tools == ("search",)
    assert set(ex.blocked_tools) == {"pay"}
    assert ex.unmet_requirements == ("gated",)
    text = str(ex)
    assert text.splitlines()[0] == "flow 'exp': not complete; active: ask; done: none"
    assert "step 'ask' waits for:" in text
    assert "unmet requirements: gated" in text
    assert "tools allowed: search" in text
    assert "tool 'pay' refused: 'pay' is not permitted yet" in text
    state.set("date", "mon")
    ex = runner.explain()
    assert ex.active == ("ordered",)
    assert "'open' must be true" in str(ex.waiting["gated"])
    assert "later" not in ex.waiting
    state.update({"open": True, "g": 1, "l": 1, "o": 1, "t": 1})
    ex = runner.explain()
    assert ex.complete
    assert ex.waiting == {}
    assert ex.unmet_requirements == ()
    assert str(ex).splitlines()[0] == (
        "flow 'exp': complete; active: none; done: ask, gated, later, ordered"
    )


def test_explain_shows_the_branch_a_pending_step_waits_on() -> None:
    state = State()
    runner = FlowRunner(branching("expbr"), state)
    state.set("open", "maybe")
    ex = runner.explain()
    assert "the branch from 'check'" in str(ex)
    assert "'open' must be true" in str(ex.waiting["confirm"])
    assert "'open' must be false" in str(ex.waiting["offer"])


# -- several runners, closing -------------------------------------------------------------------


def test_several_flows_run_on_one_state() -> None:
    state = State()
    a = FlowRunner(chain("fa", 2), state)
    b = FlowRunner(Flow("fb", [Step("x", done=is_set("k1"))]), state)
    state.set("k1", 1)
    assert a.done_steps == []
    assert b.done_steps == ["x"]
    state.set("k0", 1)
    assert a.done_steps == ["s0", "s1"]
    assert state.get("flow:fa:done") == ["s0", "s1"]
    assert state.get("flow:fb:done") == ["x"]


def test_one_runner_per_flow_name_per_state() -> None:
    state = State()
    first = FlowRunner(chain("dup", 1), state)
    with pytest.raises(FlowError, match="'dup' is already running"):
        FlowRunner(chain("dup", 1), state)
    FlowRunner(chain("dup", 1), State()).close()  # another State is fine
    first.close()
    second = FlowRunner(chain("dup", 1), state)
    assert second.active_steps == ["s0"]
    second.close()


def test_a_closed_runner_stops_advancing_and_refuses_inputs() -> None:
    state = State()
    runner = FlowRunner(chain("closed", 2), state)
    state.set("k0", 1)
    with runner:
        pass
    assert runner.closed
    runner.close()  # idempotent
    state.set("k1", 1)
    assert runner.done_steps == ["s0"]
    assert state.get("flow:closed:done") == ["s0"]
    assert runner.verdict("s1") is Verdict.ACTIVE
    assert not runner.admit("anything").allowed  # still answered: no step allows it
    with pytest.raises(FlowError, match="closed"):
        runner.on_tool_ok("t")
    with pytest.raises(FlowError, match="closed"):
        runner.advance()
    assert "closed" in repr(runner)


def test_a_closed_runner_evaluates_no_guard() -> None:
    counted = Counted()
    state = State()
    flow = Flow("shut", [Step("a", done=counted.key_set("a", "k")), Step("b", done=is_set("b"))])
    runner = FlowRunner(flow, state)
    counted.take()
    runner.close()
    cursor = state.journal.cursor
    state.update({"k": 1, "b": 1})
    assert counted.take() == Counter()
    assert runner.active_steps == ["a", "b"]
    assert writes_of(state, "flow:shut:active", cursor) == 0


def test_bad_inputs_are_refused() -> None:
    runner = FlowRunner(chain("bad", 1), State())
    with pytest.raises(FlowError):
        runner.on_tool_ok("")
    with pytest.raises(FlowError):
        runner.admit("")
    with pytest.raises(TypeError):
        FlowRunner("flow", State())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        FlowRunner(chain("bad2", 1), {})  # type: ignore[arg-type]


def test_a_runner_compiles_its_flow() -> None:
    flow = Flow("broken", [Step("a", after=["ghost"], done=is_set("a"))])
    with pytest.raises(FlowDefinitionError, match="unknown step 'ghost'"):
        FlowRunner(flow, State())


def test_on_enter_needs_a_session() -> None:
    resolver = Resolver.function("slots", lambda state: 1)
    flow = Flow("needs", [Step("a", done=is_set("a"), on_enter=run(resolver))])
    with pytest.raises(FlowError, match=r"flow\.start\(session\)"):
        FlowRunner(flow, State())
    FlowRunner(chain("needs", 1), State()).close()  # the refused runner took no name


# -- threads ------------------------------------------------------------------------------------


def test_a_write_from_another_thread_advances_the_runner_in_that_thread(
    events: Recorder,
) -> None:
    state = State()
    runner = FlowRunner(chain("thr", 2), state)
    writer: list[int] = []

    def write() -> None:
        writer.append(threading.get_ident())
        state.set("k0", 1)

    t = threading.Thread(target=write)
    t.start()
    t.join()
    assert runner.done_steps == ["s0"]
    assert runner.active_steps == ["s1"]
    assert state.get("flow:thr:done") == ["s0"]
    done_threads = [
        th for kind, _, f, s, th in events.seen if (f, kind, s) == ("thr", "done", "s0")
    ]
    assert done_threads == writer


def test_concurrent_writers_end_in_the_same_marking() -> None:
    n = 48
    steps = []
    for i in range(n):
        after = [f"s{j}" for j in (i - 1, i // 2) if 0 <= j < i]
        join = "any" if i % 3 == 0 else "all"
        steps.append(
            Step(f"s{i}", after=list(dict.fromkeys(after)), join=join, done=is_set(f"k{i}"))
        )
    expected_state = State()
    expected = FlowRunner(Flow("seq", steps), expected_state)
    expected_state.update({f"k{i}": i for i in range(n) if i % 7 != 3})

    def writer(state: State) -> Callable[[int], None]:
        def work(t: int) -> None:
            for i in range(t, n, 8):
                if i % 7 != 3:
                    state.set(f"k{i}", i)

        return work

    for round_ in range(10):
        state = State()
        runner = FlowRunner(Flow("par", steps), state)
        run_threads(writer(state))
        assert runner.done_steps == expected.done_steps, round_
        assert runner.active_steps == expected.active_steps, round_
        assert state.get("flow:par:done") == expected.done_steps
        assert state.get("flow:par:active") == expected.active_steps
        runner.close()


# -- properties: latching against a reference model ---------------------------------------------

KEYS = [f"k{i}" for i in range(6)]
VALUES = st.sampled_from([True, True, False, 0, 1, "x", None, {"a": 1}])

# A guard spec: ("is_set", key) | ("is_true", key) | ("eq", key, value) | ("captured", keys)
# | ("done", step index) | ("all", parts) | ("any", parts). Each key is written at most once, so
# every one of these is monotone: once true, it stays true.


_ATOMS = st.one_of(
    st.tuples(st.just("is_set"), st.sampled_from(KEYS)),
    st.tuples(st.just("is_true"), st.sampled_from(KEYS)),
    st.tuples(st.just("eq"), st.sampled_from(KEYS), VALUES),
    st.tuples(st.just("captured"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=3)),
    st.tuples(st.just("done"), st.integers(0, 6)),  # a step index, taken modulo the steps
)


def _nest(parts: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # any_() never holds, and compile() refuses gates and branches that can never hold.
    return st.one_of(
        st.tuples(st.just("all"), st.lists(parts, max_size=3)),
        st.tuples(st.just("any"), st.lists(parts, min_size=1, max_size=3)),
    )


GUARD_SPECS = st.one_of(_ATOMS, _nest(_ATOMS), _nest(st.one_of(_ATOMS, _nest(_ATOMS))))


def fit(spec: Any, n: int) -> Any:
    """The spec with its done() atoms naming one of ``n`` steps."""
    if spec[0] == "done":
        return ("done", spec[1] % n)
    if spec[0] in ("all", "any"):
        return (spec[0], [fit(p, n) for p in spec[1]])
    return spec


def build_guard(spec: Any) -> Guard:
    op = spec[0]
    if op == "is_set":
        return is_set(spec[1])
    if op == "is_true":
        return is_true(spec[1])
    if op == "eq":
        return eq(spec[1], spec[2])
    if op == "captured":
        return captured(*spec[1])
    if op == "done":
        return done(f"s{spec[1]}")
    parts = [build_guard(p) for p in spec[1]]
    return all_(*parts) if op == "all" else any_(*parts)


def holds(spec: Any, values: dict[str, Any], done_ids: set[str]) -> bool:
    """The reference meaning of a guard spec, written without the guard library."""
    op = spec[0]
    if op == "is_set":
        return spec[1] in values
    if op == "is_true":
        return values.get(spec[1]) is True
    if op == "eq":
        return spec[1] in values and tagged(values[spec[1]]) == tagged(spec[2])
    if op == "captured":
        return all(k in values for k in spec[1])
    if op == "done":
        return f"s{spec[1]}" in done_ids
    results = [holds(p, values, done_ids) for p in spec[1]]
    return all(results) if op == "all" else any(results)


MAYBE_GUARD = st.none() | GUARD_SPECS


@st.composite
def flow_cases(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 7))

    def guard(optional: bool = False) -> Any:
        spec = draw(MAYBE_GUARD if optional else GUARD_SPECS)
        return None if spec is None else fit(spec, n)

    steps = []
    for i in range(n):
        preds = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        terminal = draw(st.booleans()) if i else False
        steps.append(
            {
                "edges": [(j, guard(optional=True)) for j in preds],
                "join": draw(st.sampled_from(["all", "any"])),
                "gate": guard(optional=True),
                "terminal": terminal,
                "done": None if terminal else guard(),
            }
        )
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    befores = draw(st.lists(st.sampled_from(pairs), max_size=3, unique=True)) if pairs else []
    required = draw(st.lists(st.integers(0, n - 1), max_size=2, unique=True))
    unwritten = draw(st.lists(st.sampled_from(KEYS), max_size=2, unique=True))
    written = [k for k in KEYS if k not in unwritten]
    values = {k: draw(VALUES) for k in written}
    return {"steps": steps, "before": befores, "require": required, "values": values}


def make_flow(case: dict[str, Any], name: str = "prop") -> Flow:
    steps = []
    for i, spec in enumerate(case["steps"]):
        steps.append(
            Step(
                f"s{i}",
                after=[
                    edge(f"s{j}", when=None if w is None else build_guard(w))
                    for j, w in spec["edges"]
                ],
                join=spec["join"],
                gate=None if spec["gate"] is None else build_guard(spec["gate"]),
                done=None if spec["done"] is None else build_guard(spec["done"]),
                terminal=spec["terminal"],
            )
        )
    constraints: list[Any] = [before(f"s{a}", f"s{b}") for a, b in case["before"]]
    if case["require"]:
        constraints.append(require(*(f"s{i}" for i in case["require"])))
    return Flow(name, steps, constraints)


def reference(case: dict[str, Any]) -> dict[str, Any]:
    """A naive fixed point over all the steps, on the final values."""
    values = case["values"]
    specs = case["steps"]
    ids = [f"s{i}" for i in range(len(specs))]
    before_of: dict[int, list[int]] = {}
    for a, b in case["before"]:
        before_of.setdefault(b, []).append(a)
    finished: set[str] = set()

    def eligible(i: int) -> bool:
        spec = specs[i]
        if any(ids[j] not in finished for j in before_of.get(i, [])):
            return False
        if spec["edges"]:
            taken = [
                ids[j] in finished and (w is None or holds(w, values, finished))
                for j, w in spec["edges"]
            ]
            if not (all(taken) if spec["join"] == "all" else any(taken)):
                return False
        return spec["gate"] is None or holds(spec["gate"], values, finished)

    changed = True
    while changed:
        changed = False
        for i, spec in enumerate(specs):
            if ids[i] in finished or not eligible(i):
                continue
            if spec["terminal"] or holds(spec["done"], values, finished):
                finished.add(ids[i])
                changed = True
    done_list = [s for s in ids if s in finished]
    active = [s for i, s in enumerate(ids) if s not in finished and eligible(i)]
    terminals = [ids[i] for i, spec in enumerate(specs) if spec["terminal"]]
    required = [ids[i] for i in case["require"]]
    if required:
        complete = set(required) <= finished and (
            not terminals or any(t in finished for t in terminals)
        )
    elif terminals:
        complete = any(t in finished for t in terminals)
    else:
        complete = len(finished) == len(ids)
    verdicts = {}
    for i, sid in enumerate(ids):
        if sid in finished:
            verdicts[sid] = Verdict.DONE
        elif sid in active:
            verdicts[sid] = Verdict.ACTIVE
        elif complete or any(
            ids[k] in finished for k, other in enumerate(specs) if i in dict(other["edges"])
        ):
            verdicts[sid] = Verdict.SKIPPED
        else:
            verdicts[sid] = Verdict.PENDING
    return {"done": done_list, "active": active, "complete": complete, "verdicts": verdicts}


def apply_writes(state: State, values: dict[str, Any], order: list[str], batch: list[bool]) -> None:
    """Write the keys in ``order``; consecutive keys flagged in ``batch`` go in one update."""
    group: list[str] = []
    for key, joined in itertools.zip_longest(order, batch, fillvalue=False):
        if key is None:
            break
        group.append(key)
        if not joined:
            if len(group) == 1:
                state.set(key, values[key])
            else:
                state.update({k: values[k] for k in group})
            group = []
    if group:
        state.update({k: values[k] for k in group})


def outcome(runner: FlowRunner) -> tuple[list[str], list[str], bool]:
    return runner.done_steps, runner.active_steps, runner.is_complete


@props
@given(case=flow_cases(), data=st.data())
def test_latching_does_not_depend_on_the_order_of_writes(case: dict[str, Any], data: Any) -> None:
    values = case["values"]
    runs = []
    for _ in range(2):
        order = data.draw(st.permutations(sorted(values)))
        batch = data.draw(st.lists(st.booleans(), max_size=len(order)))
        state = State()
        runner = FlowRunner(make_flow(case), state)
        apply_writes(state, values, list(order), batch)
        runs.append(outcome(runner))
        assert state.get("flow:prop:done") == runner.done_steps
        assert state.get("flow:prop:active") == runner.active_steps
        assert state.get("flow:prop:complete") is runner.is_complete
    # Started over a State that already holds every value: the same again.
    state = State()
    if values:
        state.update(values)
    runs.append(outcome(FlowRunner(make_flow(case), state)))
    assert runs[0] == runs[1] == runs[2]


@props
@given(case=flow_cases(), data=st.data())
def test_exactly_the_steps_whose_guards_hold_are_done(case: dict[str, Any], data: Any) -> None:
    values = case["values"]
    order = data.draw(st.permutations(sorted(values)))
    batch = data.draw(st.lists(st.booleans(), max_size=len(order)))
    state = State()
    with recording() as rec:
        runner = FlowRunner(make_flow(case), state)
        apply_writes(state, values, list(order), batch)
    expected = reference(case)
    assert runner.done_steps == expected["done"]
    assert runner.active_steps == expected["active"]
    assert runner.is_complete is expected["complete"]
    assert {s: runner.verdict(s) for s in expected["verdicts"]} == expected["verdicts"]
    # Without resets each step is done once, and a step is entered at most once (it may also
    # never be entered, if it was done when it became reachable).
    seen = rec.of("prop")
    assert sorted(s for kind, s in seen if kind == "done") == sorted(expected["done"])
    entered = [s for kind, s in seen if kind == "entered"]
    assert len(entered) == len(set(entered))
    assert set(expected["active"]) <= set(entered)
    assert seen.count(("completed", None)) == (1 if expected["complete"] else 0)


# -- known problems -----------------------------------------------------------------------------


def test_a_raising_guard_leaves_the_published_keys_in_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def touchy(state: State, marking: Marking) -> bool:
        if state.get("boom"):
            raise RuntimeError("guard bug")
        return False

    state = State()
    flow = Flow(
        "raising",
        [Step("a", done=is_set("a")), Step("b", after=["a"], done=custom(touchy, reads=["x"]))],
    )
    runner = FlowRunner(flow, state)
    state.set("boom", True)
    with caplog.at_level(logging.ERROR, logger="slateflow.flow"):
        state.set("a", 1)
    assert runner.done_steps == ["a"]
    assert runner.active_steps == ["b"]  # its broken done guard counts as not holding
    assert state.get("flow:raising:done") == runner.done_steps
    assert "the guard done of step 'b' raised" in caplog.text


def test_a_failed_constructor_does_not_keep_the_flow_name(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = State()
    flow = Flow("taken", [Step("a", done=is_set("k"))])

    def broken(self: FlowRunner, events: object, *, force: bool = False) -> None:
        raise RuntimeError("publish bug")

    with monkeypatch.context() as patch:
        patch.setattr(FlowRunner, "_publish", broken)
        with pytest.raises(RuntimeError, match="publish bug"):
            FlowRunner(flow, state)
    state.set("k", 1)  # the failed runner no longer listens
    runner = FlowRunner(flow, state)  # and its name is free
    assert runner.done_steps == ["a"]


def test_a_guard_raising_while_the_runner_starts_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def touchy(state: State, marking: Marking) -> bool:
        raise RuntimeError("guard bug")

    state = State()
    with caplog.at_level(logging.ERROR, logger="slateflow.flow"):
        runner = FlowRunner(Flow("taken", [Step("a", done=custom(touchy, reads=["k"]))]), state)
    assert runner.active_steps == ["a"]
    assert "guard bug" in caplog.text


def test_advancing_inside_a_transaction_does_not_latch_uncommitted_values() -> None:
    state = State()
    flow = Flow(
        "txadv",
        [
            Step("book", done=all_(called_ok("book"), is_set("booking:id"))),
            Step("x", done=is_set("x")),
        ],
    )
    runner = FlowRunner(flow, state)

    def tool_handler() -> None:
        with state.transaction():
            state.set("booking:id", "B1")
            runner.on_tool_ok("book")
            raise RuntimeError("the booking write conflicted")

    with pytest.raises(RuntimeError, match="conflicted"):
        tool_handler()
    assert "booking:id" not in state
    assert runner.done_steps == []


def test_a_state_with_an_unclosed_runner_can_be_garbage_collected() -> None:
    import gc
    import weakref

    state = State()
    FlowRunner(Flow("leaky", [Step("a", done=is_set("k"))]), state)
    gone = weakref.ref(state)
    del state
    gc.collect()
    assert gone() is None


def test_a_posture_told_while_the_flow_is_paused_is_still_recorded() -> None:
    flow = Flow("ask", [Step("name", done=is_set("caller:name"), posture="Ask the name.")])
    state = State()
    with FlowRunner(flow, state) as runner:
        marker = runner.brief().told
        assert marker is not None
        runner.pause()
        marker(1)
        assert runner.told_steps == ["name"]
        assert state.get("flow:ask:told") == ["name"]
        state.set("caller:name", "Ann")
        assert runner.active_steps == ["name"]  # paused: the write waits
        runner.unpause()
        assert runner.is_complete
