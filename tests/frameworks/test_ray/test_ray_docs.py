"""The Ray snippet of docs/distributed.md runs as a plain script would (Ray already started)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[3] / "docs" / "distributed.md"
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_the_ray_snippet_of_the_distributed_page_runs(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = [b for b in FENCE.findall(PAGE.read_text(encoding="utf-8")) if "import ray" in b]
    assert len(blocks) == 1
    monkeypatch.setenv("REDIS_URL", redis_url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], f"{PAGE.name} (Ray)", "exec"), {"__name__": "__main__"})
    assert "'open': True" in out.getvalue()
