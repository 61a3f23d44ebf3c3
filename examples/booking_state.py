"""A booking call that does not block on slow work: ``python examples/booking_state.py``.

The agent starts a (fake) availability lookup in the background and keeps talking. The lookup
writes ``availability:result`` on success or ``availability:error`` on failure, with provenance.
The conversation waits on the *state* (whichever key appears first), not on the task, so it
works the same whoever runs the lookup: a task, a thread, or later a worker in another process.

Uses only the public API and anyio (asyncio by default; pass ``--trio`` to run it on trio).
"""

from __future__ import annotations

import sys
from typing import Any

import anyio

from slateflow import (
    PolicyViolation,
    State,
    error_key,
    result_key,
    status_key,
    when,
)

NAME = "availability"


async def lookup_availability(state: State, date: str, fail: bool) -> None:
    """A stand-in fetch resolver: writes its status, then its result or its error."""
    prov: dict[str, Any] = {"source": "fetch", "writer": NAME}
    state.set(status_key(NAME), "running", **prov)
    await anyio.sleep(0.05)  # the network round trip
    if fail:
        state.update(
            {error_key(NAME): f"booking service timed out for {date}", status_key(NAME): "failed"},
            **prov,
        )
    else:
        state.update(
            {result_key(NAME): ["19:00", "19:30", "20:15"], status_key(NAME): "done"},
            **prov,
            meta={"date": date},
        )


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
    async with anyio.create_task_group() as tg:
        tg.start_soon(lookup_availability, state, state.get("booking:date"), fail)
        print('  agent: "Let me check Saturday for you."')

        # Something else tries to fill in the answer: refused, nothing written.
        try:
            state.set(result_key(NAME), ["23:00"], source="llm", writer="guesser")
        except PolicyViolation as exc:
            print(f"  refused: {exc}")

        key, value = await state.wait_until(outcome, pattern=f"{NAME}:*", timeout=5)

    prov = state.provenance(key)
    assert prov is not None
    print(f"  {key} = {value!r}  (source {prov.source!r}, writer {prov.writer!r})")
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
