"""Integrations with the libraries the field uses, each an optional extra imported lazily:
``slateflow.integrations.openai`` (``pip install 'slateflow[openai]'``). ``import slateflow``
never imports them; a missing library raises :class:`~slateflow.errors.MissingExtraError`
naming the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import MissingExtraError

__all__ = ["require"]


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module`` for ``what``, or raise :class:`MissingExtraError` naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{what} needs the {module!r} package, which is not installed: "
            f"pip install 'slateflow[{extra}]' ({exc})"
        ) from None
