"""A booking call that does not block on slow work: ``python examples/booking_state.py``.

The agent dispatches an availability lookup and keeps talking; the lookup writes
``availability:result`` on success or ``availability:error`` on failure, with provenance. The
conversation waits on the *state* (whichever key appears first), not on the task, so it works the
same whoever runs the lookup. A sub-agent verifying the caller's address runs in background mode:
the model is told at once that it is running, and its outcome is delivered back with a
scheduling hint when it ends.

Uses only the public API and anyio (asyncio by default; pass ``--trio`` to run it on trio).
"""

from __future__ import annotations

import sys
from typing import Any

import anyio

from slateflow import Resolver, Retry, Scheduling, Session, State
from slateflow.errors import PolicyViolation
from slateflow.resolve import BackgroundResult
from slateflow.state import error_key, result_key, status_key, when

NAME = "availability"


def availability(fail: bool) -> Resolver:
    """A fetch resolver standing in for the booking system's HTTP API."""

    async def fetch(state: State) -> list[str]:
        date = state["booking:date"]
        await anyio.sleep(0.05)  # the network round trip
        if fail:
            raise TimeoutError(f"booking service timed out for {date}")
        return ["19:00", "19:30", "20:15"]

    # One quick retry, then the failure is recorded as the resolver's error.
    return Resolver.fetch(
        NAME, fetch, reads=["booking:date"], timeout=2.0, retry=Retry(attempts=2, backoff=0.01)
    )


class AddressVerifier:
    """A sub-agent (the TextAgent protocol: ``async run(state) -> str``)."""

    async def run(self, state: State) -> str:
        await anyio.sleep(0.02)
        return f"{state['caller:address']} is a valid delivery address"


def outcome(state: State) -> tuple[str, Any] | None:
    """The lookup's terminal outcome, or None while it is still running."""
    picked = state.pick(result_key(NAME), error_key(NAME))
    return next(iter(picked.items()), None)


async def call(fail: bool) -> None:
    state = State()
    # Only the lookup itself may write its keys.
    state.policy(f"{NAME}:*", writers=[NAME])
    state.watch(
        status_key(NAME),
        when.changed_to("running"),
        lambda change: print(f"  (status: {change.new}, written by {change.provenance.writer})"),
    )
    state.set(
        "booking:date", "2025-06-14", source="extraction", writer="slot_filler", confidence=0.9
    )
    state.set("caller:address", "221B Baker Street", source="user", writer="asr")

    def deliver(result: BackgroundResult) -> None:
        print(f"  the model is handed ({result.scheduling.value}): {result.response}")

    async with Session(state) as session:
        session.dispatch(availability(fail))
        ack = session.background(
            Resolver.agent("verify_address", AddressVerifier()), deliver, Scheduling.WHEN_IDLE
        )
        print(f"  the model is told: {ack}")
        print('  agent: "Let me check Saturday for you."')

        # Something else tries to fill in the answer: refused, nothing written.
        try:
            state.set(result_key(NAME), ["23:00"], source="llm", writer="guesser")
        except PolicyViolation as exc:
            print(f"  refused: {exc}")

        key, value = await state.wait_until(outcome, pattern=f"{NAME}:*", timeout=5)
        await session.wait_idle()

    prov = state.provenance(key)
    assert prov is not None
    attempts = prov.meta.get("attempt", prov.meta.get("attempts"))
    print(
        f"  {key} = {value!r}  (source {prov.source!r}, writer {prov.writer!r}, "
        f"mode {prov.meta['mode']!r}, attempts {attempts})"
    )
    if key == result_key(NAME):
        print(f'  agent: "I have {", ".join(value)}. Which would you like?"')
    else:
        print('  agent: "Sorry, I could not reach the booking system. Shall I call you back?"')


async def amain() -> None:
    print("A lookup that succeeds:")
    await call(fail=False)
    print("A lookup that fails (its error is state too):")
    await call(fail=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    anyio.run(amain, backend="trio" if "--trio" in args else "asyncio")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
