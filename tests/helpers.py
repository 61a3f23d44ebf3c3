"""Helpers shared by the test modules."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from slateflow import State


def tagged(value: Any) -> Any:
    """A form of JSON data in which 1, 1.0, True (and 0.0, -0.0) all differ; dicts unordered."""
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, tagged(v)) for k, v in value.items())))
    if isinstance(value, list):
        return ("list", tuple(tagged(v) for v in value))
    if type(value) is float:
        return ("float", repr(value))
    return (type(value).__name__, value)


def fingerprint(state: State) -> tuple[Any, ...]:
    """Everything observable about the state: values, versions, seqs, provenance, key order,
    the cursor and the whole journal (what a refused or rolled-back write must not touch)."""
    return (
        json.dumps(state.snapshot(), allow_nan=False),
        state.keys(),
        len(state),
        state.journal.cursor,
        [m.to_dict(redact=False) for m in state.journal.since(0)],
    )


def committed_view(state: State) -> tuple[dict[str, Any], int, list[Any]]:
    """The committed state (values, versions, provenance), cursor and journal; unlike
    :func:`fingerprint` it reads nothing through an open transaction."""
    return state.snapshot(), state.journal.cursor, state.journal.since(0)


THREADS = 8


def run_threads(target: Callable[[int], Any], n: int = THREADS) -> list[Any]:
    """Run ``target(i)`` in ``n`` threads started together; re-raise the first error."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def main(i: int) -> None:
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=main, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def refusal(conversation: Any, tool: str) -> str | None:
    """Why the conversation's flows refuse ``tool`` now (None when they admit it, as observe
    mode always does): ``conversation.admit(tool, record=False)`` read as a refusal."""
    claim = conversation.admit(tool, record=False)
    return None if claim.allowed else str(claim.reason)
