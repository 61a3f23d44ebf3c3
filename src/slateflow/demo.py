"""A narrated voice-agent call on the State: ``python -m slateflow demo``.

A caller books a table. Several writers share one State: the caller (``user``), a slot-filling
extractor (``extraction``, with confidence), a fetch resolver (``availability``) running in the
background of a Session while the conversation goes on, and the agent. A subscriber logs every
committed batch, a watcher announces when availability resolves, the model is handed the
background result, a bad write is refused with a typed error, the booking commits in a
transaction and a card number stays masked wherever the state is shown. Finally the same call
runs as a Flow (``demo_flow``): a conversation plan whose steps advance as the facts arrive.

The output is deterministic: the State gets a ticking clock, the Session a manual one (the
booking system's latency passes when the demo advances it), and the one thread the demo starts
(a caller's correction arriving mid-transaction) is joined before the demo goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio

from .conversation import Extract, end_turn, integer_near
from .conversation import datetime as when_said
from .demo_flow import run_flow_demo
from .errors import SlateError, VersionConflictError
from .resolve import BackgroundResult, ManualClock, Resolver, Scheduling, Session
from .state import Change, State, result_key, source_of, when

__all__ = ["TickingClock", "run"]

Out = Callable[[str], object]

START = datetime(2025, 6, 13, 18, 0, 0, tzinfo=UTC)


class TickingClock:
    """A ``time.time``-like clock that moves on by ``step`` seconds each time it is read.

    The State reads its clock once per committed batch, so every commit gets a distinct,
    reproducible timestamp. (It ticks by itself; it is not a test clock that waits to be
    advanced.)
    """

    def __init__(self, start: datetime = START, step: float = 1.0) -> None:
        self.now = start.timestamp()
        self.step = step

    def __call__(self) -> float:
        now = self.now
        self.now += self.step
        return now


def _who(change: Change) -> str:
    prov = change.provenance
    who = prov.source + (f"/{prov.writer}" if prov.writer else "")
    if prov.confidence is not None:
        who += f", confidence {prov.confidence:g}"
    return who


def _heading(out: Out, title: str) -> None:
    out("")
    out(title)
    out("-" * len(title))


def run(out: Out = print, *, verbose: bool = False) -> State:
    """Run the demo, writing its narrative line by line to ``out``: the call as a flow in a
    screenful, and with ``verbose`` that flow told in full, then the State's journal of
    another call (subscribers, provenance, refused writes, a transaction, secrets). Returns
    the last State."""
    return anyio.run(_run, out, verbose)


async def _run(out: Out, verbose: bool = False) -> State:
    if not verbose:
        out("slateflow demo: a voice agent books a table, its plan a Flow")
        out("=" * 60)
        state = await run_flow_demo(out, ManualClock(start=START.timestamp()), verbose=False)
        out("")
        out("python -m slateflow demo --verbose: the same call told in full, then the State's")
        out("journal (provenance, refused writes, a transaction, masked secrets).")
        return state
    return await _journal(out)


async def _journal(out: Out) -> State:
    state = State(clock=TickingClock())
    avail = "availability"

    # Governance first: only the availability resolver writes its keys, card numbers are
    # secret, and the party size must be an int (a schema on one key).
    state.policy("availability:*", writers=[avail])
    state.policy("user:card", secret=True)
    state.declare("booking:party_size", int)

    def log_batch(changes: tuple[Change, ...]) -> None:
        # A subscriber: called once per committed batch, with that batch's changes.
        for c in changes:
            what = "removed" if c.removed else f"= {c.to_dict()['new']!r}"
            out(f"  [seq {c.seq} {c.at:%H:%M:%S}] {c.key} {what}  ({_who(c)}, v{c.version})")

    def announce(change: Change) -> None:
        # A watcher: fires once, when the availability result first appears.
        slots = ", ".join(change.new)
        out(f'  >> agent: "Good news, on Saturday I have {slots}. Which suits you?"')

    state.subscribe(log_batch)
    state.watch(result_key(avail), when.became_true(), announce)

    out("slateflow demo: a voice agent books a table")
    out("===========================================")
    _heading(out, "The call as a Flow: steps advance when their guards hold")
    await run_flow_demo(out, ManualClock(start=START.timestamp()))
    _heading(out, "The State underneath: every write journaled, governed, with provenance")
    out("Every line starting with [seq N] is printed by one subscriber, once per committed batch.")

    _heading(out, "1. The caller speaks; the extractor fills slots")
    state.set("session:caller", "+44 20 7946 0018", source="system", writer="telephony")
    said = "Hi, a table for four on Saturday please"
    state.set("turn:transcript", said, source="user", writer="asr")
    # The extractor reads the slots from the words (dates relative to the call's clock).
    slot_filler = (
        Extract("slot_filler")
        .field_to("party_size", "booking:party_size", integer_near(["table", "people"]))
        .field_to("date", "booking:date", when_said(lambda: START.timestamp()).pick("date"))
        .build()
    )
    slot_filler.extract(state, said)

    _heading(out, "2. Availability is looked up in the background (the agent keeps talking)")
    clock = ManualClock(start=START.timestamp())

    async def check_tables(state: State) -> list[str]:
        # The booking system answers after 400 ms (of the session's clock).
        await clock.sleep(0.4)
        return ["19:00", "19:30", "20:15"]

    def tell_the_model(result: BackgroundResult) -> None:
        out(f"  the model is handed ({result.scheduling.value}): {result.response}")

    lookup = Resolver.fetch(
        avail, check_tables, reads=["booking:date", "booking:party_size"], timeout=5.0
    )
    async with Session(state, clock=clock) as session:
        ack = session.background(lookup, tell_the_model, scheduling=Scheduling.WHEN_IDLE)
        out(f"  the model is told at once: {ack}")
        out('  agent: "Let me check what we have on Saturday."')
        state.set("turn:transcript", "Is there parking nearby?", source="user", writer="asr")
        out('  agent: "Yes, there is a car park on the next street."')
        await clock.advance(0.4)

    _heading(out, "3. Provenance: who wrote what")
    prov = state.provenance(result_key(avail))
    assert prov is not None
    out(f"  state.provenance('availability:result').source = {prov.source!r}")
    out(f"  ... writer = {prov.writer!r}, at = {prov.at.isoformat()}, meta = {prov.meta}")
    out(f"  source_of(state, 'booking:date') = {source_of(state, 'booking:date')!r}")
    meta = state.get("state_meta:booking:party_size")
    out(f"  state.get('state_meta:booking:party_size') = {meta}")

    _heading(out, "4. Bad writes are refused with a typed error, and nothing changes")
    before = state.journal.cursor
    bad_writes: list[tuple[str, Callable[[], object]]] = [
        (
            "an LLM tries to overwrite availability:result",
            lambda: state.set(result_key(avail), ["23:00"], source="llm", writer="summariser"),
        ),
        (
            "a deposit computed as NaN",
            lambda: state.set("booking:deposit", float("nan"), source="tool", writer="pricing"),
        ),
        (
            "a party size that is not an int",
            lambda: state.set("booking:party_size", "four-ish", source="llm", writer="summariser"),
        ),
    ]
    for label, write in bad_writes:
        try:
            write()
        except SlateError as exc:
            first, *details = str(exc).splitlines()
            out(f"  {label}:")
            out(f"    {type(exc).__name__}: {first}")
            # A SchemaError adds pydantic's explanation; skip its link to the pydantic docs.
            for line in details:
                if "errors.pydantic.dev" not in line:
                    out(f"      {line.strip()}")
    out(
        f"  cursor before {before}, after {state.journal.cursor}; availability:result is still "
        f"{state.get(result_key(avail))}"
    )

    _heading(out, "5. The booking commits atomically (after one conflict)")
    state.set("turn:transcript", "Half past seven, please", source="user", writer="asr")

    def book(attempt: int) -> None:
        with state.transaction():
            slots: list[str] = state[result_key(avail)]
            party = state["booking:party_size"]
            if attempt == 1:
                # The caller corrects themselves while the agent is booking; the ASR thread
                # writes directly to the state (it is not inside this transaction).
                out('  (meanwhile, on the ASR thread: "actually, make that five of us")')
                correction = threading.Thread(
                    target=state.set,
                    args=("booking:party_size", 5),
                    kwargs={"source": "extraction", "writer": "slot_filler", "confidence": 0.97},
                )
                correction.start()
                correction.join()
            state.update(
                {
                    "booking:time": slots[1],
                    "booking:status": "confirmed",
                    "session:stage": "wrap-up",
                },
                source="agent",
                writer="booker",
                meta={"party_size": party},
            )

    for attempt in (1, 2):
        try:
            book(attempt)
        except VersionConflictError as exc:
            out(f"  attempt {attempt} rolled back: {exc}")
            out(f"  booking:status is still {state.get('booking:status')!r}")
        else:
            out(
                f"  attempt {attempt} committed: one batch, one signal "
                f"(party of {state.get('booking:party_size')} at {state.get('booking:time')})"
            )
            break

    _heading(out, "6. A secret stays masked wherever the state is shown")
    state.set("user:card", "4929 1234 5678 9012", source="user", writer="asr")
    out("  state.describe():")
    for line in state.describe().splitlines():
        out(f"    {line}")
    card: Any = state.get("user:card")
    out(f"  code that asks gets the real value: state.get('user:card')[-4:] = {card[-4:]!r}")
    snap = state.snapshot(redact=True)
    out(
        f"  snapshot(redact=True)['entries']['user:card']['value'] = "
        f"{snap['entries']['user:card']['value']!r}"
    )

    _heading(out, "7. End of turn")
    cleared = end_turn(state)
    out(
        f"  end_turn(state) cleared {cleared} key(s); {len(state)} keys remain, cursor "
        f"{state.journal.cursor}, {len(state.journal.since(0))} changes in the journal"
    )
    return state
