"""Picking up after a restart: the resolvers a previous process left in flight, run again.

On a durable State a ``running`` status that no run of this process owns was left by a process
that died; :meth:`Restart.resume` dispatches those resolvers again (at least once) or, with
``abandon=True``, marks them cancelled. A resuming flow claims the ones it re-dispatches itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..errors import RecoveryError
from ..state import State
from ..state.provenance import Stamp
from .background import Scheduling
from .resolver import Resolver
from .run import Run

__all__ = ["Restart"]

log = logging.getLogger("slateflow.resolve")


class Restart:
    """The restart part of a :class:`~slateflow.Session` (see the module docstring)."""

    # The Session's, which this part works through.
    state: State
    _claimed: set[str]
    _opened_seq: int
    _check_usable: Callable[[], Any]
    _submit: Callable[..., Run]
    is_running: Callable[[str], bool]
    inbox_delivery: Callable[[object], Any]

    def in_flight(self) -> list[str]:
        """The resolvers a previous process left running, which no run here has taken over.

        On a durable state each run records how it was started; a ``<name>:status`` still
        ``"running"`` from before this session opened means that process stopped mid-run. Flows
        re-dispatch their own ``on_enter`` resolvers as they resume; :meth:`resume` the rest.
        """
        state = self.state
        names = []
        for key in state.keys(prefix=""):
            if not key.endswith(":status"):
                continue
            entry = state.entry(key)
            if (
                entry is None
                or entry.value != "running"
                or entry.seq > self._opened_seq
                or "mode" not in entry.provenance.meta
            ):
                continue
            name = key[: -len(":status")]
            if name not in self._claimed and not self.is_running(name):
                names.append(name)
        return names

    def resume(self, *resolvers: Resolver, abandon: bool = False) -> list[Run]:
        """Re-dispatch the resolvers that were in flight when the process stopped.

        Give every resolver that may have been in flight (a resolver is code: the state holds
        only its name). Each one :meth:`in_flight` names runs again in the mode it was started
        in (background results go to the session's inbox; a call-mode run, whose caller is
        gone, is dispatched). Resolvers that finished are never re-run: completed work is
        exactly-once, in-flight work at-least-once. An in-flight name with no resolver given
        raises :class:`~slateflow.errors.RecoveryError` before anything starts, unless
        ``abandon=True``, which marks those ``cancelled`` instead. Returns the new runs.
        """
        self._check_usable()
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
        for name in pending:
            found = given.get(name)
            if found is None:
                stamp = Stamp("system", name, None, {"reason": "abandoned after a restart"})
                self.state.engine.commit_owned({f"{name}:status": "cancelled"}, (), stamp, "resume")
                continue
            entry = self.state.entry(found.status_key)
            meta = entry.provenance.meta if entry is not None else {}
            self._claimed.add(name)
            if meta.get("mode") == "background":
                hint = Scheduling(str(meta.get("scheduling", Scheduling.WHEN_IDLE.value)))
                runs.append(
                    self._submit(found, "background", None, self.inbox_delivery(None), hint)
                )
            else:
                runs.append(self._submit(found, "dispatch", None, None, None))
        return runs

    def _claim(self, name: str) -> bool:
        """A resuming flow takes over re-dispatching ``name`` (False: someone already has)."""
        if name in self._claimed or self.is_running(name):
            return False
        self._claimed.add(name)
        return True
