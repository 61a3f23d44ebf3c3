"""The route of a user turn and of a background result through slateflow's modules.

Run: ``python bench/route_bench.py`` (``--quick`` is accepted and changes nothing: the trace is
one turn); ``--show`` prints the modules in the order the turn calls into them.

The scenario: a two-step flow, ``ask`` (done once the caller's name is known) then ``lookup``,
whose ``on_enter`` starts a background lookup. A first turn is taken; then the name is written
(as an extractor would), the lookup runs and its result waits in the conversation's inbox; then
the next ``user_turn`` is traced: the turn is recorded, the flow advances, and the context hands
the waiting result to the model. The scenario runs once untraced first, so caches are warm. It
runs on the real clock, as in production (``--manual`` runs it on a ManualClock, whose settling
inside a turn the trace counts too).

``sys.setprofile`` records each call of a slateflow function, in the order they happen (frames of
other packages are left out; resuming a coroutine counts as a call, as the profiler reports it).
From the sequence of the modules called:

- calls: how many slateflow calls the turn makes;
- module hops: how often the next call is in another module than the one before;
- A->B->A returns: hops that come straight back to the module before (A, then B, then A again);
- modules: the distinct modules the turn runs code in.

The background route is traced from the session delivering an ended run's outcome (its
scheduler makes the ``BackgroundResult`` and hands it to the ``deliver`` callback) to the
result entering the conversation's inbox: the modules its calls pass through, in order.
"""

from __future__ import annotations

import argparse
import sys
from types import FrameType
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
    is_set,
    is_true,
    run,
)
from slateflow.resolve import SystemClock

PACKAGE = "slateflow"


def _module(frame: FrameType) -> str | None:
    name = str(frame.f_globals.get("__name__", ""))
    return name if name == PACKAGE or name.startswith(PACKAGE + ".") else None


async def _lookup(state: State) -> dict[str, str]:
    return {"account": "A-1"}


def flow() -> Flow:
    return Flow(
        "route",
        [
            Step("ask", done=is_set("caller:name"), posture="Ask for the caller's name."),
            Step(
                "lookup",
                after=["ask"],
                done=is_true("caller:found"),
                posture="Tell the caller what the lookup found.",
                on_enter=run(Resolver.fetch("lookup", _lookup), "background"),
            ),
        ],
    )


def figures(modules: list[str]) -> dict[str, int]:
    """Calls, module hops, A->B->A returns and distinct modules of a call sequence."""
    runs = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
    return {
        "calls": len(modules),
        "module hops": max(len(runs) - 1, 0),
        "A->B->A returns": sum(1 for i in range(1, len(runs) - 1) if runs[i - 1] == runs[i + 1]),
        "modules": len(set(modules)),
    }


async def one_turn(traced: bool, manual: bool = False) -> list[str]:
    """The modules of every slateflow call one turn makes (none recorded unless ``traced``)."""
    modules: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and (module := _module(frame)) is not None:
            modules.append(module)

    async with Session(State(), clock=ManualClock() if manual else SystemClock()) as session:
        conversation = Conversation(session)
        conversation.run_flow(flow())
        (await conversation.user_turn("hello")).handed_over()
        session.state.set("caller:name", "Ada")
        await session.wait_idle()
        assert [r.name for r in conversation.inbox.peek()] == ["lookup"]
        if traced:
            sys.setprofile(profile)
        try:
            context = await conversation.user_turn("what did you find?")
        finally:
            sys.setprofile(None)
        assert [d.name for d in context.deliveries] == ["lookup"], context
    return modules


async def background_route() -> list[str]:
    """The modules a background result's calls pass through, from its run's end to the inbox."""
    seen: list[str] = []
    started = False

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal started
        module = _module(frame)
        if module is None:
            return
        if event == "call" and frame.f_code.co_qualname == "Scheduler._deliver":
            started = True
        if started and event == "call":
            if not seen or seen[-1] != module:
                seen.append(module)
            if frame.f_code.co_qualname == "Inbox.put":
                started = False

    async with Session(State(), clock=ManualClock()) as session:
        conversation = Conversation(session)
        sys.setprofile(profile)
        try:
            session.background(Resolver.fetch("lookup", _lookup), conversation.deliver)
            await session.wait_idle()
        finally:
            sys.setprofile(None)
        assert conversation.inbox.peek(), "the result did not reach the inbox"
    return seen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="accepted for CI; the same run")
    parser.add_argument("--show", action="store_true", help="print the modules the turn calls")
    parser.add_argument("--manual", action="store_true", help="run the turn on a ManualClock")
    args = parser.parse_args(argv)
    anyio.run(one_turn, False, args.manual)  # warm up
    modules = anyio.run(one_turn, True, args.manual)
    route = anyio.run(background_route)
    if args.show:
        runs = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
        print("\n".join("  " + m.removeprefix("slateflow.") for m in runs))
    print("slateflow routes (one user turn on a two-step flow with a background lookup)")
    print(f"{'measure':<52}{'value':>8}")
    print("-" * 60)
    for name, value in figures(modules).items():
        print(f"{'user_turn: ' + name:<52}{value:>8}")
    print(f"{'background result, run end -> inbox: modules':<52}{len(set(route)):>8}")
    print("  " + " -> ".join(m.removeprefix("slateflow.") for m in route))


if __name__ == "__main__":
    main()
