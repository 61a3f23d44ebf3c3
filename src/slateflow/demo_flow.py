"""The demo's second part: the booking call as a Flow, driven by a short simulated conversation.

Each step advances when its guard holds, whoever wrote the keys: the slot-filler, the
availability lookup finishing in the background, the booking tool. The narrative shows what the
model is told each turn and how its tool calls are admitted or refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .conversation import (
    Conversation,
    Extract,
    Extractor,
    TurnContext,
    datetime,
    integer_near,
    overwrite,
    true_only,
    yes_no,
)
from .flow import (
    Flow,
    FlowRunner,
    Step,
    any_,
    called_ok,
    captured,
    commit,
    edge,
    eq,
    failed,
    is_true,
    require,
    resolved,
    run,
    signals,
)
from .resolve import ManualClock, Mode, Resolver, Session
from .state import State

__all__ = ["Narrator", "availability", "booking_flow", "extractors", "run_flow_demo"]

Out = Callable[[str], object]


def booking_flow(lookup: Resolver, *, mode: Mode = "background") -> Flow:
    """Collect a slot, check availability (in the background unless ``mode`` says otherwise),
    confirm or offer another time, commit the booking once."""
    return Flow(
        "booking",
        [
            Step(
                "slot",
                done=captured("booking:date", "booking:time"),
                posture="Ask which day and time suit the caller.",
                ground="Known: date {booking:date?not yet}, time {booking:time?not yet}.",
            ),
            Step(
                "check",
                after=["slot"],
                done=any_(resolved("availability"), failed("availability")),
                on_enter=run(lookup, mode),
                posture="Tell the caller you are checking the book.",
            ),
            Step(
                "offer",
                after=[edge("check", when=eq("availability:result.open", False))],
                done=is_true("booking:alternative_accepted"),
                posture="That time is taken: offer the alternative.",
                ground="Free instead: {availability:result.alternative}.",
            ),
            Step(
                "confirm",
                after=[edge("check", when=eq("availability:result.open", True)), "offer"],
                join="any",
                done=is_true("booking:confirmed"),
                posture="Read the booking back and ask the caller to confirm.",
                ground="Booking: {booking:date} at {booking:time} for {booking:party_size}.",
            ),
            Step("book", after=["confirm"], done=called_ok("book_table"), allow=["book_table"]),
            Step(
                "sorry",
                after=[edge("check", when=failed("availability"))],
                done=called_ok("transfer_to_human"),
                allow=["transfer_to_human"],
                posture="Apologise and offer a transfer to a person.",
            ),
            Step("goodbye", after=["book"], terminal=True, posture="Thank the caller."),
        ],
        constraints=[commit("book_table", until=is_true("booking:confirmed")), require("book")],
        ambient=["transfer_to_human"],
    )


def extractors(clock: ManualClock) -> tuple[Extractor, Extractor]:
    """What the caller's words fill in: the slot, and the answers to the step's question."""
    when = datetime(clock)

    def step_is(step: str) -> Callable[[Any, State], bool]:
        def active(value: Any, state: State) -> bool:
            return step in (state.get("flow:booking:active") or [])

        active.__name__ = f"step {step!r} is active"
        return active

    slots = (
        Extract("slots")
        .field_to("date", "booking:date", when.pick("weekday").map(str.capitalize))
        .field_to("time", "booking:time", when.pick("time"), overwrite())
        .field_to("party_size", "booking:party_size", integer_near(["people", "us", "party"]))
        .build()
    )
    answers = (
        Extract("answers")
        .field_to(
            "alternative",
            "booking:alternative_accepted",
            yes_no(),
            true_only().accept_when(step_is("offer")),
        )
        .field_to(
            "confirmed", "booking:confirmed", yes_no(), true_only().accept_when(step_is("confirm"))
        )
        .build()
    )
    return slots, answers


class Narrator:
    """Says what happens in the booking call: the caller's turns, the model's tool calls, what
    the model is told, and the flow's steps as they are entered and done. ``verbose=False``
    says it in a screenful: one line a turn, a tool call or a step change."""

    def __init__(self, out: Out, slots: Extractor, answers: Extractor, verbose: bool) -> None:
        self.out = out
        self.extractors = (slots, answers)
        self.verbose = verbose
        self._moves: list[str] = []

    def entered(self, runner: FlowRunner, flow: str, step: str) -> None:
        if self.verbose:
            self.out(f"  >> step '{step}' entered")
        else:
            self._moves.append(f"{step} entered")

    def finished(self, runner: FlowRunner, flow: str, step: str) -> None:
        if self.verbose:
            self.out(f"  >> step '{step}' done")
        else:
            self._moves.append(f"{step} done")

    def moves(self) -> None:
        """Say the step changes since the last time, on one line (the short narration)."""
        if self._moves:
            self.out("     >> " + ", ".join(self._moves))
            self._moves.clear()

    async def wait(self, clock: ManualClock, seconds: float, what: str) -> None:
        """Let ``seconds`` of the demo's clock pass while ``what`` runs, showing it wait."""
        ticks = 4
        shown = ""
        for i in range(1, ticks + 1):
            await clock.advance(seconds / ticks)
            shown = (
                f"  waiting for {what} "
                + "#" * i
                + "." * (ticks - i)
                + f" {seconds * i / ticks:.1f} s"
            )
            if self.live:
                print("\r" + shown, end="", flush=True)
        if self.live:
            print("\r" + " " * len(shown) + "\r", end="", flush=True)
        self.out(f"  waited for {what}: it answered after {seconds:g} s, in the background")

    @property
    def live(self) -> bool:
        """Whether the wait can be drawn in place (the narration goes to a terminal)."""
        import sys

        return self.out is print and sys.stdout.isatty()

    def follow(self, runner: FlowRunner) -> None:
        """Narrate ``runner``'s steps (until :meth:`unfollow`)."""
        signals.step_entered.connect(self.entered, sender=runner)
        signals.step_done.connect(self.finished, sender=runner)

    def unfollow(self, runner: FlowRunner) -> None:
        signals.step_entered.disconnect(self.entered, sender=runner)
        signals.step_done.disconnect(self.finished, sender=runner)

    def model_told(self, context: TurnContext) -> None:
        for line in context.lines:
            self.out(f"     the model is told: {line}")
        if not context.lines:
            self.out("     (nothing new to tell the model)")

    async def run_tool(self, conversation: Conversation, tool: str) -> None:
        # A claim admits the call atomically (a concurrent call of a once-only tool waits) and
        # reports the tool as done when the block ends.
        async with conversation.claim(tool) as claim:
            if claim:
                self.out(f"  model calls {tool}: admitted, it runs")
            elif self.verbose:
                self.out(f"  model calls {tool}: refused")
                self.out(f"     {claim.reason}")
            else:
                reason = claim.reason.split(". ")[0]
                self.out(f"  model calls {tool}: refused, {_cut(reason, 60)}")
        if not self.verbose:
            self.moves()

    async def hear(self, conversation: Conversation, said: str) -> None:
        # What a voice loop does each turn: one call redacts, extracts, advances the flow and
        # says what the model should be told now.
        out = self.out
        assert conversation.redact is not None
        redacted = conversation.redact(said)
        if not self.verbose:
            out(f'  caller: "{_cut(redacted, 88)}"')
            context = await conversation.user_turn(said)
            written = [
                f"{d.key.split(':')[-1]}={d.value!r}"
                for extractor in self.extractors
                for d in extractor.history[-1].decisions
                if d.written
            ]
            if written:
                out("     heard: " + _cut(", ".join(written), 80))
            self.moves()
            if context.lines:
                out(f"     model is told: {_cut(context.lines[0], 76)}")
            return
        out(f'  caller: "{said}"')
        out(f'     transcript (redacted): "{redacted}"')
        context = await conversation.user_turn(said)
        for extractor in self.extractors:
            for d in extractor.history[-1].decisions:
                verdict = "written" if d.written else "not written"
                out(f"     {extractor.name}: {d.key} = {d.value!r} {verdict} ({d.reason})")
        self.model_told(context)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


TOOLS = ["book_table", "transfer_to_human"]


def demo_booking() -> Flow:
    """The demo's booking flow, as a function of no arguments for the command line:
    ``slateflow draw slateflow.demo_flow:demo_booking``, ``slateflow timeline demo.db --flow
    slateflow.demo_flow:demo_booking``."""
    return booking_flow(availability(ManualClock()))


def availability(clock: ManualClock) -> Resolver:
    """The booking system: answers after 0.4 s of the demo's clock; 19:00 is taken."""

    async def check_book(state: State) -> dict[str, Any]:
        await clock.sleep(0.4)  # the booking system's latency, on the demo's clock
        if state["booking:time"] == "19:00":
            return {"open": False, "alternative": "19:30"}
        return {"open": True}

    return Resolver.fetch("availability", check_book, reads=["booking:time"])


async def run_flow_demo(out: Out, clock: ManualClock, *, verbose: bool = True) -> State:
    """Narrate the booking flow over a fresh State (``verbose=False``: in a screenful);
    returns it."""
    state = State(clock=clock)
    flow = booking_flow(availability(clock)).compile(tools=TOOLS)
    if verbose:
        out("  the plan, as Mermaid (flow.to_mermaid()):")
        for line in flow.to_mermaid().splitlines():
            out(f"    {line}")
    else:
        out("  the plan: slot -> check -> offer (if taken) -> confirm -> book -> goodbye")
        out("  (draw it: slateflow draw slateflow.demo_flow:demo_booking --format html)")

    slots, answers = extractors(clock)
    say = Narrator(out, slots, answers, verbose)
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, tools=TOOLS)  # the call over the session
        conversation.add_extractor(slots)
        conversation.add_extractor(answers)
        runner = conversation.run_flow(flow)
        say.follow(runner)
        try:
            out(f"  active: {runner.active_steps}")
            await say.hear(conversation, "Hello, I'd like a table.")
            await say.hear(
                conversation, "Saturday at 7 pm, for four people. My card is 4111 1111 1111 1111."
            )
            await say.run_tool(conversation, "book_table")
            if verbose:
                out("  (0.4 s later the booking system answers, in the background)")
                await clock.advance(0.4)
            else:
                await say.wait(clock, 0.4, "availability")
            await runner.wait_for_step("offer")
            if verbose:
                out("  the model is idle, so it is told now (conversation.context_now()):")
                say.model_told(conversation.context_now())
            else:
                say.moves()
                told = conversation.context_now().lines
                out(f"     model is told now: {_cut(told[0], 72)}" if told else "")
            await say.hear(conversation, "Yes, 7:30 pm works for us.")
            await say.hear(conversation, "Yes, that is right.")
            await say.run_tool(conversation, "book_table")
            await say.run_tool(conversation, "book_table")
            out(
                f"  complete: {runner.is_complete}; flow:booking:done = "
                f"{state.get('flow:booking:done')}"
            )
            prov = state.provenance("flow:booking:done")
            assert prov is not None
            out(f"  written by source {prov.source!r}, writer {prov.writer!r}")
        finally:
            say.unfollow(runner)
    return state
