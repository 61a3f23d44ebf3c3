"""``slateflow timeline``: a recorded call as one self-contained page (lanes, marks with
provenance and the guards that read each key, secrets masked, the flow as the call left it),
tested as data, as a command, in a real headless Chromium, and live over server-sent events."""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from browser_support import chromium, distinct_colours
from slateflow import (
    Conversation,
    Flow,
    ManualClock,
    Resolver,
    Session,
    State,
    Step,
    is_set,
    resolved,
    run,
)
from slateflow.__main__ import main
from slateflow.replay import load
from slateflow.timeline import build, call_data
from slateflow.timeline_live import LiveTimeline

FLOWS = """
from slateflow import Flow, Step, is_set, resolved

FLOW = Flow("booking", [
    Step("size", done=is_set("party_size")),
    Step("check", after=["size"], done=resolved("lookup")),
    Step("bye", after=["check"], terminal=True),
])
"""


def booking(lookup: Resolver) -> Flow:
    return Flow(
        "booking",
        [
            Step("size", done=is_set("party_size")),
            Step("check", after=["size"], done=resolved("lookup"), on_enter=run(lookup)),
            Step("bye", after=["check"], terminal=True),
        ],
    )


def record(path: Path) -> None:
    """A durable call: two turns, a lookup run, a tool call, a secret."""

    async def lookup(state: State) -> dict[str, bool]:
        return {"open": True}

    async def call() -> None:
        with State.open(path) as state:
            state.policy("card:*", secret=True)
            async with Session(state, clock=ManualClock()) as session:
                conversation = Conversation(session, tools=["book"])
                conversation.run_flow(booking(Resolver.fetch("lookup", lookup)))
                await conversation.user_turn("A table for four, please.")
                state.set("party_size", 4, source="extraction", writer="slots", confidence=0.9)
                state.set("card:number", "4111111111111111")
                await conversation.user_turn("Book it.")
                state.set("tool:book:result", "booked")

    anyio.run(call)


@pytest.fixture
def call_db(tmp_path: Path) -> Path:
    path = tmp_path / "call.db"
    record(path)
    return path


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "callflow.py").write_text(FLOWS, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("callflow", None)


def data_of(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert found is not None
    return dict(json.loads(found.group(1).replace("<\\/", "</")))


# -- the data ------------------------------------------------------------------------------------


def test_the_lanes_read_turns_steps_runs_and_tools_off_the_recorded_keys(call_db: Path) -> None:
    data = call_data(load(call_db), "call")
    lanes = data["lanes"]
    assert [(t["number"], t["text"]) for t in lanes["turns"]] == [
        (1, "A table for four, please."),
        (2, "Book it."),
    ]
    steps = [(s["step"], s["kind"]) for s in lanes["steps"]]
    assert ("size", "done") in steps
    assert ("check", "entered") in steps
    assert [(r["name"], r["status"]) for r in lanes["runs"]] == [("lookup", "done")]
    assert [(t["name"], t["status"]) for t in lanes["tools"]] == [("book", "ok")]


def test_each_change_carries_its_provenance_and_the_guards_that_read_it(
    call_db: Path, app: Path
) -> None:
    from slateflow.draw import load_flows

    data = call_data(load(call_db), "call", load_flows("callflow:FLOW"))
    (size,) = [c for c in data["changes"] if c["key"] == "party_size"]
    assert size["new"] == "4"
    assert size["old"] is None
    assert (size["source"], size["writer"], size["confidence"]) == ("extraction", "slots", 0.9)
    assert size["readers"] == ["booking/size done: 'party_size' must be known"]
    (svg,) = [f["svg"] for f in data["flows"]]
    assert 'class="step done" data-step="size"' in svg


def test_secrets_stay_masked_and_values_are_cut(call_db: Path) -> None:
    page = build(call_db, max_value_chars=20)
    assert "4111111111111111" not in page
    (card,) = [c for c in data_of(page)["changes"] if c["key"] == "card:number"]
    assert card["new"] == "***"
    assert "4111111111111111" in build(call_db, show_secrets=True)


def test_the_page_is_self_contained(call_db: Path) -> None:
    page = build(call_db)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched
    assert "<link" not in page
    assert page.count("<script") == 2  # the data and the code that draws it, both inline


def test_the_command_writes_the_page_and_refuses_a_missing_call(
    call_db: Path, app: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["timeline", str(call_db), "-o", "t.html", "--flow", "callflow:FLOW"]) == 0
    assert data_of((app / "t.html").read_text(encoding="utf-8"))["flows"]
    assert main(["timeline", "nowhere.db"]) == 2
    assert "nowhere.db" in capsys.readouterr().err
    assert main(["timeline", str(call_db), "--flow", "callflow:NOPE"]) == 2


# -- in a real browser ---------------------------------------------------------------------------


def test_the_page_in_chromium_draws_lanes_and_marks_and_explains_a_mark_on_hover(
    call_db: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    page = tmp_path / "call.html"
    page.write_text(build(call_db), encoding="utf-8")
    changes = len(data_of(page.read_text(encoding="utf-8"))["changes"])
    assert changes > 5
    with chromium() as browser:
        browser.get(page.as_uri())
        lanes = [
            g.get_attribute("data-lane") for g in browser.find_elements(By.CSS_SELECTOR, "g.lane")
        ]
        assert lanes == ["turns", "steps", "runs", "tools", "changes"]
        marks = browser.find_elements(By.CSS_SELECTOR, '[data-kind="change"]')
        assert len(marks) == changes
        rendered = browser.execute_script(
            "return document.documentElement.getAttribute('data-rendered-ms')"
        )
        assert float(rendered) > 0
        # The change marks are drawn in commit order: the party size's is found by its place.
        keys = [c["key"] for c in data_of(page.read_text(encoding="utf-8"))["changes"]]
        target = marks[keys.index("party_size")]
        ActionChains(browser).move_to_element(target).perform()
        tip = browser.find_element(By.ID, "tip")
        assert tip.is_displayed()
        assert tip.text.startswith("party_size  v1")  # key, version, old -> new, who wrote it
        assert "(new)  ->  4" in tip.text
        assert "written by extraction / slots, confidence 0.9" in tip.text
        target.click()
        assert "written by" in browser.find_element(By.ID, "detail").text
        box = browser.find_element(By.ID, "keys")
        box.send_keys("party_*")
        assert len(browser.find_elements(By.CSS_SELECTOR, '[data-kind="change"]')) == 1
        browser.find_element(By.ID, "lane-runs").click()
        assert not browser.find_elements(By.CSS_SELECTOR, 'g.lane[data-lane="runs"]')
        assert distinct_colours(browser.get_screenshot_as_png()) > 8  # not blank


def test_live_mode_serves_on_loopback_and_the_page_follows_new_commits(tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    path = tmp_path / "live.db"
    with State.open(path) as state:
        state.set("a", 1)
        with LiveTimeline(path, poll=0.05) as live:
            assert live.url.startswith("http://127.0.0.1:")
            with urllib.request.urlopen(live.url, timeout=10) as reply:
                assert "slateflow timeline" in reply.read().decode()
            request = urllib.request.Request(live.url, method="POST")
            with pytest.raises(urllib.error.HTTPError, match="405"):
                urllib.request.urlopen(request, timeout=10)
            with chromium() as browser:
                browser.get(live.url)
                marks = '[data-kind="change"]'
                assert len(browser.find_elements(By.CSS_SELECTOR, marks)) == 1
                for i in range(5):
                    state.set(f"b{i}", i)
                WebDriverWait(browser, 20).until(
                    lambda b: len(b.find_elements(By.CSS_SELECTOR, marks)) == 6
                )
