"""Flow definitions: step / edge / run / constraint constructors, Flow.build() and compile(),
Mermaid, JSON round-trips and bad documents, and step grounds rendered from a State."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import fingerprint
from slateflow import (
    Flow,
    Resolver,
    Scheduling,
    State,
    Step,
    all_,
    always,
    any_,
    before,
    called_ok,
    captured,
    commit,
    custom,
    done,
    edge,
    eq,
    failed,
    fresh,
    is_set,
    is_true,
    never,
    not_,
    once,
    pending,
    require,
    reset,
    resolved,
    run,
)
from slateflow.errors import FlowDefinitionError, FlowFormatError, TemplateError
from slateflow.flow import Edge, Ground, Guard, OnEnter
from slateflow.state.keys import unprintable

quick = settings(deadline=None, max_examples=150)


async def _fetch(_: State) -> int:
    return 1


LOOKUP = Resolver.fetch("lookup", _fetch)
NOTIFY = Resolver.fetch("notify", _fetch)
AUDIT = Resolver.fetch("audit:log", _fetch)
RESOLVERS = (LOOKUP, NOTIFY, AUDIT)


def definition_error(make: Callable[[], Any]) -> FlowDefinitionError:
    with pytest.raises(FlowDefinitionError) as info:
        make()
    return info.value


def format_error(data: Any, **kwargs: Any) -> str:
    with pytest.raises(FlowFormatError) as info:
        Flow.from_json(data, **kwargs)
    return str(info.value)


def write_error(flow: Flow) -> str:
    with pytest.raises(FlowFormatError) as info:
        flow.to_json()
    return str(info.value)


def assert_round_trip(flow: Flow, resolvers: Any = RESOLVERS) -> None:
    """from_json(to_json(f)) == f, through JSON text, and writing it again gives the same text."""
    text = json.dumps(flow.to_json(), allow_nan=False)
    again = Flow.from_json(json.loads(text), resolvers=resolvers)
    assert again == flow
    assert json.dumps(again.to_json(), allow_nan=False) == text


def simple(sid: str, **kwargs: Any) -> Step:
    kwargs.setdefault("done", is_set("work:done"))
    return Step(sid, **kwargs)


def problems_of(flow: Flow, *, compile_: bool = False, **kwargs: Any) -> list[str]:
    check = (lambda: flow.compile(**kwargs)) if compile_ else flow.build
    with pytest.raises(FlowDefinitionError) as info:
        check()
    err = info.value
    message = str(err)
    assert f"flow {flow.name!r} has {len(err.problems)} problem(s):" in message
    for problem in err.problems:
        assert f"  - {problem}" in message
    return err.problems


# -- Step constructor ---------------------------------------------------------------------------


def test_step_stores_its_arguments() -> None:
    gate, finished = is_set("g"), is_true("d")
    action = run(LOOKUP, "call")
    step = Step(
        "pick",
        after=["greet", edge("check", when=is_true("ok"))],
        join="any",
        gate=gate,
        done=finished,
        posture="Ask for a date.",
        ground="Date: {booking:date}",
        allow=["search", "search", "book"],
        deny="cancel",
        on_enter=action,
    )
    assert step.id == "pick"
    assert step.after == (Edge("greet"), Edge("check", is_true("ok")))
    assert step.join == "any"
    assert step.gate is gate
    assert step.done is finished
    assert step.posture == "Ask for a date."
    assert step.ground == Ground("Date: {booking:date}")
    assert step.allow == ("search", "book")  # duplicates dropped, order kept
    assert step.deny == ("cancel",)  # a single name is one tool, not its letters
    assert not step.terminal
    assert step.on_enter is action
    assert step.guards() == [("after[1].when", is_true("ok")), ("gate", gate), ("done", finished)]


def test_step_after_takes_a_single_id_or_edge() -> None:
    assert Step("b", after="a", done=always()).after == (Edge("a"),)
    assert Step("b", after=edge("a"), done=always()).after == (Edge("a"),)
    assert Step("b", done=always()).after == ()


def test_step_keeps_a_ground_object() -> None:
    ground = Ground("{k?yes:no}")
    assert Step("a", done=always(), ground=ground).ground is ground


@pytest.mark.parametrize(
    "bad_id",
    ["", "   ", "\n", 3, None, b"id"],
)
def test_step_id_must_be_a_non_empty_string(bad_id: Any) -> None:
    err = definition_error(lambda: Step(bad_id, done=always()))
    assert "step id" in str(err)
    assert repr(bad_id) in str(err)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"after": [3]}, "after holds step ids or edge(...), got 3"),
        ({"after": ["a", None]}, "after holds step ids or edge(...), got None"),
        ({"after": [is_set("x")]}, "after holds step ids or edge(...)"),
        ({"join": "some"}, "join must be 'all' or 'any', got 'some'"),
        ({"join": ["all"]}, "join must be 'all' or 'any'"),
        ({"gate": "is_set('x')"}, "gate must be a guard"),
        ({"gate": lambda s, m: True}, "gate must be a guard"),
        ({"done": True}, "done must be a guard, got True"),
        ({"posture": 3}, "posture must be a str, got 3"),
        ({"posture": ["Be brief."]}, "posture must be a str"),
        ({"ground": 3}, "ground must be a str, got 3"),
        ({"ground": ["{k}"]}, "ground must be a str"),
        ({"allow": [""]}, "allow holds tool names, got ''"),
        ({"allow": ["book", 3]}, "allow holds tool names, got 3"),
        ({"deny": [None]}, "deny holds tool names, got None"),
        ({"terminal": 1}, "terminal must be True or False"),
        ({"terminal": "yes"}, "terminal must be True or False"),
        ({"on_enter": LOOKUP}, "on_enter takes run(resolver, mode)"),
        ({"on_enter": lambda: None}, "on_enter takes run(resolver, mode)"),
    ],
)
def test_bad_step_arguments_name_the_step(kwargs: dict[str, Any], fragment: str) -> None:
    kwargs.setdefault("done", always())
    err = definition_error(lambda: Step("my-step", **kwargs))
    message = str(err)
    assert message.startswith("step 'my-step': ")
    assert fragment in message
    assert err.problems == [message]


@pytest.mark.parametrize(
    ("text", "where"),
    [("Date: {booking:date", "column 7"), ("}", "column 1"), ("{}", "column 1"), ("{a b}", "")],
)
def test_ground_syntax_error_names_the_step_and_the_position(text: str, where: str) -> None:
    message = str(definition_error(lambda: Step("pick-date", done=always(), ground=text)))
    assert message.startswith("step 'pick-date': ground: template syntax error")
    assert where in message


# -- edge and run -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", 3, None])
def test_edge_needs_a_step_id(bad: Any) -> None:
    assert "edge(step) needs a step id" in str(definition_error(lambda: edge(bad)))


def test_edge_when_must_be_a_guard() -> None:
    message = str(definition_error(lambda: edge("check", when="open")))  # type: ignore[arg-type]
    assert message == "edge('check', when=...) takes a guard, got 'open'"


def test_edge_is_a_value() -> None:
    assert edge("a", when=is_set("x")) == Edge("a", is_set("x"))
    assert edge("a") != edge("a", when=is_set("x"))
    assert edge("a").when is None


def test_run_defaults_and_arguments() -> None:
    action = run(LOOKUP)
    assert action == OnEnter(LOOKUP, "dispatch", Scheduling.WHEN_IDLE, None)
    deliver = print
    action = run(NOTIFY, "background", scheduling="interrupt", deliver=deliver)
    assert (action.resolver, action.mode, action.scheduling, action.deliver) == (
        NOTIFY,
        "background",
        Scheduling.INTERRUPT,
        deliver,
    )
    assert run(LOOKUP, "call", scheduling=Scheduling.SILENT).scheduling is Scheduling.SILENT


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: run("lookup"), "run() takes a Resolver, got 'lookup'"),
        (lambda: run(_fetch), "run() takes a Resolver"),
        (lambda: run(LOOKUP, "now"), "run('lookup', mode='now'): mode must be one of"),
        (lambda: run(LOOKUP, mode=None), "mode must be one of ['call', 'dispatch', 'background']"),
        (lambda: run(LOOKUP, scheduling="later"), "run('lookup'): scheduling must be one of"),
        (lambda: run(LOOKUP, scheduling=[]), "scheduling must be one of"),
        (lambda: run(LOOKUP, deliver="queue"), "run('lookup'): deliver must be callable"),
    ],
)
def test_bad_run_arguments(make: Callable[[], Any], fragment: str) -> None:
    assert fragment in str(definition_error(make))


# -- constraint builders ------------------------------------------------------------------------


def test_constraint_builders_build_values() -> None:
    assert once("book") == once("book")
    assert before("a", "b") != before("b", "a")
    assert never("book").until(is_true("ok")) == never("book").until(is_true("ok"))
    assert require("a", "b").steps == ("a", "b")
    assert reset("a", "b").when(is_set("x")).steps == ("a", "b")
    c = commit("book", until=is_true("confirmed"))
    assert (c.tool, c.until) == ("book", is_true("confirmed"))


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: once(""), "once(tool) must be a non-empty string, got ''"),
        (lambda: once(3), "once(tool) must be a non-empty string"),
        (lambda: before("", "b"), "before(first) must be a non-empty string"),
        (lambda: before("a", None), "before(then) must be a non-empty string, got None"),
        (lambda: never(""), "never(tool) must be a non-empty string"),
        (lambda: never("book").until("ok"), "never('book').until() takes a guard, got 'ok'"),
        (lambda: never("book").until(None), "takes a guard, got None"),
        (lambda: require(), "require() needs at least one step id"),
        (lambda: require("a", ""), "require(step) must be a non-empty string"),
        (lambda: reset(), "reset() needs at least one step id"),
        (lambda: reset("a", 3), "reset(step) must be a non-empty string, got 3"),
        (lambda: reset("a").when(True), ".when() takes a guard, got True"),
        (lambda: commit("", is_true("ok")), "commit(tool) must be a non-empty string"),
        (lambda: commit("book", until=None), "commit('book', until=) takes a guard, got None"),
        (lambda: commit("book", "ok"), "takes a guard, got 'ok'"),
    ],
)
def test_bad_constraint_arguments(make: Callable[[], Any], fragment: str) -> None:
    assert fragment in str(definition_error(make))


@pytest.mark.parametrize(
    ("unfinished", "finish", "shown"),
    [(never("book"), ".until(guard)", "never('book')"), (reset("pick"), ".when(guard)", "reset")],
)
def test_unfinished_builder_in_a_flow_says_how_to_finish_it(
    unfinished: Any, finish: str, shown: str
) -> None:
    message = str(definition_error(lambda: Flow("f", [simple("pick")], constraints=[unfinished])))
    assert message.startswith("flow 'f': constraints holds once(), before(), never().until()")
    assert finish in message
    assert shown in message


def test_flow_constraints_refuse_other_objects() -> None:
    message = str(definition_error(lambda: Flow("f", [simple("a")], [is_set("x")])))
    assert "constraints holds" in message
    assert "finish it" not in message


# -- Flow constructor ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", 3, None, "bad name", "a*b"])
def test_flow_name_must_make_valid_keys(name: Any) -> None:
    message = str(definition_error(lambda: Flow(name, [simple("a")])))
    assert repr(name) in message


def test_flow_holds_only_steps_and_tool_names() -> None:
    assert "steps holds Step objects" in str(
        definition_error(lambda: Flow("f", [simple("a"), "b"]))  # type: ignore[list-item]
    )
    assert "ambient holds tool names, got ''" in str(
        definition_error(lambda: Flow("f", [simple("a")], ambient=["escalate", ""]))
    )
    flow = Flow("f", (s for s in [simple("a")]), ambient="escalate")
    assert flow.ambient == ("escalate",)
    assert flow.steps == (simple("a"),)
    assert Flow("f", [simple("a")], ambient=["x", "y", "x"]).ambient == ("x", "y")


def test_flow_lookups() -> None:
    flow = Flow(
        "book",
        [
            simple("a", allow=["search"], deny=["book"]),
            simple("b", after="a", gate=is_set("g"), allow=["search", "lookup"]),
        ],
        [once("book"), never("pay").until(is_true("ok")), commit("charge", is_true("yes"))],
        ambient=["escalate"],
    )
    assert flow.step("b").id == "b"
    with pytest.raises(KeyError, match="no step 'zz'; its steps: a, b"):
        flow.step("zz")
    assert flow.tools() == ["book", "charge", "escalate", "lookup", "pay", "search"]
    assert [where for where, _ in flow.guards()] == [
        "step 'a' done",
        "step 'b' gate",
        "step 'b' done",
        "constraints[1] (never('pay').until(...))",
        "constraints[2] (commit('charge', until=...))",
    ]


def test_flow_equality_follows_its_parts() -> None:
    def make(value: Any) -> Flow:
        return Flow("f", [simple("a", gate=eq("k", value))], [once("t")], ["x"])

    assert make(1) == make(1)
    assert hash(make(1)) == hash(make(1))
    assert make(1) != make(True)  # JSON equality, as guards use
    assert make(1) != Flow("f", [simple("a", gate=eq("k", 1))], [once("t")], [])
    assert make(1) != Flow("g", [simple("a", gate=eq("k", 1))], [once("t")], ["x"])
    assert Step("a", done=always(), on_enter=run(LOOKUP)) != Step(
        "a", done=always(), on_enter=run(LOOKUP, "call")
    )


# -- build() ------------------------------------------------------------------------------------


def test_build_returns_the_flow() -> None:
    flow = Flow("f", [simple("a"), simple("b", after="a"), Step("end", after="b", terminal=True)])
    assert flow.build() is flow


@pytest.mark.parametrize(
    ("steps", "constraints", "fragment"),
    [
        ([], [], "it has no steps"),
        ([simple("a"), simple("a")], [], "step id 'a' is used more than once"),
        ([simple("a"), simple("b", after="zz")], [], "step 'b' comes after unknown step 'zz'"),
        (
            [simple("a"), simple("b", after=[edge("zz", when=is_set("x"))])],
            [],
            "step 'b' comes after unknown step 'zz'",
        ),
        ([Step("a")], [], "step 'a' has no done guard and is not terminal"),
        ([Step("a", terminal=True, done=is_set("x"))], [], "terminal step 'a' has a done guard"),
        (
            [simple("a", allow=["book"], deny=["book"])],
            [],
            "step 'a' both allows and denies tool 'book'",
        ),
        (
            [simple("a", done=done("zz"))],
            [],
            "step 'a' done reads done('zz'), but there is no such step",
        ),
        (
            [simple("a"), simple("b", gate=not_(any_(is_set("x"), done("zz"))))],
            [],
            "step 'b' gate reads done('zz')",
        ),
        (
            [simple("a"), simple("b", after=[edge("a", when=done("zz"))])],
            [],
            "step 'b' after[0].when reads done('zz')",
        ),
        (
            [simple("a")],
            [never("t").until(done("zz"))],
            "constraints[0] (never('t').until(...)) reads done('zz')",
        ),
        (
            [simple("a")],
            [once("t"), commit("t2", until=all_(done("a"), done("zz")))],
            "constraints[1] (commit('t2', until=...)) reads done('zz')",
        ),
        (
            [simple("a")],
            [reset("a").when(done("zz"))],
            "constraints[0] (reset('a').when(...)) reads done('zz')",
        ),
        ([simple("a")], [before("a", "zz")], "constraints[0] (before('a', 'zz')) names unknown"),
        ([simple("a")], [before("zz", "a")], "names unknown step 'zz'"),
        ([simple("a")], [require("a", "zz")], "(require('a', 'zz')) names unknown step 'zz'"),
        ([simple("a")], [reset("zz").when(is_set("x"))], "names unknown step 'zz'"),
        ([simple("a", after="a")], [], "the steps' after edges form a cycle: a -> a"),
    ],
)
def test_build_reports_each_problem(
    steps: list[Step], constraints: list[Any], fragment: str
) -> None:
    flow = Flow("f", steps, constraints)
    problems = problems_of(flow)
    assert len(problems) == 1, problems
    assert fragment in problems[0]
    # compile() checks everything build() checks.
    assert problems_of(flow, compile_=True) == problems


def test_build_lists_every_problem_at_once() -> None:
    flow = Flow(
        "messy",
        [
            simple("a"),
            simple("a"),
            Step("b", after="ghost"),
            Step("end", terminal=True, done=is_set("x"), allow=["book"], deny=["book"]),
            simple("c", gate=done("nowhere")),
            simple("x", after="y"),
            simple("y", after="x"),
        ],
        [require("a", "missing"), before("phantom", "a")],
    )
    problems = problems_of(flow)
    expected = [
        "step id 'a' is used more than once",
        "step 'b' comes after unknown step 'ghost'",
        "step 'b' has no done guard",
        "terminal step 'end' has a done guard",
        "step 'end' both allows and denies tool 'book'",
        "step 'c' gate reads done('nowhere')",
        "names unknown step 'missing'",
        "names unknown step 'phantom'",
        "the steps' after edges form a cycle",
    ]
    assert len(problems) == len(expected)
    for fragment in expected:
        assert sum(fragment in p for p in problems) == 1, (fragment, problems)
    assert "has 9 problem(s)" in str(definition_error(flow.build))


CYCLE = re.compile(r"cycle: (.+?)(?: \(|;)")


def cycle_in(problem: str) -> list[str]:
    found = CYCLE.search(problem)
    assert found, problem
    return found.group(1).split(" -> ")


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]])
def test_cycle_message_names_the_cycle_in_flow_order(order: list[int]) -> None:
    # a -> b -> c -> a (each after the one before it), plus d hanging off the cycle.
    steps = [
        simple("a", after="c"),
        simple("b", after="a"),
        simple("c", after="b"),
        simple("d", after="c"),
    ]
    flow = Flow("f", [steps[i] for i in order])
    (problem,) = problems_of(flow)
    chain = cycle_in(problem)
    assert chain[0] == chain[-1]
    assert sorted(chain[:-1]) == ["a", "b", "c"]
    follows = {("c", "a"), ("a", "b"), ("b", "c")}  # (first, then)
    assert {(x, y) for x, y in itertools.pairwise(chain)} == follows
    assert "reset(...).when(...)" in problem


# -- compile() ----------------------------------------------------------------------------------


def test_compile_returns_the_flow_and_keeps_the_registry() -> None:
    flow = Flow(
        "f",
        [simple("a", allow=["search"]), Step("end", after="a", terminal=True)],
        [once("book")],
        ambient=["escalate"],
    )
    assert flow.registry is None
    assert flow.compile() is flow
    assert flow.registry is None
    tools = ["search", "book", "escalate", "unused"]
    assert flow.compile(tools=tools) is flow
    assert flow.registry == frozenset(tools)
    # A failing compile leaves the registry alone.
    with pytest.raises(FlowDefinitionError):
        flow.compile(tools=["search"])
    assert flow.registry == frozenset(tools)


def test_compile_takes_a_single_tool_name() -> None:
    flow = Flow("f", [simple("a", allow="book")])
    assert flow.compile(tools="book").registry == frozenset({"book"})


def test_compile_reports_every_unknown_tool() -> None:
    flow = Flow(
        "f",
        [simple("a", allow=["serch", "book"], deny=["cancl"])],
        [once("bok"), never("pay").until(is_true("ok")), commit("charge", is_true("yes"))],
        ambient=["escalat"],
    )
    problems = problems_of(flow, compile_=True, tools=["book", "search", "escalate"])
    assert problems == [
        f"tool {t!r} is not among the session's tools (book, escalate, search); check its spelling"
        for t in ["bok", "cancl", "charge", "escalat", "pay", "serch"]
    ]
    assert "(none)" in problems_of(flow, compile_=True, tools=[])[0]
    # Without a registry, tool names are not checked.
    assert flow.compile() is flow


def test_compile_reports_ordering_cycles_through_before() -> None:
    flow = Flow(
        "f",
        [simple("a"), simple("b", after="a"), simple("c", after="b")],
        [before("c", "a")],
    )
    assert flow.build() is flow  # after edges alone form no cycle
    (problem,) = problems_of(flow, compile_=True)
    assert "after edges and before() constraints form an ordering cycle" in problem
    assert "no step on it can ever start" in problem
    chain = cycle_in(problem)
    assert chain[0] == chain[-1]
    assert sorted(chain[:-1]) == ["a", "b", "c"]
    assert {(x, y) for x, y in itertools.pairwise(chain)} == {
        ("a", "b"),
        ("b", "c"),
        ("c", "a"),
    }


def test_compile_reports_a_step_before_itself() -> None:
    (problem,) = problems_of(Flow("f", [simple("a")], [before("a", "a")]), compile_=True)
    assert "ordering cycle: a -> a" in problem


def test_compile_accepts_before_between_parallel_steps() -> None:
    flow = Flow("f", [simple("a"), simple("b"), simple("c", after=["a", "b"], join="any")])
    assert flow.compile() is flow
    assert Flow("f", list(flow.steps), [before("a", "b")]).compile().constraints == (
        before("a", "b"),
    )


def test_compile_with_an_unknown_before_step_reports_it_cleanly() -> None:
    # The ordering check must not look up a step build() already found unknown.
    problems = problems_of(Flow("f", [simple("a")], [before("a", "zz")]), compile_=True)
    assert problems == ["constraints[0] (before('a', 'zz')) names unknown step 'zz'"]


@pytest.mark.parametrize(
    "guard",
    [
        always(),
        all_(),
        all_(always(), all_()),
        any_(is_set("x"), always()),
        not_(any_()),
        always() & all_(),
    ],
)
def test_compile_rejects_a_commit_whose_guard_always_holds(guard: Guard) -> None:
    flow = Flow("f", [simple("a")], [commit("book", until=guard)])
    assert flow.build() is flow  # a plan-level check: build() does not make it
    (problem,) = problems_of(flow, compile_=True)
    assert problem.startswith("commit tool 'book' is guarded by a guard that always holds")


@pytest.mark.parametrize("guard", [is_true("confirmed"), all_(always(), is_set("x"))])
def test_compile_accepts_a_commit_guard_that_can_be_false(guard: Guard) -> None:
    flow = Flow("f", [simple("a")], [commit("book", until=guard)])
    assert flow.compile() is flow


@pytest.mark.parametrize("guard", [any_(), not_(always()), all_(is_set("x"), any_())])
@pytest.mark.parametrize("kind", ["commit", "never"])
def test_compile_rejects_a_tool_gate_that_can_never_open(guard: Guard, kind: str) -> None:
    gate = commit("book", until=guard) if kind == "commit" else never("book").until(guard)
    flow = Flow("f", [simple("a")], [gate])
    (problem,) = problems_of(flow, compile_=True)
    assert "can never hold, so 'book' could never be called" in problem


@pytest.mark.parametrize("guard", [not_(not_(always())), not_(all_(any_()))])
def test_compile_rejects_a_commit_behind_a_negated_never_true_guard(guard: Guard) -> None:
    assert guard.evaluate(State())  # holds on any state: it reads nothing
    assert guard.keys_read() == frozenset()
    flow = Flow("f", [simple("a")], [commit("book", until=guard)])
    (problem,) = problems_of(flow, compile_=True)
    assert problem.startswith("commit tool 'book' is guarded by a guard that always holds")


def test_compile_lists_build_and_plan_problems_together() -> None:
    flow = Flow(
        "f",
        [simple("a"), simple("a")],
        [commit("book", until=always())],
    )
    problems = problems_of(flow, compile_=True, tools=["nothing"])
    assert len(problems) == 3
    assert "used more than once" in problems[0]
    assert "always holds" in problems[1]
    assert "tool 'book' is not among" in problems[2]


def test_compile_reports_a_step_behind_an_edge_that_is_never_taken() -> None:
    flow = Flow(
        "f",
        [simple("a"), simple("b", after=[edge("a", when=any_())])],
    )
    (problem,) = problems_of(flow, compile_=True)
    assert "step 'b' is unreachable" in problem


def test_unreachability_spreads_along_edges_and_respects_join() -> None:
    flow = Flow(
        "f",
        [
            simple("a"),
            simple("dead", after=["a"], gate=not_(always())),
            simple("after_dead", after=["dead"]),
            simple("either", after=["a", "dead"], join="any"),
            simple("both", after=["a", "dead"]),
            simple("ordered"),
        ],
        [before("dead", "ordered")],
    )
    problems = problems_of(flow, compile_=True)
    unreachable = sorted(p.split("'")[1] for p in problems)
    assert unreachable == ["after_dead", "both", "dead", "ordered"]


@pytest.mark.parametrize("reverse", [False, True])
def test_a_long_linear_flow_builds_compiles_and_serialises(reverse: bool) -> None:
    n = 2000
    steps = [simple("s0")] + [simple(f"s{i}", after=f"s{i - 1}") for i in range(1, n)]
    steps.append(Step("end", after=f"s{n - 1}", terminal=True))
    if reverse:
        steps.reverse()
    flow = Flow("long", steps, [before("s0", "end"), require("end")])
    assert flow.build() is flow
    assert flow.compile() is flow
    assert_round_trip(flow)
    assert flow.to_mermaid().count("-->") == n


def test_a_long_cycle_is_reported_without_recursion_error() -> None:
    n = 2000
    steps = [simple(f"s{i}", after=f"s{(i - 1) % n}") for i in range(n)]
    (problem,) = problems_of(Flow("loop", steps))
    chain = cycle_in(problem)
    assert len(chain) == n + 1
    assert chain[0] == chain[-1]
    # An ordering cycle closed by one before() over a long chain as well.
    line = [simple("s0")] + [simple(f"s{i}", after=f"s{i - 1}") for i in range(1, n)]
    (problem,) = problems_of(Flow("line", line, [before(f"s{n - 1}", "s0")]), compile_=True)
    assert len(cycle_in(problem)) == n + 1


# -- Mermaid ------------------------------------------------------------------------------------


def test_to_mermaid_draws_nodes_edges_branches_and_before() -> None:
    flow = Flow(
        "book",
        [
            simple("greet"),
            simple("check", after="greet"),
            simple("confirm", after=[edge("check", when=eq("avail:result.open", True))]),
            Step(
                "sorry", after=[edge("check", when=eq("avail:result.open", False))], terminal=True
            ),
            Step("bye", after=["confirm"], terminal=True),
        ],
        [before("greet", "sorry"), once("book")],
    )
    assert flow.to_mermaid() == (
        "flowchart TD\n"
        '    s0["greet"]\n'
        '    s1["check"]\n'
        '    s2["confirm"]\n'
        '    s3(["sorry"])\n'
        '    s4(["bye"])\n'
        "    s0 --> s1\n"
        "    s1 -->|\"'avail:result.open' must be true\"| s2\n"
        "    s1 -->|\"'avail:result.open' must be false\"| s3\n"
        "    s2 --> s4\n"
        '    s0 -.->|"before"| s3\n'
    )


def test_to_mermaid_escapes_quotes() -> None:
    flow = Flow(
        "f",
        [
            simple('say "hi"'),
            Step("end", after=[edge('say "hi"', when=is_set("x"))], terminal=True),
        ],
    )
    text = flow.to_mermaid()
    assert 's0["say #quot;hi#quot;"]' in text
    assert "s0 -->|\"'x' must be known\"| s1" in text
    labelled = Flow("f", [simple("a"), simple("b", after=[edge("a", when=eq("k", 'q"t'))])])
    edge_line = labelled.to_mermaid().splitlines()[-1]
    assert edge_line.startswith("    s0 -->|")
    # Only the label's own delimiting quotes remain: every quote inside is escaped.
    label = edge_line[len("    s0 -->|") : edge_line.rindex("|")]
    assert label[0] == label[-1] == '"'
    assert '"' not in label[1:-1]
    assert "#quot;" in label


def test_to_mermaid_skips_edges_to_unknown_steps() -> None:
    flow = Flow("f", [simple("a", after=["zz"])], [before("a", "zz")])
    assert flow.to_mermaid() == 'flowchart TD\n    s0["a"]\n'


# -- JSON ---------------------------------------------------------------------------------------


def every_feature_flow() -> Flow:
    return Flow(
        "booking:v2",
        [
            Step(
                "greet",
                done=captured("user:name", "user:phone"),
                posture="Greet the caller and ask for their name.",
                ground="Caller: {user:name?unknown}; returning: {user:returning?yes:no} {{ok}}",
                allow=["lookup_user"],
            ),
            Step(
                "check",
                after="greet",
                gate=is_set("booking:date") & ~pending("avail"),
                done=resolved("avail") | failed("avail"),
                on_enter=run(LOOKUP, "call"),
                deny=["book"],
            ),
            Step(
                "offer",
                after=[edge("check", when=eq("avail:result.slots.0.open", True))],
                done=called_ok("hold") & fresh("avail"),
                on_enter=run(NOTIFY, "background", scheduling="interrupt"),
            ),
            Step(
                "sorry",
                after=[edge("check", when=not_(eq("avail:result", {"open": [1, 2.5, None]})))],
                terminal=True,
                posture="",
                ground="",
            ),
            Step(
                "confirm",
                after=["offer", "sorry"],
                join="any",
                done=all_(is_true("booking:confirmed"), any_(), all_(), always()),
                on_enter=run(AUDIT, "dispatch", scheduling="silent"),
                allow=["book", "hold"],
            ),
            Step("bye", after=["confirm"], terminal=True, gate=done("confirm")),
        ],
        [
            once("book"),
            before("greet", "check"),
            never("pay").until(is_true("booking:confirmed")),
            require("confirm"),
            reset("check", "offer").when(eq("booking:date", "changed")),
            commit("book", until=is_true("booking:confirmed")),
        ],
        ambient=["escalate", "transfer"],
    )


def test_every_feature_round_trips_exactly() -> None:
    flow = every_feature_flow()
    assert flow.compile() is flow  # a real, valid flow
    assert_round_trip(flow)
    assert_round_trip(flow, resolvers={r.name: r for r in RESOLVERS})
    data = flow.to_json()
    assert data["format"] == "slateflow.flow/1"
    assert data["flow"]["name"] == "booking:v2"
    steps = data["flow"]["steps"]
    assert steps[1]["on_enter"] == {"resolver": "lookup", "mode": "call"}
    assert steps[2]["on_enter"] == {
        "resolver": "notify",
        "mode": "background",
        "scheduling": "interrupt",
    }
    assert steps[0]["ground"] == flow.steps[0].ground.text  # type: ignore[union-attr]
    assert data["flow"]["ambient"] == ["escalate", "transfer"]


def test_to_json_omits_defaults() -> None:
    data = Flow("f", [Step("a", terminal=True)]).to_json()
    assert data == {
        "format": "slateflow.flow/1",
        "flow": {"name": "f", "steps": [{"id": "a", "terminal": True}]},
    }
    assert_round_trip(Flow("f", [Step("a", terminal=True)]))
    # A flow need not be valid to be saved: from_json does not build it.
    invalid = Flow("f", [], [before("x", "x")])
    assert_round_trip(invalid)
    with pytest.raises(FlowDefinitionError):
        Flow.from_json(invalid.to_json()).build()


def test_from_json_fills_defaults() -> None:
    flow = Flow.from_json(
        {
            "format": "slateflow.flow/1",
            "flow": {
                "name": "f",
                "steps": [
                    {
                        "id": "a",
                        "done": {"op": "is_set", "key": "x"},
                        "on_enter": {"resolver": "lookup"},
                    },
                    {"id": "b", "after": [{"step": "a"}], "terminal": True},
                ],
            },
        },
        resolvers=[LOOKUP],
    )
    assert flow == Flow(
        "f",
        [Step("a", done=is_set("x"), on_enter=run(LOOKUP)), Step("b", after="a", terminal=True)],
    )


# hypothesis: random serialisable flows -----------------------------------------------------

names = st.from_regex(r"[a-z][a-z0-9_]{0,5}(:[a-z0-9_]{1,4}){0,2}", fullmatch=True)
refs = st.one_of(
    names,
    st.tuples(
        names, st.lists(st.from_regex(r"-?[0-9]{1,2}|[a-z]{1,4}", fullmatch=True), max_size=3)
    ).map(lambda kv: ".".join([kv[0], *kv[1]])),
    st.just("[files:report.pdf].size"),
)
texts = st.text(max_size=12)
# Names that print as themselves (invisible and control characters are refused: see
# test_admission_and_names).
ids = st.text(min_size=1, max_size=8).filter(lambda s: not unprintable(s))
tools = (
    st.text(min_size=1, max_size=6)
    .filter(lambda s: not unprintable(s))
    .map(lambda s: "star" if s == "*" else s)  # "*" means any tool, in allow only
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
atoms = st.one_of(
    st.just(always()),
    names.map(is_true),
    names.map(is_set),
    st.builds(eq, refs, json_values),
    st.lists(names, min_size=1, max_size=3).map(lambda ks: captured(*ks)),
    tools.map(called_ok),
    ids.map(done),
    names.map(resolved),
    names.map(failed),
    names.map(pending),
    names.map(fresh),
)
guards_ = st.recursive(
    atoms,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda ps: all_(*ps)),
        st.lists(inner, max_size=3).map(lambda ps: any_(*ps)),
        inner.map(not_),
    ),
    max_leaves=8,
)
plain = st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=8)
ground_pieces = st.one_of(
    plain,
    st.just("{{"),
    st.just("}}"),
    names.map(lambda k: "{" + k + "}"),
    st.tuples(refs, plain).map(lambda p: "{" + p[0] + "?" + p[1] + "}"),
    st.tuples(names, plain, plain).map(lambda p: "{" + p[0] + "?" + p[1] + ":" + p[2] + "}"),
)
grounds = st.lists(ground_pieces, max_size=4).map("".join)
afters = st.lists(
    st.one_of(ids, st.builds(edge, ids, st.none() | guards_)),
    max_size=3,
)
on_enters = st.builds(
    run,
    st.sampled_from(RESOLVERS),
    st.sampled_from(["call", "dispatch", "background"]),
    scheduling=st.sampled_from([s.value for s in Scheduling]),
)
steps_ = st.builds(
    Step,
    ids,
    after=afters,
    join=st.sampled_from(["all", "any"]),
    gate=st.none() | guards_,
    done=st.none() | guards_,
    posture=st.none() | texts,
    ground=st.none() | grounds,
    allow=st.lists(tools, max_size=3),
    deny=st.lists(tools, max_size=3),
    terminal=st.booleans(),
    on_enter=st.none() | on_enters,
)
step_lists = st.lists(ids, min_size=1, max_size=3)
constraints_ = st.one_of(
    tools.map(once),
    st.builds(before, ids, ids),
    st.builds(lambda t, g: never(t).until(g), tools, guards_),
    step_lists.map(lambda s: require(*s)),
    st.builds(lambda s, g: reset(*s).when(g), step_lists, guards_),
    st.builds(commit, tools, guards_),
)
flows = st.builds(
    Flow,
    names,
    st.lists(steps_, max_size=5),
    st.lists(constraints_, max_size=4),
    st.lists(tools, max_size=3),
)


@settings(deadline=None, max_examples=100)
@given(flows)
def test_random_serialisable_flows_round_trip_exactly(flow: Flow) -> None:
    assert_round_trip(flow)


@settings(deadline=None, max_examples=40)
@given(flows)
def test_random_flows_draw_one_mermaid_node_per_step(flow: Flow) -> None:
    lines = flow.to_mermaid().splitlines()
    assert lines[0] == "flowchart TD"
    nodes = [line for line in lines if re.fullmatch(r" {4}s\d+(\[|\(\[).*", line)]
    assert len(nodes) == len(flow.steps)
    assert sum("([" in n for n in nodes) == sum(s.terminal for s in flow.steps)


# on_enter and what cannot be serialised ----------------------------------------------------


def test_on_enter_needs_its_resolver_to_be_read() -> None:
    flow = Flow(
        "f",
        [simple("a"), simple("b", after="a", on_enter=run(NOTIFY, "background"))],
    )
    data = flow.to_json()
    message = format_error(data)
    assert message.startswith("flow.steps[1].on_enter.resolver: no resolver named 'notify'")
    assert "none were given" in message
    message = format_error(data, resolvers=[LOOKUP, AUDIT])
    assert "given: audit:log, lookup" in message
    assert "flow.steps[1].on_enter.resolver" in format_error(data, resolvers={"lookup": LOOKUP})
    assert Flow.from_json(data, resolvers={"notify": NOTIFY}) == flow
    assert Flow.from_json(data, resolvers=iter([NOTIFY])) == flow


def test_on_enter_reads_back_the_resolver_it_is_given() -> None:
    data = Flow("f", [simple("a", on_enter=run(LOOKUP, "call"))]).to_json()
    other = Resolver.fetch("lookup", _fetch)
    step = Flow.from_json(data, resolvers=[other]).steps[0]
    assert step.on_enter is not None
    assert step.on_enter.resolver is other
    assert step.on_enter.mode == "call"


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ({"resolver": "lookup", "mode": "later"}, "flow.steps[0].on_enter: run('lookup', mode="),
        ({"resolver": "lookup", "scheduling": "now"}, "scheduling must be one of"),
        ({"resolver": "lookup", "mode": 3}, "flow.steps[0].on_enter.mode: expected a string"),
        ({"resolver": 3}, "flow.steps[0].on_enter.resolver: expected a string, got int"),
        ({"mode": "call"}, "flow.steps[0].on_enter: missing field 'resolver'"),
        ({"resolver": "lookup", "deliver": "x"}, "on_enter: unknown field(s) ['deliver']"),
        ("lookup", "flow.steps[0].on_enter: expected a JSON object, got str"),
    ],
)
def test_bad_on_enter_nodes(bad: Any, fragment: str) -> None:
    data = {
        "format": "slateflow.flow/1",
        "flow": {"name": "f", "steps": [{"id": "a", "terminal": True, "on_enter": bad}]},
    }
    assert fragment in format_error(data, resolvers=[LOOKUP])


def test_a_deliver_callable_refuses_to_be_written() -> None:
    flow = Flow(
        "f",
        [simple("a"), simple("b", after="a", on_enter=run(NOTIFY, "background", deliver=print))],
    )
    message = write_error(flow)
    assert message.startswith("flow.steps[1].on_enter: its deliver callable is code")


def _code(_: State, __: Any) -> bool:
    return True


CODE = custom(_code, ["k"], describe="the code says so")


@pytest.mark.parametrize(
    ("flow", "path"),
    [
        (Flow("f", [simple("a", done=CODE)]), "flow.steps[0].done"),
        (Flow("f", [simple("a", gate=CODE)]), "flow.steps[0].gate"),
        (
            Flow("f", [simple("a"), simple("b", after=["a", edge("a", when=CODE)])]),
            "flow.steps[1].after[1].when",
        ),
        (
            Flow("f", [simple("a", done=all_(is_set("x"), any_(is_set("y"), not_(CODE))))]),
            "flow.steps[0].done.of[1].of[1].of",
        ),
        (
            Flow("f", [simple("a")], [once("t"), never("t").until(CODE)]),
            "flow.constraints[1].until",
        ),
        (
            Flow("f", [simple("a")], [reset("a").when(is_set("x") & CODE)]),
            "flow.constraints[0].when.of[1]",
        ),
        (Flow("f", [simple("a")], [commit("t", until=~CODE)]), "flow.constraints[0].until.of"),
    ],
)
def test_a_custom_guard_anywhere_refuses_to_be_written(flow: Flow, path: str) -> None:
    assert flow.build() is flow  # custom guards are fine in a flow; only saving refuses
    message = write_error(flow)
    assert message.startswith(f"{path} is a custom guard (the code says so)")


# bad documents ------------------------------------------------------------------------------


def good_document() -> dict[str, Any]:
    flow = Flow(
        "f",
        [
            simple("a"),
            Step(
                "b",
                after=[edge("a", when=all_(is_set("y"), not_(eq("z", 1))))],
                done=any_(is_set("q"), all_(called_ok("t"))),
                allow=["t"],
            ),
        ],
        [never("t").until(is_true("ok")), reset("a").when(is_set("r"))],
    )
    data = flow.to_json()
    assert Flow.from_json(data) == flow
    return data


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        node: Any = doc
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value

    return mutate


def _drop(path: list[Any]) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        node: Any = doc
        for part in path[:-1]:
            node = node[part]
        del node[path[-1]]

    return mutate


S0 = ["flow", "steps", 0]
S1 = ["flow", "steps", 1]
C0 = ["flow", "constraints", 0]
C1 = ["flow", "constraints", 1]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_set(["format"], "slateflow.flow/2"), "format: expected 'slateflow.flow/1', got 'sla"),
        (_set(["format"], "slateflow.guard/1"), "format: expected 'slateflow.flow/1'"),
        (_drop(["format"]), "format: expected 'slateflow.flow/1', got None"),
        (_set(["extra"], 1), "unknown field(s) ['extra'] beside 'format' and 'flow'"),
        (_set(["flow"], []), "flow: expected a JSON object, got list"),
        (_drop(["flow"]), "flow: expected a JSON object, got null"),
        (_set(["flow", "version"], 1), "flow: unknown field(s) ['version']"),
        (_drop(["flow", "name"]), "flow: missing field 'name'"),
        (_set(["flow", "name"], 3), "flow.name: expected a string, got int"),
        (_set(["flow", "name"], "bad name"), "flow: flow name 'bad name' must make valid"),
        (_drop(["flow", "steps"]), "flow: missing field 'steps'"),
        (_set(["flow", "steps"], {}), "flow.steps: expected a list of steps, got dict"),
        (_set(S0, "a"), "flow.steps[0]: expected a JSON object, got str"),
        (_set([*S0, "colour"], "red"), "flow.steps[0]: unknown field(s) ['colour']"),
        (_drop([*S0, "id"]), "flow.steps[0]: missing field 'id'"),
        (_set([*S0, "id"], 7), "flow.steps[0].id: expected a string, got int"),
        (_set([*S0, "id"], ""), "flow.steps[0]: a step id is a non-empty string"),
        (_set([*S1, "after"], "a"), "flow.steps[1].after: expected a list, got str"),
        (_set([*S1, "after", 0], 3), "flow.steps[1].after[0]: expected a JSON object, got int"),
        (_set([*S1, "after", 0, "why"], 1), "flow.steps[1].after[0]: unknown field(s) ['why']"),
        (_drop([*S1, "after", 0, "step"]), "flow.steps[1].after[0]: missing field 'step'"),
        (_set([*S1, "after", 0, "step"], 5), "flow.steps[1].after[0].step: expected a string"),
        (
            _set([*S1, "after", 0, "when", "of", 1, "of", "key"], "bad key"),
            "flow.steps[1].after[0].when.of[1].of.key: ",
        ),
        (
            _set([*S1, "after", 0, "when", "of", 1, "of", "extra"], True),
            "flow.steps[1].after[0].when.of[1].of: unknown field(s) ['extra'] for op 'eq'",
        ),
        (
            _set([*S1, "done", "of", 1, "of", 0, "op"], "called"),
            "flow.steps[1].done.of[1].of[0].op: unknown guard 'called'",
        ),
        (
            _set([*S1, "done", "of", 1, "of", 0, "tool"], ""),
            "flow.steps[1].done.of[1].of[0].tool: ",
        ),
        (_set([*S1, "done", "of"], None), "flow.steps[1].done.of: expected a list of guards"),
        (_set([*S1, "gate"], "always"), "flow.steps[1].gate: a guard node is a JSON object"),
        (_set([*S1, "join"], "some"), "flow.steps[1]: step 'b': join must be 'all' or 'any'"),
        (_set([*S1, "join"], 1), "flow.steps[1].join: expected a string, got int"),
        (_set([*S1, "terminal"], "yes"), "flow.steps[1].terminal: expected true or false"),
        (_set([*S1, "terminal"], 1), "flow.steps[1].terminal: expected true or false, got int"),
        (_set([*S1, "allow"], "t"), "flow.steps[1].allow: expected a list of strings, got str"),
        (_set([*S1, "allow"], ["t", ""]), "flow.steps[1].allow[1]: expected a non-empty string"),
        (_set([*S1, "deny"], [3]), "flow.steps[1].deny[0]: expected a non-empty string"),
        (_set([*S1, "posture"], 3), "flow.steps[1].posture: expected a string, got int"),
        (_set([*S1, "posture"], None), "flow.steps[1].posture: expected a string, got null"),
        (_set([*S1, "ground"], ["x"]), "flow.steps[1].ground: expected a string, got list"),
        (_set([*S1, "ground"], "{x"), "flow.steps[1]: step 'b': ground: template syntax error"),
        (_set(["flow", "constraints"], {}), "flow.constraints: expected a list, got dict"),
        (_set(C0, "once"), "flow.constraints[0]: expected a JSON object, got str"),
        (_set([*C0, "kind"], "always"), "flow.constraints[0].kind: unknown constraint 'always'"),
        (_drop([*C0, "kind"]), "flow.constraints[0].kind: unknown constraint None"),
        (_set([*C0, "kind"], 3), "flow.constraints[0].kind: unknown constraint 3"),
        (_set([*C0, "steps"], ["a"]), "flow.constraints[0]: unknown field(s) ['steps']"),
        (_drop([*C0, "until"]), "flow.constraints[0]: missing field 'until'"),
        (_drop([*C0, "tool"]), "flow.constraints[0]: missing field 'tool'"),
        (_set([*C0, "tool"], ""), "flow.constraints[0]: never(tool) must be a non-empty string"),
        (_set([*C0, "tool"], False), "flow.constraints[0].tool: expected a string, got bool"),
        (
            _set([*C0, "until"], {"op": "all", "of": [{"op": "not", "of": {"op": "is_set"}}]}),
            "flow.constraints[0].until.of[0].of: missing field 'key'",
        ),
        (_set([*C1, "steps"], []), "flow.constraints[1]: reset() needs at least one step id"),
        (_set([*C1, "steps"], "a"), "flow.constraints[1].steps: expected a list of strings"),
        (_set([*C1, "steps"], ["a", 2]), "flow.constraints[1].steps[1]: expected a non-empty"),
        (_drop([*C1, "when"]), "flow.constraints[1]: missing field 'when'"),
        (_set([*C1, "when", "of"], 1), "flow.constraints[1].when: unknown field(s) ['of'] for op"),
        (_set(["flow", "ambient"], "t"), "flow.ambient: expected a list of strings, got str"),
        (_set(["flow", "ambient"], [""]), "flow.ambient[0]: expected a non-empty string"),
    ],
)
def test_bad_documents_name_the_path(
    mutate: Callable[[dict[str, Any]], None], expected: str
) -> None:
    doc = good_document()
    mutate(doc)
    assert format_error(doc).startswith(expected)


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"kind": "once"}, "flow.constraints[0]: missing field 'tool'"),
        ({"kind": "before", "first": "a"}, "flow.constraints[0]: missing field 'then'"),
        ({"kind": "before", "first": "a", "then": 1}, "flow.constraints[0].then: expected a"),
        ({"kind": "require"}, "flow.constraints[0]: require() needs at least one step id"),
        ({"kind": "require", "steps": [""]}, "flow.constraints[0].steps[0]: expected"),
        ({"kind": "commit", "tool": "t"}, "flow.constraints[0]: missing field 'until'"),
        (
            {"kind": "commit", "tool": "t", "until": {"op": "any", "of": [{"op": "nope"}]}},
            "flow.constraints[0].until.of[0].op: unknown guard 'nope'",
        ),
        ({"kind": "reset", "steps": ["a"], "when": None}, "flow.constraints[0].when: a guard"),
    ],
)
def test_bad_constraint_nodes(node: dict[str, Any], expected: str) -> None:
    doc = {"format": "slateflow.flow/1", "flow": {"name": "f", "steps": [], "constraints": [node]}}
    assert format_error(doc).startswith(expected)


@pytest.mark.parametrize("data", [None, [], "flow", 3, json.dumps(good_document())])
def test_from_json_needs_an_object(data: Any) -> None:
    assert format_error(data).startswith("a serialised flow is a JSON object")


def test_format_errors_are_value_errors_and_not_definition_errors() -> None:
    assert issubclass(FlowFormatError, ValueError)
    assert not issubclass(FlowFormatError, FlowDefinitionError)


# -- grounds ------------------------------------------------------------------------------------


def render(text: str, **values: Any) -> str:
    state = State()
    for key, value in values.items():
        state.set(key.replace("__", ":"), value)
    return Ground(text).render(state)


def test_ground_renders_keys_and_paths() -> None:
    assert render("Caller: {user:name}.", user__name="Ada") == "Caller: Ada."
    slot = {"time": "10:00", "rooms": [{"n": 1}, {"n": 2}], "2024": "leap"}
    assert render("{slot.time} {slot.rooms.0.n} {slot.rooms.-1.n} {slot.2024}", slot=slot) == (
        "10:00 1 2 leap"
    )
    assert render("{ slot.time }", slot=slot) == "10:00"
    state = State()
    state.set("files:report.pdf", {"size": 3})
    assert Ground("{[files:report.pdf].size} KB").render(state) == "3 KB"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("text", "text"),
        (3, "3"),
        (2.5, "2.5"),
        (True, "true"),
        (None, "null"),
        ({"open": True, "n": [1, "é"]}, '{"open":true,"n":[1,"é"]}'),
        ([], "[]"),
    ],
)
def test_ground_spells_values_like_a_template(value: Any, shown: str) -> None:
    assert render("{k}", k=value) == shown


def test_a_missing_key_or_path_renders_empty() -> None:
    assert render("Name: {user:name}.") == "Name: ."
    assert render("{slot.time}|{slot.rooms.5}|{slot.time.x}", slot={"time": "10"}) == "10||"
    assert render("{k.0}", k="a string") == ""
    assert render("{k}") == ""


def test_ground_defaults() -> None:
    assert render("Hi {user:name?there}!") == "Hi there!"
    assert render("Hi {user:name?there}!", user__name="Ada") == "Hi Ada!"
    assert render("Hi {user:name ? dear caller }!") == "Hi dear caller!"
    assert render("[{k?}]") == "[]"
    assert render("{k?fallback}", k=None) == "null"  # a value, not missing
    assert render("{k.x?none yet}", k={"y": 1}) == "none yet"


FALSY = [None, False, 0, 0.0, -0.0, "", [], {}]
TRUTHY = [True, 1, -1, 0.5, "x", "0", "false", " ", [0], [None], {"a": None}, {"": 0}]


@pytest.mark.parametrize("value", FALSY)
def test_choice_takes_no_for_falsy_values(value: Any) -> None:
    assert render("{k?yes:no}", k=value) == "no"


@pytest.mark.parametrize("value", TRUTHY)
def test_choice_takes_yes_for_truthy_values(value: Any) -> None:
    assert render("{k?yes:no}", k=value) == "yes"


def test_choice_on_a_missing_key_or_path_says_no() -> None:
    assert render("{k?yes:no}") == "no"
    assert render("{k.open?open:closed}", k={"open": True}) == "open"
    assert render("{k.open?open:closed}", k={"shut": True}) == "closed"
    assert render("{k.0?some:none}", k=[]) == "none"


def test_choice_texts() -> None:
    assert render("Slot is {k ? still open : gone }.", k=True) == "Slot is still open."
    assert render("Slot is {k ? still open : gone }.") == "Slot is gone."
    # It splits at the first ':'.
    assert render("{k?at 10:30}", k=1) == "at 10"
    assert render("{k?a:b:c}") == "b:c"
    assert render("[{k?:no}]", k=True) == "[]"
    assert render("[{k?yes:}]", k=False) == "[]"


@quick
@given(json_values)
def test_choice_truthiness_property(value: Any) -> None:
    falsy = value in FALSY  # JSON equality is enough here: False == 0 == 0.0 are all falsy
    expected = "N" if falsy else "Y"
    assert render("{k?Y:N}", k=value) == expected
    # The plain placeholder shows the value as a template does.
    from slateflow.resolve import Template

    state = State()
    state.set("k", value)
    assert Ground("<{k}>").render(state) == Template("<{k}>").render(state)


def test_ground_literal_braces() -> None:
    assert render("{{literal}}") == "{literal}"
    assert render("{{ {k} }}", k="v") == "{ v }"
    assert render("}}{{") == "}{"


@pytest.fixture
def secret_state() -> State:
    state = State()
    state.set("user:card", "4111-1111-1111-1111")
    state.set("user:wallet", {"pin": "9876"})
    state.set("user:name", "Ada")
    state.policy("user:card", secret=True)
    state.policy("user:wallet", secret=True)
    state.policy("user:token", secret=True)  # secret, but not set
    return state


@pytest.mark.parametrize(
    "text",
    [
        "Card {user:card}",
        "{user:card?none}",
        "{user:card?}",
        "PIN {user:wallet.pin}",
        "{user:token}",
    ],
)
def test_a_secret_value_is_never_rendered(secret_state: State, text: str) -> None:
    with pytest.raises(TemplateError) as info:
        Ground(text).render(secret_state)
    message = str(info.value)
    assert "secret" in message
    assert "4111" not in message
    assert "9876" not in message
    assert "?yes:no" in message  # it says what may be done instead


def test_a_secret_may_be_tested(secret_state: State) -> None:
    before_render = fingerprint(secret_state)
    ground = Ground(
        "{user:name}: card {user:card?on file:missing}, "
        "pin {user:wallet.pin?known:unknown}, token {user:token?known:unknown}"
    )
    assert ground.render(secret_state) == "Ada: card on file, pin known, token unknown"
    assert fingerprint(secret_state) == before_render  # rendering only reads


def test_ground_keys_text_and_equality() -> None:
    ground = Ground("{a} {b.c?x:y} {a?z} {[d.e]} {{f}}")
    assert ground.keys == ("a", "b", "d.e")
    assert ground.text == "{a} {b.c?x:y} {a?z} {[d.e]} {{f}}"
    assert ground == Ground(ground.text)
    assert hash(ground) == hash(Ground(ground.text))
    assert ground != Ground("{a}")
    assert repr(Ground("{a}")) == "Ground('{a}')"


@pytest.mark.parametrize("text", ["{", "}", "{}", "{a b}", "{a?{b}}", "{items[0]}"])
def test_ground_syntax_errors(text: str) -> None:
    with pytest.raises(TemplateError, match="template syntax error"):
        Ground(text)


def test_a_cycle_does_not_hide_the_other_problems_compile_finds() -> None:
    flow = Flow(
        "looped",
        [
            Step("a", after="b", done=is_set("x")),
            Step("b", after="a", done=is_set("y"), allow=["bok_table"]),
            Step("c", done=is_set("z")),
        ],
        [never("transfer").until(~always())],
    )
    with pytest.raises(FlowDefinitionError) as info:
        flow.compile(["book_table", "transfer"])
    text = str(info.value)
    assert "after edges form a cycle" in text
    assert "tool 'bok_table' is not among the session's tools" in text
    assert "never('transfer')" in text
