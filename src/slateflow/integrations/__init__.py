"""Integrations with the libraries the field uses, each an optional extra imported lazily:
``slateflow.integrations.openai`` (``pip install 'slateflow[openai]'``). ``import slateflow``
never imports them; a missing library raises :class:`~slateflow.errors.MissingExtraError`
naming the extra to install (:func:`slateflow.extras.require`)."""

from __future__ import annotations

__all__: list[str] = []
