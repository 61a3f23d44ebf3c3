"""Deprecated names of the flow runners, kept for one release (each warns with its new name).

``refusal`` / ``why_blocked`` / ``single`` / ``constraint_refusal`` became
``admit(tool, record=False)`` (``.allowed``, ``.reason``, ``.once``) and
``runner.tools.constraint_refusal``; ``suspend`` / ``resume`` / ``suspended`` became ``pause`` /
``unpause`` / ``paused`` ("resume" means picking up a recorded run after a restart).
"""

from __future__ import annotations

from collections.abc import Callable

from ..deprecation import deprecated
from .admission import Admission, Enforcement, Tools

__all__ = ["AdmitAliases", "RunnerAliases"]


class AdmitAliases:
    """The deprecated ways to ask about a tool, of ``FlowRunner`` and ``StackRunner`` alike."""

    # The runner's own method the aliases call.
    admit: Callable[..., Admission]

    @deprecated("admit(tool, record=False): refused when not .allowed, with .reason")
    def refusal(self, tool: str) -> str | None:
        """Why ``tool`` is refused now (for the model), or None when it is admitted."""
        admission = self.admit(tool, record=False)
        return None if admission.allowed else admission.reason

    @deprecated("admit(tool, record=False).reason (empty when nothing stands in the way)")
    def why_blocked(self, tool: str) -> str | None:
        """The reason ``tool`` would be refused now, in either mode, or None."""
        return self.admit(tool, record=False).reason or None

    @deprecated("admit(tool).once")
    def single(self, tool: str) -> bool:
        """Whether ``tool`` may succeed at most once (``once``, ``commit``)."""
        return self.admit(tool, record=False).once


class RunnerAliases(AdmitAliases):
    """The deprecated names of ``FlowRunner``."""

    enforcement: Enforcement
    tools: Tools
    _paused: bool
    pause: Callable[[], None]
    unpause: Callable[[], None]

    @deprecated("runner.tools.constraint_refusal(tool)")
    def constraint_refusal(self, tool: str) -> str | None:
        """Why the flow's constraints refuse ``tool`` now, whatever step is active, or None."""
        if self.enforcement is Enforcement.OBSERVE:
            return None
        return self.tools.constraint_refusal(tool)

    @property
    @deprecated("runner.paused")
    def suspended(self) -> bool:
        """Whether the runner is paused."""
        return self._paused

    @deprecated("runner.pause()")
    def suspend(self) -> None:
        """Pause the runner."""
        self.pause()

    @deprecated("runner.unpause() (resume means picking up a recorded run after a restart)")
    def resume(self) -> None:
        """Unpause the runner."""
        self.unpause()
