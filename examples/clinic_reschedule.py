"""Reschedule a dental appointment by phone: ``python examples/clinic_reschedule.py`` (``--trio``).

The caller gives their name and date of birth; a lookup finds the appointment; free slots are
offered and the caller picks one; the new time is read back and confirmed; the change is made
once. An insurance question can come at any time. A patient not found twice is handed to a
person. The date of birth is read on the secret path: it reaches the lookup, never the
transcript or the model. Nothing here is a hand-written recognizer or watcher: the retries are
data (a reset that clears the answers, "failed twice"), the picks are ``choice()``.

Two calls run: one that finds the patient at the second try and moves the appointment, one
that misses twice and is handed over. A manual clock stands in for time.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio

from slateflow import (
    Conversation,
    Flow,
    ManualClock,
    Resolver,
    Session,
    State,
    Step,
    active,
    called_ok,
    captured,
    commit,
    eq,
    failed,
    is_true,
    reset,
    resolved,
    run,
    told,
)
from slateflow.conversation import (
    Extract,
    choice,
    date_of_birth,
    overwrite,
    regex,
    yes_no,
)

PATIENTS = {("ann lee", "1985-03-03"): {"patient": "P-17", "appointment": "Thursday 10:00"}}
FREE = [
    {"date": "2025-06-17", "time": "09:00"},
    {"date": "2025-06-17", "time": "15:15"},
    {"date": "2025-06-19", "time": "11:30"},
]
TOOLS = ["reschedule", "insurance_faq", "transfer_to_person"]


def clinic(clock: ManualClock) -> tuple[Resolver, Resolver]:
    """The practice system: finds a patient (0.3 s), lists free slots (0.2 s)."""

    async def find(state: State) -> dict[str, Any]:
        await clock.sleep(0.3)
        who = (str(state["patient:name"]).lower(), state["patient:dob"])
        if who not in PATIENTS:
            raise LookupError("no patient with that name and date of birth")
        return PATIENTS[who]

    async def slots(state: State) -> list[dict[str, str]]:
        await clock.sleep(0.2)
        return FREE

    return (
        Resolver.fetch("find_patient", find, reads=["patient:name", "patient:dob"]),
        Resolver.fetch("slots", slots),
    )


def reschedule_flow(find: Resolver, slots: Resolver) -> Flow:
    """The plan of the call."""
    return Flow(
        "reschedule",
        [
            Step("identify", done=captured("patient:name", "patient:dob"),
                 posture="Ask for the caller's full name and date of birth.",
                 summary="confirm who is calling"),
            Step("lookup", after=["identify"], on_enter=run(find, "dispatch"),
                 done=resolved("find_patient"), posture="Say you are finding their record."),
            Step("offer", after=["lookup"], on_enter=run(slots, "dispatch"),
                 done=captured("pick:slot"), posture="Offer the free slots; ask which suits.",
                 ground="Free slots: {slots:result}."),
            Step("read_back", after=["offer"], done=is_true("confirm:yes"),
                 posture="Read the new time back and ask the caller to confirm.",
                 ground="New time: {pick:slot.date} at {pick:slot.time}."),
            Step("move", after=["read_back"], done=called_ok("reschedule"),
                 allow=["reschedule"], posture="Move the appointment now.",
                 summary="move the appointment"),
            Step("goodbye", after=["move"], terminal=True, posture="Confirm and say goodbye."),
            Step("handoff", gate=failed("find_patient", times=2), ends=True,
                 done=called_ok("transfer_to_person"), allow=["transfer_to_person"],
                 posture="Apologise and transfer the caller to a person."),
        ],
        constraints=[
            reset("identify", clear=["patient:*"]).when(failed("find_patient")),
            reset("offer", clear=["pick:slot", "confirm:yes"]).when(eq("confirm:yes", False)),
            commit("reschedule", until=is_true("confirm:yes")),
        ],
        ambient=["insurance_faq"],
    )  # fmt: skip


def listeners(clock: ManualClock) -> list[Any]:
    """What the agent reads from the caller's words."""
    identity = (
        Extract("patient")
        .field("name", regex(r"(?:this is|i'm|it's|name is)\s+([a-z]+ [a-z]+)", group=1))
        .field("dob", date_of_birth(clock.time), secret=True)
        .build()
    )
    pick = Extract("pick").field(
        "slot", choice("slots:result", now=clock.time), overwrite().accept_when(active("offer"))
    )
    # A yes counts once the read-back was said: told(), not active() (the pick said in the
    # same turn makes read_back active before the caller heard it).
    confirm = Extract("confirm").field("yes", yes_no(), overwrite().accept_when(told("read_back")))
    return [identity, pick.build(), confirm.build()]


async def call(words: list[str], say: Any = print) -> State:
    """One call: the caller says ``words``, one turn each; the model's tool calls follow."""
    clock = ManualClock(start=1_749_636_000)  # Wednesday 11 June 2025, 10:00 UTC
    state = State(clock=clock)
    async with Session(state, clock=clock) as session:
        conversation = Conversation(session, tools=TOOLS)
        for listener in listeners(clock):
            conversation.add_extractor(listener)
        runner = conversation.run_flow(reschedule_flow(*clinic(clock)))
        for said in words:
            say(f'caller: "{said}"')
            context = await conversation.user_turn(said)
            say(f"  transcript: {conversation.transcript[-1].text}")
            for line in context.lines:
                say(f"    model is told: {line}")
            if "insurance" in said:
                await model_calls(conversation, "insurance_faq", say)
            await act(runner.active_steps, conversation, say)
            await clock.advance(0.5)  # the caller listens; lookups land meanwhile
            for line in conversation.context_now().lines:  # what is new between turns
                say(f"    then the model is told: {line}")
            await act(runner.active_steps, conversation, say)
        say(f"  done: {', '.join(runner.done_steps)}; over: {runner.is_complete}")
    return state


async def act(active: list[str], conversation: Conversation, say: Any) -> None:
    """The model's tool calls for the steps active now."""
    if active == ["move"]:  # the model calls the tool twice at once: it runs once
        heard: list[str] = []
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(model_calls, conversation, "reschedule", heard.append)
        for line in sorted(heard, key=lambda line: "refused" in line):  # the one that ran first
            say(line)
    elif active == ["handoff"]:
        await model_calls(conversation, "transfer_to_person", say)


async def model_calls(conversation: Conversation, tool: str, say: Any) -> None:
    """The model calls ``tool``; it runs at most as the flow admits."""

    async def work() -> str:
        return {"reschedule": "moved", "insurance_faq": "covered"}.get(tool, "transferring")

    result = await conversation.run_tool(tool, work)
    say(f"  model calls {tool}: {result.value if result.allowed else 'refused: ' + result.reason}")


async def main(say: Any = print) -> tuple[State, State]:
    """Both calls, narrated."""
    say("== call 1: found at the second try, moved once")
    moved = await call(
        [
            "Hi, I need to move my dental appointment. This is Ann Lee, born March 3rd, 1958.",
            "Sorry, my mistake. It's Ann Lee, March 3rd, nineteen eighty-five.",
            "Is a check-up covered by my insurance?",
            "The first one. No wait, the second.",
            "Yeah, no, that's fine.",
        ],
        say,
    )
    say("== call 2: not found twice, handed to a person")
    handed = await call(["This is Bob Ray, born 4/4/1970.", "I'm Bob Ray, April 4th, 1971."], say)
    return moved, handed


if __name__ == "__main__":
    anyio.run(main, backend="trio" if "--trio" in sys.argv else "asyncio")
