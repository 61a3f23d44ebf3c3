"""The package's structure, checked: layers, room sizes and import cycles (CI runs this file).

- A lower layer never imports a higher one (``LAYERS``, lowest first; ``BASE`` modules sit with
  ``errors``), counting every import of any kind: at module level, inside functions, under
  ``try`` and under ``if TYPE_CHECKING:``, and ``import_module("slateflow....")`` /
  ``__import__`` calls.
- No module imports a private (``_``) name from another module.
- No module in ``src/`` is over 600 lines.
- No class has more than 30 public names, counting what it inherits from slateflow classes:
  methods, properties and class attributes (per-instance data is not counted, whether it lives
  in ``__dict__``, in ``__slots__`` or in dataclass fields).
- No class inherits from two slateflow classes: a part of a class is an object with fields of
  its own, not a mixin sharing the class's fields.
- No import cycle between modules of one layer, counting the imports that run when a module is
  imported (a function-level import is the deliberate way to reach a module that builds on
  this one).
- A run's status has one owner: no module of the resolve layer but ``run.py`` assigns it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import slateflow
from slateflow.errors import MissingExtraError

SRC = Path(__file__).resolve().parent.parent / "src" / "slateflow"
MAX_LINES = 600
MAX_PUBLIC = 30


LAYERS = [
    "errors",
    "stores",
    "state",
    "resolve",
    "flow",
    "conversation",
    "orchestrate",
    "integrations",
    "testing",
]
# Modules of the base layer beside errors.py (they import nothing of the package).
BASE = {"errors", "extras", "tracing"}
IMPORTERS = {"import_module", "__import__"}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_by_call(node: ast.AST, package: str) -> str | None:
    """The module an ``import_module("...")`` / ``__import__("...")`` call names, if any."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    arg = node.args[0]
    if name not in IMPORTERS or not isinstance(arg, ast.Constant) or type(arg.value) is not str:
        return None
    target: str = arg.value
    if target.startswith("."):  # relative to the package named by package= (ours, here)
        level = len(target) - len(target.lstrip("."))
        parts = package.split(".")
        target = ".".join([*parts[: len(parts) - level + 1], target.lstrip(".")]).rstrip(".")
    return target if target.split(".")[0] == "slateflow" else None


def runtime_imports(
    source: str,
    module: str,
    is_package: bool,
    *,
    at_import: bool = False,
    type_checking: bool = False,
) -> set[str]:
    """The absolute slateflow modules ``module`` imports at run time (anywhere, functions
    included, and by ``import_module`` / ``__import__`` calls), leaving out imports under
    ``if TYPE_CHECKING:`` unless ``type_checking``. With ``at_import`` only those that run when
    the module is imported (not inside a function)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def calls(node: ast.AST) -> None:
        for child in ast.walk(node):
            target = _imported_by_call(child, package)
            if target is not None:
                found.add(target)

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.split(".")[0] == "slateflow")
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                if target.split(".")[0] == "slateflow":
                    if node.module is None:
                        found.update(f"{target}.{a.name}" for a in node.names)
                    else:
                        found.add(target)
            if at_import and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    calls(child)
                if isinstance(child, ast.stmt):
                    visit([child])
                elif isinstance(child, ast.ExceptHandler | ast.match_case):
                    visit(child.body)

    visit(ast.parse(source).body)
    return found


def test_runtime_imports_helper() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import typing\n"
        "from ..errors import X\n"
        "from . import sibling\n"
        "from .sub import y\n"
        "import slateflow.flow\n"
        "if TYPE_CHECKING:\n"
        "    from ..resolve import Session\n"
        "if typing.TYPE_CHECKING:\n"
        "    from ..flow import F\n"
        "else:\n"
        "    from ..testing import T\n"
        "def f():\n"
        "    from ..orchestrate import O\n"
        "class C:\n"
        "    try:\n"
        "        from ..conversation import Z\n"
        "    except ImportError:\n"
        "        pass\n"
        "def g():\n"
        "    return importlib.import_module('slateflow.integrations.x')\n"
        "LAZY = __import__('slateflow.conversation.y')\n"
    )
    found = runtime_imports(source, "slateflow.state.mod", is_package=False)
    assert found == {
        "slateflow.errors",
        "slateflow.state.sibling",
        "slateflow.state.sub",
        "slateflow.flow",
        "slateflow.testing",
        "slateflow.orchestrate",
        "slateflow.conversation",
        "slateflow.integrations.x",
        "slateflow.conversation.y",
    }
    every = runtime_imports(source, "slateflow.state.mod", is_package=False, type_checking=True)
    assert every - found == {"slateflow.resolve"}  # the TYPE_CHECKING one not imported otherwise
    assert runtime_imports("from .. import errors", "slateflow.stores", is_package=True) == {
        "slateflow.errors"
    }


def layer_modules() -> list[tuple[str, Path]]:
    out = [("errors", SRC / f"{name}.py") for name in sorted(BASE)]
    for layer in LAYERS[1:]:
        files = sorted((SRC / layer).rglob("*.py"))
        assert files, f"no modules in layer {layer}"
        out.extend((layer, f) for f in files)
    return out


def test_a_lower_layer_never_imports_a_higher_one() -> None:
    problems = []
    for layer, path in layer_modules():
        rel = path.relative_to(SRC.parent).with_suffix("")
        is_package = rel.name == "__init__"
        module = ".".join(rel.parent.parts if is_package else rel.parts)
        source = path.read_text("utf-8")
        for target in sorted(runtime_imports(source, module, is_package, type_checking=True)):
            parts = target.split(".")
            top = parts[1] if len(parts) > 1 else ""
            top = "errors" if top in BASE else top
            if top not in LAYERS or LAYERS.index(top) > LAYERS.index(layer):
                problems.append(f"{module} ({layer}) imports {target}")
    assert problems == []


# -- room sizes ---------------------------------------------------------------------------------


def test_no_module_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in sorted(SRC.rglob("*.py"))
        if (n := len(p.read_text("utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def _classes() -> list[type]:
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(slateflow.__path__, "slateflow."):
        try:
            module = importlib.import_module(info.name)
        except MissingExtraError:
            continue  # an integration whose library is not installed: its own CI step
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == info.name:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[k] for k in sorted(found)]


def _instance_data(cls: type) -> set[str]:
    """Names that are per-instance data, not API: slots, dataclass and pydantic fields."""
    names: set[str] = set()
    for k in cls.__mro__:
        slots = vars(k).get("__slots__", ())
        names.update([slots] if isinstance(slots, str) else slots)
        names.update(getattr(k, "__dataclass_fields__", {}))
        names.update(getattr(k, "model_fields", {}))
    return names


def public_api(cls: type, *, properties: bool = True, attributes: bool = True) -> list[str]:
    """The public names of ``cls`` with those it inherits from slateflow classes: its methods,
    and unless told otherwise its properties and class attributes (not per-instance data)."""
    data = _instance_data(cls)
    names = []
    for name in dir(cls):
        if name.startswith("_") or name in data:
            continue
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        if owner is None or not owner.__module__.startswith("slateflow"):
            continue
        attr = vars(owner)[name]
        if isinstance(attr, property):
            if properties:
                names.append(name)
            continue
        fn = attr.__func__ if isinstance(attr, staticmethod | classmethod) else attr
        if inspect.isclass(fn):
            continue
        if callable(fn) or attributes:
            names.append(name)
    return names


def test_no_class_has_more_than_30_public_names() -> None:
    big = {
        f"{cls.__module__}.{cls.__qualname__}": len(api)
        for cls in _classes()
        if len(api := public_api(cls)) > MAX_PUBLIC
    }
    assert big == {}, f"classes over {MAX_PUBLIC} public names: {big}"


def test_the_class_check_counts_inherited_names_but_not_instance_data() -> None:
    class Base:
        def a(self) -> None: ...

        limit = 3

    Base.__module__ = "slateflow.probe"

    class Probe(Base):
        __slots__ = ("data",)

        def b(self) -> None: ...

        @property
        def c(self) -> int:
            return 1

        def _private(self) -> None: ...

    Probe.__module__ = "slateflow.probe"
    assert sorted(public_api(Probe)) == ["a", "b", "c", "limit"]
    assert sorted(public_api(Probe, properties=False, attributes=False)) == ["a", "b"]


def test_no_class_inherits_from_two_slateflow_classes() -> None:
    mixed = {
        f"{cls.__module__}.{cls.__qualname__}": [b.__qualname__ for b in bases]
        for cls in _classes()
        if len(bases := [b for b in cls.__bases__ if b.__module__.startswith("slateflow")]) > 1
    }
    assert mixed == {}


def test_no_module_imports_a_private_name_from_another() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and (
                node.level or "slateflow" in (node.module or "")
            ):
                found += [
                    f"{path.relative_to(SRC)}:{node.lineno}: {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert found == []


def test_only_the_run_assigns_its_status() -> None:
    found = []
    for path in sorted((SRC / "resolve").glob("*.py")):
        if path.name == "run.py":
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            found += [
                f"{path.name}:{node.lineno}"
                for t in targets
                if isinstance(t, ast.Attribute) and t.attr == "status"
            ]
    assert found == []


# -- import cycles ------------------------------------------------------------------------------


def _module_name(path: Path) -> tuple[str, bool]:
    rel = path.relative_to(SRC.parent).with_suffix("")
    is_package = rel.name == "__init__"
    return ".".join(rel.parent.parts if is_package else rel.parts), is_package


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> str:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return "errors" if top in BASE else top


def test_no_import_cycle_between_modules_of_one_layer() -> None:
    graph: dict[str, set[str]] = {}
    modules = {}
    for path in sorted(SRC.rglob("*.py")):
        module, is_package = _module_name(path)
        modules[module] = (path, is_package)
    for module, (path, is_package) in modules.items():
        targets = runtime_imports(path.read_text("utf-8"), module, is_package, at_import=True)
        # A package's own __init__ is the layer's front door: it imports its modules.
        graph[module] = {
            t
            for t in targets
            if t in modules
            and t != module
            and layer_of(t) == layer_of(module)
            and not is_package
            and not modules[t][1]
        }
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", ["slateflow.flow.machine"])
def test_the_marking_machine_needs_no_state_clock_or_task(module: str) -> None:
    path, _ = SRC / "flow" / "machine.py", False
    targets = runtime_imports(path.read_text("utf-8"), module, False)
    assert not any(t.startswith(("slateflow.resolve", "slateflow.state.store")) for t in targets)
    source = path.read_text("utf-8")
    assert "anyio" not in source
    assert "clock" not in source.lower().replace("no clock", "")
