"""The state layer is used through its public and runtime API only (checked with ``ast``).

Upper layers (flow, resolve, conversation, orchestrate, testing, the CLI) must not import a
private name from ``slateflow.state`` nor reach into a private member of the State, its engine
or their helpers: the State is a façade over its engine, and what the runtime needs is the
engine's documented API (``state.engine``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "slateflow"
STATE = SRC / "state"


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _outside_state() -> list[Path]:
    return [p for p in _modules(SRC) if STATE not in p.parents]


def _absolute(module: str | None, level: int, path: Path) -> str:
    """The absolute dotted name an ``ImportFrom`` refers to, from ``path``'s package."""
    if not level:
        return module or ""
    package = path.relative_to(SRC.parent).with_suffix("").parts[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _members(tree: ast.AST) -> set[str]:
    """The names a module's classes define: methods and ``self.x = ...`` attributes."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(item.name)
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and isinstance(node.ctx, ast.Store)
        ):
            names.add(node.attr)
    return names


def _state_private_members() -> set[str]:
    """Private names the state layer's classes define (methods and ``self._x`` attributes)."""
    names: set[str] = set()
    for path in _modules(STATE):
        names |= _members(ast.parse(path.read_text(), str(path)))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _private_imports(path: Path) -> list[str]:
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _absolute(node.module, node.level, path)
            if target == "slateflow.state" or target.startswith("slateflow.state."):
                found += [
                    f"{path.relative_to(SRC)}:{node.lineno}: from {target} import {a.name}"
                    for a in node.names
                    if a.name.startswith("_")
                ]
                if target.rsplit(".", 1)[-1].startswith("_"):
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}: from {target}")
    return found


def _private_reaches(path: Path, private: set[str]) -> list[str]:
    """``x._name`` where ``_name`` is a state-layer private and ``x`` is not ``self``/``cls``:
    reaching into a State, an engine, a transaction or a subscription from outside."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    own = _members(tree)  # a class of this module may define the same private name for itself
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr not in private:
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in ("self", "cls"):
            continue
        reaches_state = (isinstance(base, ast.Name) and base.id in ("state", "st")) or (
            isinstance(base, ast.Attribute) and base.attr in ("state", "engine", "_state")
        )
        if reaches_state or node.attr not in own:
            found.append(f"{path.relative_to(SRC)}:{node.lineno}: .{node.attr}")
    return found


def test_the_checker_sees_private_imports_and_reaches(tmp_path: Path) -> None:
    """The checks below can fail: a module doing both is caught."""
    bad = SRC / "flow" / "_layering_probe.py"
    bad.write_text(
        "from ..state.store import _MISSING\n"
        "from ..state.values import _BIG\n"
        "def f(state):\n"
        "    return state._entries, state.engine._records\n"
    )
    try:
        assert len(_private_imports(bad)) == 2
        reaches = _private_reaches(bad, _state_private_members())
        assert any("_entries" in r for r in reaches)
        assert any("_records" in r for r in reaches)
    finally:
        bad.unlink()


@pytest.mark.parametrize("path", _outside_state(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_outside_state_imports_a_private_name_from_it(path: Path) -> None:
    assert _private_imports(path) == []


@pytest.mark.parametrize("path", _outside_state(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_outside_state_reaches_into_state_privates(path: Path) -> None:
    assert _private_reaches(path, _state_private_members()) == []
