"""Names: the top-level namespace holds what an app writes, one meaning per word, and every name
that moved or was renamed still works for one release with a warning naming the new one."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import pytest

import slateflow
from slateflow import Flow, FlowRunner, State, Step, is_true, once
from slateflow.flow import Digression, FlowStack

MOVED = sorted(slateflow._MOVED)


def test_the_top_level_holds_at_most_50_names_and_each_imports_without_warning() -> None:
    assert len(slateflow.__all__) <= 50
    assert len(set(slateflow.__all__)) == len(slateflow.__all__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in slateflow.__all__:
            assert getattr(slateflow, name) is not None
        exec("from slateflow import *", {})


@pytest.mark.parametrize("name", MOVED)
def test_a_moved_name_still_imports_with_a_warning_naming_its_new_address(name: str) -> None:
    module, new = slateflow._MOVED[name]
    with pytest.warns(
        DeprecationWarning, match=rf"slateflow\.{name} is deprecated.*slateflow\.{module}\.{new}"
    ):
        old = getattr(slateflow, name)
    assert old is getattr(importlib.import_module(f"slateflow.{module}"), new)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        slateflow.Nope  # noqa: B018


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("slateflow.state", "Trigger", "Transition"),
        ("slateflow.state.when", "Trigger", "Transition"),
        ("slateflow.conversation", "Rule", "Promotion"),
        ("slateflow.conversation.promotion", "Rule", "Promotion"),
    ],
)
def test_a_renamed_class_keeps_its_old_name_for_a_release(module: str, old: str, new: str) -> None:
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=new):
        assert getattr(mod, old) is getattr(mod, new)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("tools", "ToolDesk"),
        ("tools", "ToolClaim"),
        ("tools", "ToolResult"),
        ("dialog", "Dialog"),
        ("dialog", "HandoverMode"),
        ("dialog", "DEFAULT_MAX_TRANSCRIPT"),
    ],
)
def test_a_module_that_moved_up_a_layer_still_imports_its_names_with_a_warning(
    module: str, name: str
) -> None:
    old = importlib.import_module(f"slateflow.resolve.{module}")
    new = importlib.import_module(f"slateflow.conversation.{module}")
    where = (
        rf"slateflow\.resolve\.{module}\.{name} is deprecated.*slateflow\.conversation\.{module}"
    )
    with pytest.warns(DeprecationWarning, match=where):
        assert getattr(old, name) is getattr(new, name)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        old.Nope  # noqa: B018


def runner() -> FlowRunner:
    flow = Flow(
        "pay",
        [
            Step("ask", done=is_true("asked"), allow=["lookup"]),
            Step("end", after=["ask"], terminal=True),
        ],
        constraints=[once("charge")],
    )
    return FlowRunner(flow, State())


@pytest.mark.parametrize(
    ("call", "new", "expected"),
    [
        (lambda r: r.refusal("charge"), "admit", "not part of the current step"),
        (lambda r: r.why_blocked("charge"), "admit", "not part of the current step"),
        (lambda r: r.single("charge"), r"admit\(tool\)\.once", True),
        (lambda r: r.constraint_refusal("charge"), "constraint_refusal", None),
        (lambda r: r.suspended, "paused", False),
    ],
)
def test_a_deprecated_runner_method_warns_and_answers_as_before(
    call: Any, new: str, expected: Any
) -> None:
    with runner() as r, pytest.warns(DeprecationWarning, match=new):
        got = call(r)
    if isinstance(expected, str):
        assert expected in got
    else:
        assert got == expected


def test_suspend_and_resume_are_pause_and_unpause() -> None:
    with runner() as r:
        with pytest.warns(DeprecationWarning, match=r"pause\(\)"):
            r.suspend()
        assert r.paused
        r.state.set("asked", True)
        assert r.active_steps == ["ask"]  # paused: the change waits
        with pytest.warns(DeprecationWarning, match=r"unpause\(\)"):
            r.resume()
        assert not r.paused
        assert r.is_complete


def test_admit_is_the_one_question_with_its_reason() -> None:
    with runner() as r:
        refused = r.admit("charge", record=False)
        assert not refused
        assert "not part of the current step" in refused.reason
        assert refused.once
        assert r.admit("lookup", record=False).allowed
        assert not r.admit("lookup").once


def test_observe_mode_records_a_breach_only_when_asked_to() -> None:
    flow = Flow("pay", [Step("ask", done=is_true("asked"), allow=["lookup"])])
    with FlowRunner(flow, State(), enforcement="observe") as r:
        question = r.admit("charge", record=False)
        assert question.allowed
        assert question.violation
        assert r.violations == []
        r.admit("charge")
        assert len(r.violations) == 1


def test_a_stack_answers_the_same_one_question() -> None:
    main = Flow("main", [Step("a", done=is_true("a"), allow=["lookup"])], constraints=[once("pay")])
    faq = Flow("faq", [Step("answer", terminal=True)])
    from slateflow.flow import StackRunner

    with StackRunner(FlowStack(main, [Digression("faq", is_true("ask"), faq)]), State()) as stack:
        assert stack.admit("lookup")
        assert not stack.admit("pay", record=False)
        assert stack.admit("pay", record=False).once
        with pytest.warns(DeprecationWarning, match="admit"):
            assert stack.why_blocked("pay") is not None


def test_the_journal_is_one_object_and_the_old_names_still_work() -> None:
    from slateflow import MemoryStore
    from slateflow.state import Derived, end_turn, fresh_for, is_fresh

    state = State(store=MemoryStore())
    state.set("a", 1)
    mark = state.journal.cursor
    state.set("a", 2)
    assert [m.new for m in state.journal.since(mark)] == [2]
    assert state.journal.at(mark).get("a") == 1
    with pytest.warns(DeprecationWarning, match=r"State\.mutations_since.*journal\.since"):
        assert state.mutations_since(mark) == state.journal.since(mark)
    with pytest.warns(DeprecationWarning, match=r"journal\.at"):
        assert state.at(mark).get("a") == 1
    with pytest.warns(DeprecationWarning, match=r"journal\.compact"):
        assert state.compact() == state.cursor
    state.set("turn:x", 1)
    with pytest.warns(DeprecationWarning, match=r"end_turn\(state\)"):
        assert state.end_turn() == 1
    state.set("turn:y", 1)
    assert end_turn(state) == 1
    with pytest.warns(DeprecationWarning, match=r"is_fresh\(state, name\)"):
        assert state.is_fresh("r") is is_fresh(state, "r") is False
    with pytest.warns(DeprecationWarning, match=r"fresh_for\(state, name\)"):
        assert state.fresh_for("r") is fresh_for(state, "r") is None
    with pytest.warns(DeprecationWarning, match=r"Derived\(state"):
        state.derive("twice", lambda s: 2 * s.get("a"), reads=["a"]).close()
    Derived(state, "thrice", lambda s: 3 * s.get("a"), reads=["a"]).close()
    assert state.get("derived:thrice") == 6


def test_a_digression_says_what_happens_then_and_resume_is_its_former_name() -> None:
    faq = Flow("faq", [Step("answer", terminal=True)])
    assert Digression("faq", is_true("ask"), faq, "restart").then == "restart"
    with pytest.warns(DeprecationWarning, match=r"then=\.\.\."):
        old = Digression("faq", is_true("ask"), faq, resume="terminate")
    assert old.then == old.resume == "terminate"
    main = Flow("main", [Step("a", done=is_true("a"))])
    stack = FlowStack(main).digression("faq", when=is_true("ask"), flow=faq, then="restart")
    assert stack.digressions[0].then == "restart"


def test_the_source_of_a_value_has_its_own_name() -> None:
    import slateflow.state

    state = State()
    state.set("k", 1, source="fetch")
    assert slateflow.state.source_of(state, "k") == "fetch"
    assert state.provenance("k").source == "fetch"  # the record
    with pytest.warns(DeprecationWarning, match="source_of"):
        assert slateflow.state.provenance(state, "k") == "fetch"
