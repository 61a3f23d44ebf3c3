"""Progress recording: a running flow's marking written to the State, and read back to resume.

The runner writes, as itself (source ``"flow"``, writer the flow's name), ``flow:{name}:active``
and ``flow:{name}:done`` (step ids in flow order), ``:complete``, ``:told`` and ``:over``; on a
State with a store also ``flow:{name}:marking``, the rest of the marking a runner started on a
recovered State resumes from (entered steps, tool counts, repair bookkeeping, and the status
seq each ``on_enter`` resolver had when its step was entered, so an interrupted run is told from
a completed one). Only what a transition changed is written, in one commit.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from ..errors import RecoveryError, SlateError
from ..state import Key, State
from ..state.provenance import Stamp
from .machine import ACTIVE, COMPLETE, DONE, OVER, RECORD, TOLD, Event, Machine

if TYPE_CHECKING:
    from ..resolve.session import Session

__all__ = ["Progress"]

log = logging.getLogger("slateflow.flow")


class Progress:
    """Writes one runner's progress keys and resumes its marking from them."""

    __slots__ = ("durable", "fired", "keys", "machine", "stamp", "state")

    def __init__(self, machine: Machine, state: State) -> None:
        self.machine = machine
        self.state = state
        self.keys = machine.plan.progress_keys
        self.stamp = Stamp("flow", machine.name, None, None)
        # On a state with a store the runner also records its marking, to resume from it.
        self.durable = state.store is not None
        if self.durable:
            machine.dirty |= RECORD
        # Per entered step with an on_enter action: the seq its resolver's status had then.
        self.fired: dict[int, int] = {}

    def resume(self) -> bool:
        """Take up the marking an earlier runner of this flow recorded, if there is one."""
        record = self.state.get(self.keys[3]) if self.durable else None
        if record is None:
            return False
        where = f"flow {self.machine.name!r}: the recorded marking ({self.keys[3]!r})"
        done, told = self.state.get(self.keys[1], []), self.state.get(self.keys[4], [])
        self.fired = restore_marking(self.machine, record, done, told, where)
        return True

    def note(self, events: list[Event]) -> None:
        """Remember the status seq of each entered step's on_enter resolver (durable only)."""
        steps = self.machine.steps
        for kind, i in events:
            if kind == "reset":
                self.fired.pop(i, None)
            elif kind == "enter":
                action = steps[i].on_enter
                if action is not None:
                    row = self.state.engine.row(action.resolver.status_key)
                    self.fired[i] = 0 if row is None else row[2]

    def write(self) -> None:
        """Commit the progress keys the last transitions changed (delivered by the caller)."""
        m = self.machine
        dirty, m.dirty = m.dirty, 0
        keys = self.keys
        writes: dict[str, Any] = {}
        if dirty & ACTIVE:
            writes[keys[0]] = list(m.active_ids.ids)
        if dirty & DONE:
            writes[keys[1]] = m.done_ids.prefix()
        if dirty & COMPLETE:
            writes[keys[2]] = m.complete
        if dirty & RECORD and self.durable:
            record = marking_record(m)
            record["fired"] = {m.steps[i].id: seq for i, seq in sorted(self.fired.items())}
            writes[keys[3]] = record
        if dirty & TOLD:
            writes[keys[4]] = [m.steps[i].id for i in sorted(m.told)]
        if dirty & OVER:
            writes[keys[5]] = m.over
        if not writes:
            return
        try:
            # Fresh lists of step ids (strings) the runner never changes: no need to copy them.
            engine = self.state.engine
            engine.commit_owned(writes, (), self.stamp, "flow", deliver=False, trusted=True)
        except SlateError as exc:
            log.error("flow %r: its progress keys could not be written: %s", m.name, exc)

    def clear(self, patterns: list[str]) -> list[str]:
        """Remove the keys a reset clears (exact keys, or prefixes ending in ``*``), as the
        flow, in one commit delivered with the progress keys; returns the keys removed."""
        state = self.state
        keys: dict[str, None] = {}
        for pattern in patterns:
            if pattern.endswith("*"):
                keys.update(dict.fromkeys(state.keys(pattern[:-1])))
            elif pattern in state:
                keys[pattern] = None
        if keys:
            try:
                state.engine.commit_owned({}, list(keys), self.stamp, "flow", deliver=False)
            except SlateError as exc:
                log.error(
                    "flow %r: a reset could not clear %s: %s", self.machine.name, list(keys), exc
                )
                return []
        return list(keys)

    def interrupted(self, session: Session | None) -> list[int]:
        """Active steps whose ``on_enter`` run did not complete before the restart (never
        started, in flight, or cancelled by the session closing), claimed for re-dispatch."""
        m = self.machine
        again = []
        for i, fired in sorted(self.fired.items()):
            action = m.steps[i].on_enter
            if action is None or m.done[i] or not m.active[i] or session is None:
                continue
            row = self.state.engine.row(action.resolver.status_key)
            if row is not None and row[2] > fired:
                status, meta = row[0], row[4].meta or {}
                closed = status == "cancelled" and meta.get("reason") == "session closed"
                if status != "running" and not closed:
                    continue  # it completed: exactly once
            if session.adopt(action.resolver.name):
                again.append(i)
        return again

    def show_repair(self, wanted: dict[str, bool]) -> None:
        """Write the repair keys that changed (true when due, false once cleared)."""
        state = self.state
        # Compared with the State itself (an absent key reads as False): written on change only.
        changed = {k: v for k, v in wanted.items() if state.get(k, False) is not v}
        if changed:
            try:
                batch = cast("dict[str | Key[Any], Any]", changed)
                state.update(batch, source="flow", writer=self.machine.name)
            except SlateError as exc:
                log.error(
                    "flow %r: its repair keys could not be written: %s", self.machine.name, exc
                )


def marking_record(m: Machine) -> dict[str, Any]:
    """What a restarted machine needs beyond the done steps (which the State holds)."""
    steps = m.steps
    return {
        "entered": [steps[i].id for i, e in enumerate(m.entered) if e],
        "entries": {steps[i].id: n for i, n in sorted(m.entries.items())},
        "tools": dict(m.tools_ok),
        "escalated": [steps[i].id for i in sorted(m.escalated)],
        "stuck": {steps[i].id: n for i, n in sorted(m.stuck.items())},
    }


def restore_marking(m: Machine, record: Any, done: Any, told: Any, where: str) -> dict[int, int]:
    """Take up a recorded marking (before the first latch): done and entered steps, tool
    counts, repair bookkeeping and told steps. Returns the record's ``fired`` seqs by step.
    ``where`` names the record in a :class:`RecoveryError`."""
    fields = ("entered", "fired", "tools", "escalated", "stuck")
    if type(record) is not dict or any(k not in record for k in fields):
        raise RecoveryError(f"{where} is not a marking this runner wrote; remove the key")
    if type(done) is not list:
        raise RecoveryError(f"{where}: 'flow:{m.name}:done' is not a list of step ids")
    ids = m.plan.ids

    def index(step: object) -> int:
        i = ids.get(step) if type(step) is str else None
        if i is None:
            raise RecoveryError(
                f"{where} names step {step!r}, which this flow does not have; the flow "
                "changed since: resume with the same definition, or clear the flow:"
                f"{m.name}: keys to start it over"
            )
        return i

    fired: dict[int, int] = {}
    try:
        for step in done:
            m.set_done(index(step), True)
        for step in record["entered"]:
            m.entered[index(step)] = True
        for step, seq in record["fired"].items():
            fired[index(step)] = int(seq)
        for tool, count in record["tools"].items():
            m.tools_ok[str(tool)] = int(count)
        for step in record["escalated"]:
            m.escalated.add(index(step))
        for step, count in record["stuck"].items():
            m.stuck[index(step)] = int(count)
        for step, count in record.get("entries", {}).items():
            m.entries[index(step)] = int(count)
    except (AttributeError, TypeError, ValueError) as exc:
        raise RecoveryError(f"{where} is malformed ({exc}); remove the key") from None
    if isinstance(told, list):
        m.told = {ids[t]: 0 for t in told if t in ids}
    for e in m.plan.ends:
        if m.done[e]:
            m.ended = e
    m.forget_marking()
    return fired
