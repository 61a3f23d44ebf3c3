"""An mkdocs hook: docstrings write Sphinx roles (``:class:`State```); the API reference shows
the name alone, as code, not the role's markup."""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj|py:\w+):(<code>)~?")


def on_page_content(html: str, **_: Any) -> str:
    return _ROLE.sub(r"\1", html)
