"""Optional extras: import an integration's library lazily, or say which extra installs it.

``import slateflow`` imports pydantic, blinker and anyio only; every other library is imported
by :func:`require` when the part that needs it is first used.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from .errors import MissingExtraError

__all__ = ["require", "required"]


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module`` for ``what``, or raise :class:`MissingExtraError` naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{what} needs the {module!r} package, which is not installed: "
            f"pip install 'slateflow[{extra}]' ({exc})"
        ) from None


def required(module: str, extra: str, what: str) -> None:
    """Check that ``module`` can be imported, without importing it (a part that will need it
    says so when it is built); raise :class:`MissingExtraError` naming ``extra`` if not."""
    try:
        found = sys.modules[module] if module in sys.modules else importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise MissingExtraError(
            f"{what} needs the {module!r} package, which is not installed: "
            f"pip install 'slateflow[{extra}]'"
        )
