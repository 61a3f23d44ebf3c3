"""Picking up after a restart: the resolvers a previous process left in flight, run again.

On a durable State a ``running`` status that no run of this process owns was left by a process
that died; ``session.resume`` dispatches those resolvers again (at least once) or, with
``abandon=True``, marks them cancelled. A resuming flow adopts the ones it re-dispatches itself
(``session.adopt``). :class:`Recovery` is the part of a Session that does it.
"""

from __future__ import annotations

from ..errors import RecoveryError
from ..state import State
from ..state.provenance import Stamp
from .background import Deliver, Scheduling
from .resolver import Resolver
from .run import Run
from .scheduler import Scheduler

__all__ = ["Recovery"]


class Recovery:
    """Runs a previous process left in flight, and who takes them over (see the module)."""

    __slots__ = ("_adopted", "_scheduler", "opened_seq", "state")

    def __init__(self, state: State, scheduler: Scheduler) -> None:
        self.state = state
        self._scheduler = scheduler
        self._adopted: set[str] = set()  # names a resuming flow or resume() re-dispatched
        self.opened_seq = 0  # the State's cursor when the session opened

    def in_flight(self) -> list[str]:
        """The resolvers a previous process left running, which no run here has taken over."""
        state = self.state
        names = []
        for key in state.keys(prefix=""):
            if not key.endswith(":status"):
                continue
            entry = state.entry(key)
            if (
                entry is None
                or entry.value != "running"
                or entry.seq > self.opened_seq
                or "mode" not in entry.provenance.meta
            ):
                continue
            name = key[: -len(":status")]
            if name not in self._adopted and not self._scheduler.is_running(name):
                names.append(name)
        return names

    def resume(
        self, resolvers: tuple[Resolver, ...], abandon: bool, deliver: Deliver | None
    ) -> list[Run]:
        """Re-dispatch the in-flight resolvers given (see ``Session.resume``)."""
        given: dict[str, Resolver] = {}
        for resolver in resolvers:
            if not isinstance(resolver, Resolver):
                raise TypeError(f"resume() takes Resolvers, got {type(resolver).__name__}")
            given[resolver.name] = resolver
        pending = self.in_flight()
        missing = [name for name in pending if name not in given]
        if missing and not abandon:
            raise RecoveryError(
                f"resolver(s) {', '.join(map(repr, missing))} were in flight when the state was "
                "last written; pass them to session.resume(...) to re-dispatch them, or "
                "abandon=True to mark them cancelled"
            )
        runs: list[Run] = []
        submit = self._scheduler.submit
        for name in pending:
            found = given.get(name)
            if found is None:
                stamp = Stamp("system", name, None, {"reason": "abandoned after a restart"})
                self.state.engine.commit_owned({f"{name}:status": "cancelled"}, (), stamp, "resume")
                continue
            entry = self.state.entry(found.status_key)
            meta = entry.provenance.meta if entry is not None else {}
            self._adopted.add(name)
            if meta.get("mode") == "background":
                hint = Scheduling(str(meta.get("scheduling", Scheduling.WHEN_IDLE.value)))
                runs.append(submit(found, "background", None, deliver, hint))
            else:
                runs.append(submit(found, "dispatch", None, None, None))
        return runs

    def adopt(self, name: str) -> bool:
        """Take over re-dispatching ``name`` (False: someone already has, or it is running)."""
        if name in self._adopted or self._scheduler.is_running(name):
            return False
        self._adopted.add(name)
        return True
