"""The former home of the tool desk, now :mod:`slateflow.conversation.tools` (tool calls belong
to the conversation). Its names still import from here for one release, with a warning."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ..deprecation import moved

_NEW = "slateflow.conversation.tools"
_NAMES = ("ToolClaim", "ToolDesk", "ToolResult")


def __getattr__(name: str) -> Any:
    # Loaded by name when asked for, so this layer never imports the one above it.
    table = {n: (f"{_NEW}.{n}", lambda n=n: getattr(import_module(_NEW), n)) for n in _NAMES}
    return moved(__name__, name, table)
