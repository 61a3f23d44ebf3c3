"""Every snippet of ``docs/livekit.md`` runs alone, as a plain script, with livekit installed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[3] / "docs" / "livekit.md"
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
BLOCKS = FENCE.findall(PAGE.read_text(encoding="utf-8"))


def test_the_page_has_snippets() -> None:
    assert len(BLOCKS) >= 1


@pytest.mark.parametrize("block", range(len(BLOCKS)))
def test_a_livekit_docs_snippet_runs_as_a_plain_script(block: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKS[block]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
