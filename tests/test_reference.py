"""The API reference is generated from the docstrings (mkdocstrings): every public name of
every layer, and every public method and property of its classes, has one; every concept page
links to the reference; the docs build pins mkdocs-material below 10."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"


def documented_modules() -> list[str]:
    """The modules the reference pages render (``::: module`` lines)."""
    found = []
    for page in sorted(REFERENCE.glob("*.md")):
        found += re.findall(r"^::: ([\w.]+)$", page.read_text(encoding="utf-8"), re.M)
    return found


def public_names(module_name: str) -> list[tuple[str, object]]:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # an extra not installed here (pipecat, livekit, ray)
        pytest.skip(f"{module_name}: {exc}")
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return [(n, getattr(module, n)) for n in names]


def missing_docs(module_name: str) -> list[str]:
    gaps = []
    for name, value in public_names(module_name):
        where = f"{module_name}.{name}"
        if inspect.ismodule(value):
            continue
        if (inspect.isclass(value) or inspect.isfunction(value)) and not (
            value.__doc__ or ""
        ).strip():
            gaps.append(where)
        if inspect.isclass(value) and value.__module__.startswith("slateflow"):
            for attr, member in vars(value).items():
                kinds = property | classmethod | staticmethod
                if attr.startswith("_") or not (
                    inspect.isfunction(member) or isinstance(member, kinds)
                ):
                    continue
                target = member.fget if isinstance(member, property) else member
                target = getattr(target, "__func__", target)
                if not (getattr(target, "__doc__", None) or "").strip():
                    gaps.append(f"{where}.{attr}")
    return gaps


@pytest.mark.parametrize("module_name", documented_modules())
def test_every_public_name_in_the_reference_has_a_docstring(module_name: str) -> None:
    assert missing_docs(module_name) == []


def test_the_testing_kits_expectations_and_fail_are_in_the_reference() -> None:
    from slateflow.testing import ConversationScript, Fake

    for name in ("expect_step", "expect_done", "expect_key", "expect_refused",
                 "expect_admitted", "expect_told"):  # fmt: skip
        assert getattr(ConversationScript, name).__doc__
    assert Fake.fail.__doc__
    assert "slateflow.testing" in documented_modules()


CONCEPT_PAGES = [
    "state.md", "resolvers.md", "guards.md", "flows.md", "testing.md", "conversation.md",
    "openai.md", "http.md", "tools.md", "pipecat.md", "livekit.md", "orchestration.md",
    "durability.md", "distributed.md", "observability.md", "replay.md", "draw.md",
    "timeline.md", "security.md", "errors.md",
]  # fmt: skip


@pytest.mark.parametrize("page", CONCEPT_PAGES)
def test_every_concept_page_links_to_the_reference(page: str) -> None:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert re.search(r"\]\(reference/\w+\.md(#[\w.-]+)?\)", text), f"{page} links no reference page"


def test_mkdocs_material_is_pinned_below_10() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'"mkdocs-material>=9[\d.]*,<10"', text)
