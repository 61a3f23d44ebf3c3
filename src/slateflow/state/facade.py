"""What the parts of the State façade share: the engine and the objects they reach through it.

:class:`~slateflow.state.State` is one class assembled from parts (governance, persistence,
scoped views); each part derives from :class:`Facade`, which names what the State sets up.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import Engine, Row
    from .policy import Policy

__all__ = ["Facade"]


class Facade:
    """The attributes every part of the State façade works through (set by ``State``)."""

    _engine: Engine
    _entries: dict[str, Row]
    _lock: threading.RLock
    _policy: Policy

    if TYPE_CHECKING:  # the State's constructor, which the class methods call

        def __init__(self, **options: Any) -> None: ...

    def _secret(self, key: str) -> bool:
        return self._policy.is_secret(key)
