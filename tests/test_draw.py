"""``slateflow draw``: a flow as Mermaid or a self-contained HTML page, coloured by what a
recorded call did; bad modules and names exit 2 with a message naming them."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slateflow import Flow, Session, State, Step, before, edge, eq, is_set, is_true
from slateflow.__main__ import main
from slateflow.draw import Marking, flow_svg, load_flows

FLOWS = """
from slateflow import Digression, Flow, FlowStack, Step, edge, eq, is_set, is_true

FLOW = Flow(
    "booking",
    [
        Step("size", done=is_set("party_size")),
        Step("check", after=["size"], done=is_set("open")),
        Step("offer", after=[edge("check", when=eq("open", False))], done=is_true("accepted")),
        Step("confirm", after=[edge("check", when=eq("open", True)), "offer"], join="any",
             done=is_true("confirmed")),
        Step("bye", after=["confirm"], terminal=True),
    ],
)

def make_flow() -> Flow:
    return FLOW

def needs(lookup):
    return FLOW

STACK = FlowStack(FLOW, [Digression("hours", is_true("asked_hours"), Flow("hours", [
    Step("tell", done=is_true("told")), Step("back", after=["tell"], terminal=True)]))])

NOT_A_FLOW = 42
"""


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module ``callflows`` in the working directory, as an app's flows would be."""
    (tmp_path / "callflows.py").write_text(FLOWS, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("callflows", None)


def draw(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["draw", *args])
    return code, out.getvalue(), err.getvalue()


def record(path: Path, flow: Flow) -> None:
    """A durable call that ran ``flow`` to its offer step."""

    async def call() -> None:
        with State.open(path) as state:
            async with Session(state) as session:
                flow.start(session)
                state.set("party_size", 4)
                state.set("open", False)

    anyio.run(call)


def test_draw_prints_the_flows_mermaid(app: Path) -> None:
    code, out, _ = draw("callflows:FLOW")
    assert code == 0
    assert out == load_flows("callflows:FLOW")[0].to_mermaid()


def test_a_function_of_no_arguments_and_a_python_file_work_too(app: Path) -> None:
    assert draw("callflows:make_flow")[1] == draw(f"{app / 'callflows.py'}:FLOW")[1]


def test_the_html_page_is_self_contained_and_labels_every_step_and_edge(app: Path) -> None:
    code, _, _ = draw("callflows:FLOW", "--format", "html", "-o", "flow.html")
    assert code == 0
    page = (app / "flow.html").read_text(encoding="utf-8")
    assert "<script" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched
    for step in ("size", "check", "offer", "confirm", "bye"):
        assert f'data-step="{step}"' in page
    for guard in ("&#x27;open&#x27; must be false", "&#x27;open&#x27; must be true",
                  "&#x27;party_size&#x27; must be known"):  # fmt: skip
        assert guard in page
    svg = page[page.index("<svg") : page.index("</svg>") + 6]
    ET.fromstring(svg)  # well-formed


def test_explain_colours_what_the_recorded_call_went_through(app: Path) -> None:
    record(app / "call.db", load_flows("callflows:FLOW")[0])
    code, out, _ = draw("callflows:FLOW", "--explain", "call.db")
    assert code == 0
    assert "class s1,s0 done" in out or "class s0,s1 done" in out
    assert "class s2 active" in out
    draw("callflows:FLOW", "--explain", "call.db", "--format", "html", "-o", "call.html")
    page = (app / "call.html").read_text(encoding="utf-8")
    states = {
        step: kind for kind, step in re.findall(r'<g class="step (\w+)" data-step="(\w+)"', page)
    }
    assert states == {
        "size": "done",
        "check": "done",
        "offer": "active",
        "confirm": "unreached",
        "bye": "unreached",
    }


def test_a_flow_stack_draws_each_of_its_flows(app: Path) -> None:
    code, out, _ = draw("callflows:STACK")
    assert code == 0
    assert "%% flow booking" in out
    assert "%% flow hours" in out


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("nosuchmodule:FLOW", "no module 'nosuchmodule'"),
        ("callflows:NOPE", "has no 'NOPE'; its flows: FLOW, STACK, make_flow"),
        ("callflows:needs", "'needs' is a function that needs arguments"),
        ("callflows:NOT_A_FLOW", "'NOT_A_FLOW' is a int, not a Flow or FlowStack"),
        ("callflows", "is not module:flow_name"),
        ("missing.py:FLOW", "no Python file 'missing.py'"),
    ],
)
def test_a_bad_module_or_name_exits_2_naming_it(app: Path, spec: str, says: str) -> None:
    code, out, err = draw(spec)
    assert code == 2
    assert out == ""
    assert says in err


def test_explaining_with_a_missing_call_file_exits_2(app: Path) -> None:
    code, _, err = draw("callflows:FLOW", "--explain", "nowhere.db")
    assert code == 2
    assert "nowhere.db" in err


@st.composite
def flows(draw: st.DrawFn) -> Flow:
    n = draw(st.integers(1, 7))
    steps = []
    for i in range(n):
        after: list[object] = []
        if i:
            for src in sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))):
                after.append(
                    edge(f"s{src}", when=is_true(f"k{src}")) if draw(st.booleans()) else f"s{src}"
                )
        steps.append(Step(f"s{i}", after=after, join="any", done=is_set(f"d{i}")))
    constraints = []
    if n > 2 and draw(st.booleans()):
        constraints.append(before("s0", f"s{n - 1}"))
    return Flow("random", steps, constraints=constraints)


@settings(max_examples=60, deadline=None)
@given(flows(), st.data())
def test_any_flow_draws_as_well_formed_svg_one_box_per_step(
    flow: Flow, data: st.DataObject
) -> None:
    ids = [s.id for s in flow.steps]
    done = data.draw(st.sets(st.sampled_from(ids)))
    svg = flow_svg(flow, Marking(frozenset(done), frozenset()))
    root = ET.fromstring(svg)
    boxes = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if "step" in g.get("class", "")]
    assert [g.get("data-step") for g in boxes] == ids
    assert {g.get("data-step") for g in boxes if "done" in g.get("class", "")} == done
    edges = sum(len(s.after) for s in flow.steps) + len(flow.constraints)
    assert (
        len([g for g in root.iter("{http://www.w3.org/2000/svg}g") if "edge" in g.get("class", "")])
        == edges
    )
    assert eq("x", 1)  # the guard helpers imported here are the public ones
