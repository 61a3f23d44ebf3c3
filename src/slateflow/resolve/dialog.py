"""The former home of the dialog machinery, now :mod:`slateflow.conversation.dialog` (used
through :class:`slateflow.conversation.Call`). Its names still import from here for one
release, with a warning."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ..deprecation import moved

_NEW = "slateflow.conversation.dialog"
_NAMES = ("DEFAULT_MAX_TRANSCRIPT", "DELIVERED_KEY", "Dialog", "HandoverMode")


def __getattr__(name: str) -> Any:
    # Loaded by name when asked for, so this layer never imports the one above it.
    table = {n: (f"{_NEW}.{n}", lambda n=n: getattr(import_module(_NEW), n)) for n in _NAMES}
    return moved(__name__, name, table)
