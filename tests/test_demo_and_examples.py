"""The demo, the examples and every Python snippet in the docs actually run."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from builders import example_module
from slateflow.__main__ import main
from slateflow.demo import TickingClock, run

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
DOC_PAGES = [
    "README.md",
    "docs/index.md",
    "docs/state.md",
    "docs/resolvers.md",
    "docs/guards.md",
    "docs/flows.md",
    "docs/testing.md",
    "docs/conversation.md",
    "docs/openai.md",
    "docs/http.md",
    "docs/tools.md",
    "docs/orchestration.md",
    "docs/observability.md",
    "docs/draw.md",
    "docs/timeline.md",
    "docs/durability.md",
    "docs/security.md",
    "docs/replay.md",
    "docs/errors.md",
    "docs/architecture.md",
]


def run_example(name: str, backend: str) -> subprocess.CompletedProcess[str]:
    """``python examples/<name>.py`` (``--trio`` on trio), checked to exit 0."""
    args = [sys.executable, str(ROOT / "examples" / f"{name}.py")]
    if backend == "trio":
        args.append("--trio")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc


def python_blocks(page: str) -> list[str]:
    return FENCE.findall((ROOT / page).read_text(encoding="utf-8"))


def assert_in_order(out: str, lines: list[str]) -> None:
    """Each of ``lines`` is in ``out``, in this order."""
    at = 0
    for line in lines:
        found = out.find(line, at)
        assert found >= 0, f"missing (or out of order): {line!r}\n{out}"
        at = found + len(line)




def run_alone(block: str, where: str) -> None:
    """Run ``block`` as ``python block.py`` would: a fresh ``__main__``, no top-level await."""
    code = compile(block, where, "exec")
    with contextlib.redirect_stdout(io.StringIO()):
        exec(code, {"__name__": "__main__"})


def test_the_demo_shows_the_flow_first_and_fits_a_screen() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "slateflow", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) <= 40
    assert max(len(line) for line in lines) <= 100
    assert_in_order(
        proc.stdout,
        [
            "the plan: slot -> check -> offer (if taken) -> confirm -> book -> goodbye",
            'caller: "Saturday at 7 pm, for four people. My card is [card ending 1111]."',
            "heard: date='Saturday', time='19:00', party_size=4",
            ">> slot done, check entered",
            "model calls book_table: refused, 'book_table' is not permitted yet",
            "waited for availability: it answered after 0.4 s, in the background",
            ">> check done, offer entered",
            "model calls book_table: admitted, it runs",
            "complete: True",
            "python -m slateflow demo --verbose",
        ],
    )
    assert "4111 1111 1111 1111" not in proc.stdout


def test_demo_runs_from_the_command_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "slateflow", "demo", "--verbose"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for phrase in [
        "slateflow demo: a voice agent books a table",
        "booking:party_size = 4  (extraction/slot_filler, confidence 0.85, v1)",
        "booking:date = '2025-06-14'  (extraction/slot_filler, confidence 0.9, v1)",
        "availability:result = ['19:00', '19:30', '20:15']  (fetch/availability, v1)",
        '>> agent: "Good news',
        "state.provenance('availability:result').source = 'fetch'",
        "'resolver': 'slot_filler'",
        "PolicyViolation: writer 'summariser' (source 'llm') may not write 'availability:result'",
        "StateValueError: value for 'booking:deposit' is nan",
        "SchemaError: value for 'booking:party_size' does not match its declared type int",
        "cursor before 6, after 6",
        "the model is told at once: {'status': 'running', 'resolver': 'availability'}",
        "the model is handed (when_idle): {'status': 'completed', 'resolver': 'availability'",
        "'mode': 'background'",
        "attempt 1 rolled back:",
        "booking:status is still None",
        "attempt 2 committed: one batch, one signal (party of 5 at 19:30)",
        "user:card = ***",
        "end_turn(state) cleared 1 key(s)",
    ]:
        assert phrase in out, phrase
    assert "4929 1234 5678 9012" not in out
    assert "4111 1111 1111 1111." in out  # said by the caller ...
    assert out.count("4111 1111 1111 1111") == 1  # ... and never shown again
    # First: the flow moves as the facts arrive, in this order.
    flow_part = out[out.index("The call as a Flow") : out.index("The State underneath")]
    assert_in_order(
        flow_part,
        [
            "active: ['slot']",
            "the model is told: Known: date not yet, time not yet.",
            'transcript (redacted): "Saturday at 7 pm, for four people. My card is '
            '[card ending 1111]."',
            ">> step 'slot' done",
            ">> step 'check' entered",
            "slots: booking:time = '19:00' written (overwrite: new value)",
            "model calls book_table: refused",
            "first, 'booking:confirmed' must be true. Available now: transfer_to_human.",
            ">> step 'check' done",
            ">> step 'offer' entered",
            "the model is idle, so it is told now (conversation.context_now()):",
            "the model is told: Free instead: 19:30.",
            "the model is told: Result of availability (tell the caller at a natural pause): "
            "open: no; alternative: 19:30.",
            ">> step 'confirm' entered",
            "slots: booking:time = '19:30' written (overwrite: overwrites)",
            "answers: booking:confirmed = True not written (not accepted: step 'confirm' is active "
            "does not hold)",
            "the model is told: Booking: Saturday at 19:30 for 4.",
            "model calls book_table: admitted, it runs",
            ">> step 'goodbye' done",
            "'book_table' has already run and may run only once",
            "complete: True; flow:booking:done = ['slot', 'check', 'offer', 'confirm', 'book', "
            "'goodbye']",
            "written by source 'flow', writer 'booking'",
        ],
    )
    assert proc.stderr == ""


def test_demo_is_deterministic_and_leaves_the_booking_in_the_state() -> None:
    first: list[str] = []
    second: list[str] = []
    state = run(first.append, verbose=True)
    run(second.append, verbose=True)
    assert first == second
    assert state.get("booking:status") == "confirmed"
    assert state.get("booking:party_size") == 5
    assert state.is_secret("user:card")
    assert state.keys("turn:") == []


def test_manual_clock_moves_on_each_read() -> None:
    clock = TickingClock(step=2.0)
    assert clock() + 2.0 == clock()


def test_cli_without_a_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_cli_demo_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--verbose"]) == 0
    assert "7. End of turn" in capsys.readouterr().out
    assert main(["demo"]) == 0
    assert "--verbose" in capsys.readouterr().out


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_booking_example_runs(backend: str) -> None:
    proc = run_example("booking_state", backend)
    assert "availability:result = ['19:00', '19:30', '20:15']" in proc.stdout
    assert "availability:error = 'booking service timed out for 2025-06-14'" in proc.stdout
    assert "refused: writer 'guesser'" in proc.stdout
    assert "the model is told: {'status': 'running', 'resolver': 'verify_address'}" in proc.stdout
    assert "the model is handed (when_idle): {'status': 'completed'" in proc.stdout
    assert "mode 'dispatch', attempts 2" in proc.stdout


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_voice_booking_flow_example_runs(backend: str) -> None:
    proc = run_example("voice_booking_flow", backend)
    out = proc.stdout
    # The turns, in order: slot -> check (background lookup) -> offer -> confirm -> book.
    order = [
        "active: slot",
        "Known so far: date not yet, time not yet.",
        "active: check",
        "book_table refused: 'book_table' is not permitted yet: first, 'booking:confirmed' must "
        "be true. Available now: transfer_to_human.",
        "active: offer",
        "Alternative on offer: 19:30.",
        "delivered (when_idle): {'status': 'completed', 'resolver': 'availability', "
        "'result': {'open': False, 'alternative': '19:30'}}",
        "active: confirm",
        "Booking: Saturday at 19:30.",
        "active: book",
        "book_table runs",
        "'book_table' has already run and may run only once",
        "flow complete: True; done: slot, check, offer, confirm, book, goodbye",
    ]
    assert_in_order(out, order)


def test_voice_booking_flow_example_in_process() -> None:
    """The example's flow, run in this process: the final state holds the booking's facts."""
    voice_booking_flow = example_module("voice_booking_flow")
    lines: list[str] = []
    state = anyio.run(voice_booking_flow.main, lines.append)
    assert state.get("flow:booking:complete") is True
    assert state.get("flow:booking:active") == []
    assert state.get("booking:time") == "19:30"
    assert state.get("availability:result") == {"open": False, "alternative": "19:30"}
    prov = state.provenance("flow:booking:done")
    assert prov is not None
    assert (prov.source, prov.writer) == ("flow", "booking")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_restaurant_reservation_example_runs(backend: str) -> None:
    proc = run_example("restaurant_reservation", backend)
    order = [
        "model is told: Warmly greet the customer",
        "Tools you may call now: collect_party_size.",
        "model calls collect_party_size({'size': 4})",
        "Tools you may call now: check_availability.",
        "model calls check_availability({'time': '7:00 PM', 'party_size': 4})",
        "Apologize that the requested time is not available",
        "Result of availability (tell the caller at a natural pause): available: no",
        "model calls check_availability({'time': '9:00 PM', 'party_size': 4})",
        "Reservation: 4 people at 9:00 PM.",
        "Result of availability (tell the caller at a natural pause): available: yes",
        "model calls end_conversation({})",
        "Thank them and end the conversation.",
        "done: initial, get_time, check, confirm, end; over: True",
    ]
    assert_in_order(proc.stdout, order)


def test_restaurant_reservation_json_is_the_plan_in_the_example() -> None:
    """``restaurant_reservation.json`` is what the example's plan writes (kept in step)."""
    restaurant = example_module("restaurant_reservation")
    lookup = restaurant.availability()
    data = json.loads((ROOT / "examples" / "restaurant_reservation.json").read_text("utf-8"))
    assert restaurant.restaurant_flow(lookup).to_json() == data
    assert restaurant.restaurant_flow_from_data(lookup).to_json() == data


def test_restaurant_reservation_in_process_books_nine() -> None:
    restaurant = example_module("restaurant_reservation")
    state = anyio.run(restaurant.main, lambda line: None)
    assert state.get("booking:time") == "9:00 PM"
    assert state.get("availability:result") == {"available": True, "alternatives": []}
    assert state.get("flow:restaurant:complete") is True


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_two_process_call_example_runs_the_lookup_in_a_worker_process(
    backend: str, redis_url: str
) -> None:
    args = [sys.executable, str(ROOT / "examples" / "two_process_call.py"), "--redis", redis_url]
    if backend == "trio":
        args.append("--trio")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert_in_order(proc.stdout, [
        "voice: active steps now slot",
        "caller: Saturday at seven, please.",
        "voice: active steps now check",
        "voice: active steps now offer",
        "written by 'availability': 19:30 is free instead",
        "voice: done: slot, check, offer, confirm",
    ])  # fmt: skip
    worker, voice = re.search(
        r"lookup ran in process (\d+) \(this is (\d+)\)", proc.stdout
    ).groups()  # type: ignore[union-attr]
    assert worker != voice


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_clinic_reschedule_example_runs(backend: str) -> None:
    proc = run_example("clinic_reschedule", backend)
    out = proc.stdout
    heard = [line for line in out.splitlines() if not line.startswith("caller:")]
    assert not any("1958" in line or "1970" in line for line in heard)  # dates of birth
    assert_in_order(
        out,
        [
            "== call 1",
            "transcript: Hi, I need to move my dental appointment. This is Ann Lee, born "
            "[redacted dob]",
            "then the model is told: Ask for the caller's full name and date of birth.",
            "transcript: Sorry, my mistake. It's Ann Lee, [redacted dob]",
            "then the model is told: Offer the free slots; ask which suits.",
            "model calls insurance_faq: covered",
            "New time: 2025-06-17 at 15:15.",
            "model calls reschedule: moved",
            "model calls reschedule: refused: 'reschedule' has already run",
            "done: identify, lookup, offer, read_back, move, goodbye; over: True",
            "== call 2",
            "then the model is told: Apologise and transfer the caller to a person.",
            "model calls transfer_to_person: transferring",
            "done: handoff; over: True",
        ],
    )


def test_clinic_reschedule_example_keeps_the_date_of_birth_for_the_lookup_only() -> None:
    clinic = example_module("clinic_reschedule")
    lines: list[str] = []
    moved, handed = anyio.run(clinic.main, lines.append)
    assert moved.get("patient:dob") == "1985-03-03"  # the lookup read it
    assert moved.is_secret("patient:dob")
    heard = [line for line in lines if not line.startswith("caller:")]
    assert not any("1985" in line or "eighty-five" in line for line in heard)
    assert moved.get("pick:slot") == {"date": "2025-06-17", "time": "15:15"}
    assert moved.get("find_patient:result") == {"patient": "P-17", "appointment": "Thursday 10:00"}
    assert handed.get("find_patient:failures") == 2
    assert handed.get("flow:reschedule:done") == ["handoff"]


def test_state_page_has_snippets() -> None:
    assert len(python_blocks("docs/state.md")) >= 20


@pytest.mark.parametrize("page", DOC_PAGES)
def test_doc_snippets_run(page: str) -> None:
    """Every snippet of every page runs alone, as a plain script (what a reader copies)."""
    blocks = python_blocks(page)
    for i, block in enumerate(blocks, 1):
        run_alone(block, f"{page} block {i}")


def test_distributed_doc_snippets_run_on_a_real_redis_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each snippet of docs/distributed.md runs alone against a fresh redis-server; the one
    that needs Ray runs in the Ray step (tests/frameworks/test_ray)."""
    from redis_support import RedisProcess, need_redis_server

    need_redis_server()
    ran = 0
    for i, block in enumerate(python_blocks("docs/distributed.md"), 1):
        if "import ray" in block:
            continue
        server = RedisProcess(tmp_path / f"block{i}").start()
        monkeypatch.setenv("REDIS_URL", server.url)
        try:
            run_alone(block, f"docs/distributed.md block {i}")
        finally:
            server.stop()
        ran += 1
    assert ran >= 2


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_voice_call_example_runs(backend: str) -> None:
    proc = run_example("voice_call", backend)
    out = proc.stdout
    order = [
        "== call 1",
        "model is told: Ask for the day, the time and how many people.",
        "voice timing: {'reprompt_after_ms': 6000, 'end_of_speech_ms': 700}",
        'caller: "Is there parking?"',
        "digression: parking",
        "model is told: Answer: there is free parking behind the building.",
        'transcript: "Saturday at 7 pm for four people, card [card ending 1111]."',
        "model is told: Tell the caller you are checking the book.",
        "voice timing: {'filler_after_ms': 1500}",
        "flow moved on meanwhile: active ['confirm']",
        'caller: "Sorry, do you have high chairs?"',
        "model is told: Read the booking back and ask the caller to confirm.",
        "model is told: Booking: Saturday at 19:00 for 4.",
        "model is told: Result of availability (tell the caller now): open: yes.",
        'caller: "Yes, that\'s right."',
        "model is told: Book the table now.",
        "model calls book_table: it runs",
        "model calls book_table: refused: 'book_table' has already run",
        "== call 2",
        "digression: cancel",
        "model is told: Say goodbye; nothing was booked.",
        "model is told: Tools you may call now: none.",
        "model calls book_table: refused: The conversation has ended: digression 'cancel' "
        "terminated it.",
    ]
    assert_in_order(out, order)
    assert "4111 1111 1111 1111" not in out.split('caller: "Saturday', 1)[1].split("\n", 1)[1]
    # The check's answer, once: in the reply to what the caller said over the agent.
    assert out.count("Result of availability") == 1
    assert ">> spoken at once" not in out


def test_voice_call_example_in_process() -> None:
    """The example's calls, run in this process: what each call left in the State."""
    voice_call = example_module("voice_call")
    lines: list[str] = []
    booked, cancelled = anyio.run(voice_call.main, lines.append)
    assert booked.get("flow:booking:complete") is True
    assert booked.pick("booking:date", "booking:time", "booking:party_size") == {
        "booking:date": "Saturday",
        "booking:time": "19:00",
        "booking:party_size": 4,
    }
    assert booked.provenance("booking:party_size").source == "extraction"
    assert booked.get("flow:overlay") is None
    assert booked.get("flow:terminated") is False
    assert cancelled.get("flow:terminated") is True
    assert cancelled.get("flow:booking:complete") is False
    assert booked.keys("turn:") == []


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_verification_panel_example_runs(backend: str) -> None:
    proc = run_example("verification_panel", backend)
    out = proc.stdout
    order = [
        "== with a budget of 3,000 tokens",
        "the judge wants: mentions the time, is polite, cites the booking system",
        "the judge wants: is polite, cites the booking system",
        "the judge wants: cites the booking system",
        "approved",
        "tokens: 2210 of 3000; exhausted: False",
        "== with a budget of 600 tokens",
        "the budget ran out: the panel stops",
        "tokens: 710 of 600; exhausted: True",
        "budget_exhausted",
    ]
    assert_in_order(out, order)


def test_verification_panel_example_in_process() -> None:
    verification_panel = example_module("verification_panel")
    lines: list[str] = []
    draft, approved, state = anyio.run(
        verification_panel.verify, "Your booking is confirmed.", 3000, lines.append
    )
    assert approved
    assert "19:30" in draft
    assert state.get("j3:result") == {"approved": True, "missing": []}
    assert state.provenance("r0_facts:result").writer == "facts"
    assert anyio.run(verification_panel.main, lines.append) == (True, False)


def test_durable_demo_drops_the_call_and_resumes_it(tmp_path: Path) -> None:
    """``demo --db``: the first run drops with the lookup in flight, the second resumes the
    flow where it was (the lookup runs again, the booking once), the third finds it done."""
    from slateflow.demo_durable import run_durable_demo

    path = tmp_path / "call.db"
    outs: list[list[str]] = []
    for _ in range(3):
        lines: list[str] = []
        state = anyio.run(run_durable_demo, path, lines.append)
        outs.append(lines)
    first, second, third = ("\n".join(lines) for lines in outs)
    assert_in_order(
        first,
        [
            "A new call, recorded in",
            ">> step 'check' entered",
            "model calls book_table: refused",
            "the line drops here, with availability 'running'",
        ],
    )
    assert 'caller: "Yes, that is right."' not in first
    assert_in_order(
        second,
        [
            "Recovered",
            "3 of 7 beats of the call heard; flow 'booking' done ['slot'], active ['check']",
            "availability:status = 'cancelled' (session closed)",
            "the flow resumed at ['check']; done: ['slot']",
            "the lookup that did not finish runs again (at-least-once)",
            ">> step 'offer' entered",
            'caller: "Yes, that is right."',
            "model calls book_table: admitted, it runs",
            "complete: True; booked Saturday at 19:30; book_table ran 1 time(s)",
        ],
    )
    # Nothing heard before the drop is heard again, and the slot step is not re-entered.
    assert "Hello, I'd like a table." not in second
    assert ">> step 'slot'" not in second
    assert "is complete; nothing to resume" in third
    assert "book_table ran 1 time(s)" in third
    assert state.get("booking:time") == "19:30"


def test_cli_demo_with_a_database_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "call.db")
    assert main(["demo", "--db", path]) == 0
    assert "Run the same command again to resume the call." in capsys.readouterr().out
    assert main(["demo", "--db", path]) == 0
    assert "book_table ran 1 time(s)" in capsys.readouterr().out
    assert main(["replay", path, "--key", "booking:confirmed"]) == 0
    assert "booking:confirmed  (new) -> true" in capsys.readouterr().out
