"""Assertions for tests of flows and resolvers; a failure says why, not only what.

Each raises ``AssertionError`` with the runner's explanation (what each active step waits for,
which tools are refused and why) and the State's recent journal, so a failing test shows why
the flow did not move.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import CursorExpiredError
from ..flow import FlowRunner, Verdict
from ..state import State

__all__ = ["assert_provenance", "assert_resolved", "assert_step", "recent_journal", "why"]

UNSET: Any = object()
"""Marks an argument not given (``value=`` of the assertions)."""
_UNSET = UNSET


def recent_journal(state: State, count: int = 15) -> str:
    """The last ``count`` committed changes, one per line (secret values masked)."""
    start = max(state.journal.cursor - count, 0)
    try:
        changes = state.journal.since(start)
    except CursorExpiredError:
        # A small journal ring: show what it still holds.
        try:
            changes = state.journal.since(state.engine.ring.dropped_seq)
        except CursorExpiredError:
            return "(the journal no longer holds the recent changes)"
    if not changes and state.journal.cursor:
        return "(the journal no longer holds the recent changes)"
    lines = []
    for change in changes[-count:]:
        data = change.to_dict()
        prov = data["provenance"]
        who = prov["source"] + (f"/{prov['writer']}" if prov.get("writer") else "")
        what = "removed" if data["removed"] else f"= {json.dumps(data['new'], ensure_ascii=False)}"
        lines.append(f"  [seq {data['seq']}] {data['key']} {what}  ({who})")
    return "\n".join(lines) or "  (no changes yet)"


def why(runner: FlowRunner | None, state: State) -> str:
    """The explanation a failed expectation prints: the flow's report and the recent journal."""
    parts = []
    if runner is not None:
        parts.append(str(runner.explain()))
    parts.append("recent changes:\n" + recent_journal(state))
    return "\n".join(parts)


def assert_step(runner: FlowRunner, step: str, verdict: Verdict | str = Verdict.ACTIVE) -> None:
    """Assert that ``step`` is active (or has the given ``verdict``: ``"done"``, ...)."""
    want = Verdict(verdict)
    got = runner.verdict(step)
    if got is not want:
        raise AssertionError(
            f"expected step {step!r} to be {want.value}, but it is {got.value} "
            f"(active: {', '.join(runner.active_steps) or 'none'})\n{why(runner, runner.state)}"
        )


def shown(state: State, key: str, value: Any) -> str:
    """``repr(value)``, masked when ``key`` is secret."""
    return "'***'" if state.is_secret(key) else repr(value)


def assert_resolved(
    state: State, name: str, value: Any = _UNSET, *, runner: FlowRunner | None = None
) -> None:
    """Assert that resolver ``name`` has a result (equal to ``value``, when given); a failure
    shows ``runner``'s explanation too, when given."""
    result_key = f"{name}:result"
    if result_key not in state:
        status = state.get(f"{name}:status")
        error = state.get(f"{name}:error")
        detail = f"status {status!r}" + (f", error {error!r}" if error is not None else "")
        raise AssertionError(
            f"expected {name!r} to be resolved, but {result_key!r} is not set ({detail})\n"
            + why(runner, state)
        )
    if value is not _UNSET:
        got = state.get(result_key)
        if got != value or type(got) is not type(value):
            raise AssertionError(
                f"expected {result_key!r} to be {value!r}, got "
                f"{shown(state, result_key, got)}\n" + why(runner, state)
            )


def assert_provenance(state: State, key: str, **fields: Any) -> None:
    """Assert that ``key``'s provenance has these fields: ``source=``, ``writer=``,
    ``confidence=``, or any ``meta`` entry (``mode="background"``)."""
    prov = state.provenance(key)
    if prov is None:
        raise AssertionError(
            f"expected {key!r} to be set (to check its provenance)\n" + why(None, state)
        )
    known = {"source": prov.source, "writer": prov.writer, "confidence": prov.confidence}
    wrong = []
    for name, want in fields.items():
        got = known[name] if name in known else prov.meta.get(name, _UNSET)
        if got is _UNSET or got != want:
            shown = "missing" if got is _UNSET else repr(got)
            wrong.append(f"{name}: expected {want!r}, got {shown}")
    if wrong:
        raise AssertionError(
            f"provenance of {key!r} does not match: " + "; ".join(wrong) + "\n" + why(None, state)
        )
