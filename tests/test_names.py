"""Names: the top level holds what an app writes, one meaning per word, and nothing that was
never released is kept under an old name."""

from __future__ import annotations

import importlib

import pytest

import slateflow
from slateflow import Flow, State, Step, is_true, once
from slateflow.flow import Digression, FlowRunner, FlowStack


def test_the_top_level_holds_at_most_50_names_and_each_imports() -> None:
    assert len(slateflow.__all__) <= 50
    assert len(set(slateflow.__all__)) == len(slateflow.__all__)
    for name in slateflow.__all__:
        assert getattr(slateflow, name) is not None
    exec("from slateflow import *", {})


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("slateflow", "Dispatch"),
        ("slateflow", "Mutation"),
        ("slateflow", "Trigger"),
        ("slateflow", "call"),
        ("slateflow", "guards"),
        ("slateflow.resolve", "Dispatch"),
        ("slateflow.resolve", "ToolClaim"),
        ("slateflow.state", "Mutation"),
        ("slateflow.state", "Trigger"),
        ("slateflow.state.when", "Trigger"),
        ("slateflow.conversation", "Rule"),
        ("slateflow.conversation.promotion", "Rule"),
        ("slateflow.flow", "Resume"),
    ],
)
def test_a_name_that_was_never_released_is_not_kept_as_an_alias(module: str, name: str) -> None:
    with pytest.raises(AttributeError):
        getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(
    "module",
    [
        "slateflow.deprecation",
        "slateflow.guards",
        "slateflow.resolve.dialog",
        "slateflow.resolve.tools",
        "slateflow.resolve.conversation_aliases",
        "slateflow.state.aliases",
        "slateflow.flow.aliases",
    ],
)
def test_a_module_of_old_names_is_gone(module: str) -> None:
    with pytest.raises(ImportError):
        importlib.import_module(module)


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
        assert stack.admit("pay", record=False).reason


def test_a_digression_says_what_happens_then() -> None:
    faq = Flow("faq", [Step("answer", terminal=True)])
    assert Digression("faq", is_true("ask"), faq, "restart").then == "restart"
    with pytest.raises(TypeError):
        Digression("faq", is_true("ask"), faq, resume="terminate")  # type: ignore[call-arg]
    main = Flow("main", [Step("a", done=is_true("a"))])
    stack = FlowStack(main).digression("faq", when=is_true("ask"), flow=faq, then="restart")
    assert stack.digressions[0].then == "restart"


def test_the_source_of_a_value_has_its_own_name() -> None:
    import slateflow.state

    state = State()
    state.set("k", 1, source="fetch")
    assert slateflow.state.source_of(state, "k") == "fetch"
    assert state.provenance("k").source == "fetch"  # the record
