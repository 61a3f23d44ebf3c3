"""Tool admission has one question and one answer type, and a few names that mean one thing:
``admit`` (runners and stacks alike), a digression's ``then``, a value's ``source_of``."""

from __future__ import annotations

import pytest

from slateflow import Flow, State, Step, is_true, once
from slateflow.flow import Digression, FlowRunner, FlowStack


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


@pytest.mark.parametrize("name", ["\u200b", "a\u200b", "\u202eko", "a\x07"])
def test_step_ids_and_tool_names_that_print_like_others_are_refused(name: str) -> None:
    from slateflow.errors import FlowDefinitionError

    with pytest.raises(FlowDefinitionError, match="would print like"):
        Step(name, terminal=True)
    with pytest.raises(FlowDefinitionError, match="would print like"):
        Step("a", allow=[name], terminal=True)
    with pytest.raises(FlowDefinitionError):
        Flow("f", [Step("a", terminal=True)], ambient=[name])
    with pytest.raises(FlowDefinitionError, match="would print like"):
        once(name)
