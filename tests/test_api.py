"""The public API, pinned (as httpx and anyio pin theirs): one home and one name per object.

- The public modules are ``slateflow`` (what an app writes), its layer packages
  (``slateflow.state``, ``.stores``, ``.resolve``, ``.flow``, ``.conversation``,
  ``.orchestrate``, ``.testing``) and ``slateflow.errors``; every module has an ``__all__``.
- Each module's ``__all__`` names what it defines: a module only its own objects, a layer
  package only objects of its own subpackage, the top level only slateflow objects.
- No object is exported under two names, and no object is exported by two layer packages (the
  top level picks from the layers; a layer never re-exports another layer's objects).
- Names that were only ever renamed on the way to the first release are gone.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import types
from collections import defaultdict
from typing import Any

import pytest

import slateflow
from slateflow.errors import MissingExtraError

LAYER_PACKAGES = [
    "slateflow.state",
    "slateflow.stores",
    "slateflow.resolve",
    "slateflow.flow",
    "slateflow.conversation",
    "slateflow.orchestrate",
    "slateflow.testing",
    "slateflow.errors",
]


def _modules() -> dict[str, types.ModuleType]:
    """Every module of the package, but those of an integration whose library is not
    installed (a voice framework's, tested in its own CI step)."""
    found = {"slateflow": slateflow}
    for info in pkgutil.walk_packages(slateflow.__path__, "slateflow."):
        if not info.name.endswith("__main__"):
            with contextlib.suppress(MissingExtraError):
                found[info.name] = importlib.import_module(info.name)
    return found


MODULES = _modules()


def _identified(obj: Any) -> bool:
    """Whether an exported object has an identity worth checking (a class, a function, a
    signal, a type alias), not a constant equal ones of which are interchangeable."""
    if obj is None or isinstance(obj, str | int | float | bool | tuple | frozenset):
        return False
    return not isinstance(obj, types.ModuleType)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_says_what_it_exports(name: str) -> None:
    module = MODULES[name]
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ names something twice"
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names what it does not hold: {missing}"


@pytest.mark.parametrize("name", sorted(set(MODULES) - {"slateflow"}))
def test_each_modules_all_names_what_it_defines(name: str) -> None:
    module = MODULES[name]
    is_package = hasattr(module, "__path__")
    foreign = []
    for member in module.__all__:
        obj = getattr(module, member)
        home = getattr(obj, "__module__", None) if _identified(obj) else None
        if home is None or not home.startswith("slateflow"):
            continue  # a constant, a type alias or a signal: made by typing or blinker
        if home != name and not (is_package and home.startswith(name + ".")):
            foreign.append(f"{member} (defined in {home})")
    assert foreign == [], f"{name}.__all__ re-exports: {foreign}"


def test_the_top_level_exports_only_slateflow_objects() -> None:
    for member in slateflow.__all__:
        obj = getattr(slateflow, member)
        if _identified(obj):
            assert getattr(obj, "__module__", "").startswith("slateflow."), member


def test_no_object_is_exported_under_two_names_or_by_two_layers() -> None:
    addresses: dict[int, set[tuple[str, str]]] = defaultdict(set)
    for name, module in MODULES.items():
        for member in module.__all__:
            obj = getattr(module, member)
            if _identified(obj):
                addresses[id(obj)].add((name, member))
    problems = []
    for found in addresses.values():
        if len({member for _, member in found}) > 1:
            problems.append(f"one object under several names: {sorted(found)}")
        layers = {name for name, _ in found if name in LAYER_PACKAGES}
        if len(layers) > 1:
            problems.append(f"exported by several layers: {sorted(found)}")
    assert problems == []


def test_the_top_level_holds_what_an_app_writes() -> None:
    assert len(slateflow.__all__) <= 50
    for name in ("State", "Session", "Conversation", "Flow", "Step", "Resolver"):
        assert name in slateflow.__all__
    # Plumbing stays in its layer: an app starts flows through a conversation or a session.
    for name in ("FlowRunner", "StackRunner", "Engine", "Runtime", "Scheduler"):
        assert name not in slateflow.__all__
    exec("from slateflow import *", {})


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("slateflow", "Dispatch"),
        ("slateflow", "Mutation"),
        ("slateflow", "Trigger"),
        ("slateflow", "call"),
        ("slateflow", "guards"),
        ("slateflow", "Call"),
        ("slateflow.resolve", "Dispatch"),
        ("slateflow.resolve", "call"),
        ("slateflow.resolve", "ToolClaim"),
        ("slateflow.resolve", "Turn"),
        ("slateflow.resolve", "TurnContext"),
        ("slateflow.state", "Mutation"),
        ("slateflow.state", "Trigger"),
        ("slateflow.state", "end_turn"),
        ("slateflow.state.when", "Trigger"),
        ("slateflow.conversation", "Call"),
        ("slateflow.conversation", "Rule"),
        ("slateflow.conversation.promotion", "Rule"),
        ("slateflow.flow", "Resume"),
        ("slateflow.flow", "VOICE_TIMING_KEY"),
        ("slateflow.testing", "ManualClock"),
    ],
)
def test_a_name_that_was_never_released_is_not_kept_as_an_alias(module: str, name: str) -> None:
    with pytest.raises(AttributeError):
        getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(
    "module",
    [
        "slateflow.deprecation",
        "slateflow.guards",
        "slateflow.resolve.dialog",
        "slateflow.resolve.tools",
        "slateflow.resolve.turns",
        "slateflow.resolve.inbox",
        "slateflow.resolve.conversing",
        "slateflow.resolve.conversation_aliases",
        "slateflow.state.aliases",
        "slateflow.state.store",
        "slateflow.state.history",
        "slateflow.state.redaction",
        "slateflow.flow.aliases",
        "slateflow.flow.view",
        "slateflow.conversation.call",
        "slateflow.conversation.dialog",
    ],
)
def test_a_module_of_old_names_is_gone(module: str) -> None:
    with pytest.raises(ImportError):
        importlib.import_module(module)


@pytest.mark.parametrize(
    ("cls", "names"),
    [
        ("slateflow.Session", ("user_turn", "conversation", "run_flow", "attach", "tools")),
        ("slateflow.State", ("cursor", "require", "contains", "user", "turn", "derived")),
        ("slateflow.flow.FlowRunner", ("postures", "take_deliveries", "told_marker", "tools")),
    ],
)
def test_a_class_keeps_no_name_of_another_concept(cls: str, names: tuple[str, ...]) -> None:
    module, _, attr = cls.rpartition(".")
    found = getattr(importlib.import_module(module), attr)
    assert [n for n in names if hasattr(found, n)] == []
