"""``slateflow draw``: a flow as a picture, optionally coloured by what a recorded call did.

``slateflow draw module:flow_name`` prints the flow as Mermaid (:meth:`Flow.to_mermaid`);
``--format html`` writes one self-contained page (an inline SVG, no scripts, nothing fetched)
with every step and every edge labelled with its guard; ``--explain call.db`` (or a
``redis://`` URL with ``--call``) colours the steps the recorded call went through: done,
active, or not reached. ``flow_name`` may name a :class:`~slateflow.Flow`, a
:class:`~slateflow.FlowStack` (each of its flows is drawn) or a function taking no arguments
that returns one.
"""

from __future__ import annotations

import html
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SlateError, UsageError
from .flow import Flow, FlowStack
from .flow.constraints import Before

__all__ = ["Marking", "flow_html", "flow_svg", "load_flows", "mermaid", "recorded_marking"]

_NODE_W, _NODE_H, _GAP_X, _GAP_Y, _MARGIN = 220, 58, 40, 70, 30
_SIDE = 150  # room beside the steps for edges that skip a layer or go back


@dataclass(frozen=True)
class Marking:
    """What a recorded call did in one flow: the steps ``done`` and ``active`` at its end."""

    done: frozenset[str] = field(default_factory=frozenset)
    active: frozenset[str] = field(default_factory=frozenset)

    def state_of(self, step: str) -> str:
        """``"done"``, ``"active"`` or ``"unreached"``."""
        if step in self.done:
            return "done"
        return "active" if step in self.active else "unreached"


# -- finding the flow ----------------------------------------------------------------------------


def load_flows(spec: str) -> list[Flow]:
    """The flows ``module:name`` names (a module path or a ``.py`` file, then a Flow, a
    FlowStack or a function of no arguments returning one). Raises :class:`UsageError` naming
    the module or name and what to give instead."""
    module_name, sep, attribute = spec.rpartition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(f"{spec!r} is not module:flow_name; give e.g. myapp.flows:booking")
    module = _module(module_name)
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            names = sorted(n for n in dir(module) if _flowlike(getattr(module, n)))
            raise UsageError(
                f"module {module_name!r} has no {attribute!r}"
                + (f"; its flows: {', '.join(names)}" if names else "; it defines no flow")
            )
        found = getattr(found, part)
    if callable(found) and not isinstance(found, Flow | FlowStack):
        try:
            found = found()
        except TypeError as exc:
            raise UsageError(
                f"{spec}: {attribute!r} is a function that needs arguments ({exc}); name a flow, "
                "or a function of no arguments returning one"
            ) from None
    if isinstance(found, FlowStack):
        return found.flows
    if isinstance(found, Flow):
        return [found]
    raise UsageError(f"{spec}: {attribute!r} is a {type(found).__name__}, not a Flow or FlowStack")


def _flowlike(value: Any) -> bool:
    """A Flow, a FlowStack, or a function declared to return one."""
    if isinstance(value, Flow | FlowStack):
        return True
    returns = getattr(value, "__annotations__", {}).get("return") if callable(value) else None
    return returns is not None and "Flow" in str(getattr(returns, "__name__", returns))


def _module(name: str) -> Any:
    if name.endswith(".py") or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise UsageError(f"no Python file {name!r}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"{name!r} cannot be imported as a module")
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise UsageError(f"importing {name!r} failed: {type(exc).__name__}: {exc}") from exc
        return module
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the app's own modules
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"no module {name!r} ({exc}); run from the directory that holds it, or give the "
            "path of its .py file"
        ) from None
    except Exception as exc:
        raise UsageError(f"importing {name!r} failed: {type(exc).__name__}: {exc}") from exc


def recorded_marking(
    path: str | os.PathLike[str], flows: Iterable[Flow], *, call: str | None = None
) -> dict[str, Marking]:
    """Each flow's marking at the end of the call recorded at ``path`` (a file ``State.open``
    wrote, or a ``redis://`` URL with ``call``), read from its ``flow:{name}:done`` and
    ``:active`` keys. A flow the call never ran has an empty marking."""
    from .replay import load

    names = [f.name for f in flows]
    keys = [f"flow:{name}:{part}" for name in names for part in ("done", "active")]
    found = load(path, call=call, keys=keys)
    values: dict[str, Any] = {e.key: e.value for e in found.base}
    for commit in found.commits:
        for change in commit.changes:
            values[change.key] = change.new
    return {
        name: Marking(
            frozenset(_ids(values.get(f"flow:{name}:done"))),
            frozenset(_ids(values.get(f"flow:{name}:active"))),
        )
        for name in names
    }


def _ids(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


# -- Mermaid -------------------------------------------------------------------------------------


def mermaid(flows: Sequence[Flow], markings: dict[str, Marking] | None = None) -> str:
    """The flows as Mermaid charts; with ``markings``, steps classed ``done`` / ``active``."""
    charts = []
    for flow in flows:
        chart = flow.to_mermaid()
        if len(flows) > 1:
            chart = f"%% flow {flow.name}\n" + chart
        marking = (markings or {}).get(flow.name)
        if marking is not None:
            ids = {s.id: f"s{i}" for i, s in enumerate(flow.steps)}
            chart += "    classDef done fill:#cdeccd,stroke:#2e7d32\n"
            chart += "    classDef active fill:#cfe3fa,stroke:#1565c0,stroke-width:3px\n"
            for kind in ("done", "active"):
                nodes = [ids[s] for s in sorted(getattr(marking, kind)) if s in ids]
                if nodes:
                    chart += f"    class {','.join(nodes)} {kind}\n"
        charts.append(chart)
    return "\n".join(charts)


# -- SVG -----------------------------------------------------------------------------------------


def _layers(flow: Flow) -> dict[str, int]:
    """Each step's layer: the longest chain of ``after`` edges leading to it (a back edge,
    from a later step, does not count)."""
    order = {s.id: i for i, s in enumerate(flow.steps)}
    preds = {s.id: [e.step for e in s.after if e.step in order] for s in flow.steps}
    layer: dict[str, int] = {}

    def depth(step: str, seen: frozenset[str]) -> int:
        if step in layer:
            return layer[step]
        before = [p for p in preds[step] if p not in seen]
        value = 0 if not before else 1 + max(depth(p, seen | {step}) for p in before)
        layer[step] = value
        return value

    for s in flow.steps:
        depth(s.id, frozenset())
    return layer


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def flow_svg(flow: Flow, marking: Marking | None = None) -> str:
    """The flow as an SVG drawing: steps in layers (top to bottom), edges labelled with the
    guard that takes them (a branch's ``when``, else the step's ``done`` guard), ``before``
    constraints dashed; with ``marking``, steps coloured done / active / not reached."""
    layers = _layers(flow)
    rows: dict[int, list[str]] = {}
    for s in flow.steps:
        rows.setdefault(layers[s.id], []).append(s.id)
    widest = max((len(r) for r in rows.values()), default=1)
    width = 2 * (_MARGIN + _SIDE) + widest * _NODE_W + (widest - 1) * _GAP_X
    height = 2 * _MARGIN + len(rows) * _NODE_H + max(len(rows) - 1, 0) * _GAP_Y
    at: dict[str, tuple[float, float]] = {}
    for row, ids in rows.items():
        span = len(ids) * _NODE_W + (len(ids) - 1) * _GAP_X
        x0 = (width - span) / 2
        for j, sid in enumerate(ids):
            at[sid] = (x0 + j * (_NODE_W + _GAP_X), _MARGIN + row * (_NODE_H + _GAP_Y))
    steps = {s.id: s for s in flow.steps}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="flow" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        f'aria-label="flow {html.escape(flow.name)}">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'class="head"/></marker></defs>',
    ]
    for s in flow.steps:
        for e in s.after:
            if e.step not in at:
                continue
            source = steps[e.step]
            guard = e.when if e.when is not None else source.done
            label = "" if guard is None else guard.describe()
            out.append(_edge(at[e.step], at[s.id], label, "branch" if e.when is not None else ""))
    for c in flow.constraints:
        if isinstance(c, Before) and c.first in at and c.then in at:
            out.append(_edge(at[c.first], at[c.then], "before", "before"))
    # A step's guard is on the edges leaving it; a step nothing follows shows its own.
    followed = {e.step for s in flow.steps for e in s.after}
    for s in flow.steps:
        x, y = at[s.id]
        state = marking.state_of(s.id) if marking is not None else "plain"
        reads = "" if s.done is None else s.done.describe()
        done = "" if s.id in followed else reads
        rx = 26 if s.terminal else 6
        out.append(
            f'<g class="step {state}" data-step="{html.escape(s.id)}">'
            f"<title>{html.escape(s.id)}: {html.escape(reads or 'terminal')}</title>"
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{_NODE_W}" height="{_NODE_H}" rx="{rx}"/>'
            f'<text x="{x + _NODE_W / 2:.0f}" y="{y + (24 if done else 34):.0f}" class="id">'
            f"{html.escape(_cut(s.id, 28))}</text>"
            f'<text x="{x + _NODE_W / 2:.0f}" y="{y + 43:.0f}" class="guard">'
            f"{html.escape(_cut(done, 36))}</text></g>"
        )
    out.append("</svg>")
    return "".join(out)


def _edge(a: tuple[float, float], b: tuple[float, float], label: str, kind: str) -> str:
    (ax, ay), (bx, by) = a, b
    x1, x2 = ax + _NODE_W / 2, bx + _NODE_W / 2
    next_row = ay + _NODE_H + _GAP_Y
    if by > ay and by <= next_row + 1:  # to the next row: bottom of one to the top of the other
        y1, y2 = ay + _NODE_H, by
        c1, c2 = (x1, y1 + _GAP_Y / 2), (x2, y2 - _GAP_Y / 2)
        # Near the target: branches leaving one step apart there, so their labels do too.
        mx, my = x1 + (x2 - x1) * 0.75, y1 + (y2 - y1) * 0.55
    elif by > ay:  # over rows in between: round their left side, clear of the steps there
        x1, x2 = ax, bx
        y1, y2 = ay + _NODE_H / 2, by + _NODE_H / 2
        c1, c2 = (x1 - _SIDE, y1), (x2 - _SIDE, y2)
        mx, my = max(min(x1, x2) - _SIDE * 0.75 + 10, _MARGIN + 80), (y1 + y2) / 2
    else:  # back (a retry) or sideways: out of the right side, round and in again
        x1, x2 = ax + _NODE_W, bx + _NODE_W
        y1, y2 = ay + _NODE_H / 2, by + _NODE_H / 2
        c1, c2 = (x1 + _SIDE * 0.6, y1), (x2 + _SIDE * 0.6, y2)
        mx, my = max(x1, x2) + _SIDE * 0.45, (y1 + y2) / 2
    text = html.escape(_cut(label, 34))
    return (
        f'<g class="edge {kind}"><title>{html.escape(label)}</title>'
        f'<path d="M{x1:.0f},{y1:.0f} C{c1[0]:.0f},{c1[1]:.0f} {c2[0]:.0f},{c2[1]:.0f} '
        f'{x2:.0f},{y2:.0f}" marker-end="url(#arrow)"/>'
        + (f'<text x="{mx:.0f}" y="{my:.0f}" class="label">{text}</text>' if text else "")
        + "</g>"
    )


_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 24px; color: #1d2329; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
.legend span { display: inline-block; padding: 2px 10px; margin-right: 8px; border-radius: 4px;
  border: 1px solid #9aa5b1; }
svg.flow { max-width: 100%; height: auto; }
.step rect { fill: #fff; stroke: #52606d; stroke-width: 1.5; }
.step.done rect, .legend .done { fill: #cdeccd; background: #cdeccd; stroke: #2e7d32; }
.step.active rect, .legend .active { fill: #cfe3fa; background: #cfe3fa; stroke: #1565c0;
  stroke-width: 3; }
.step.unreached rect, .legend .unreached { fill: #f1f3f5; background: #f1f3f5; stroke: #adb5bd; }
.step.unreached text { fill: #7b8794; }
.step text { text-anchor: middle; } .step .id { font-weight: 600; }
.step .guard { font-size: 11px; fill: #52606d; }
.edge path { fill: none; stroke: #7b8794; stroke-width: 1.5; }
.edge.branch path { stroke: #b86e00; } .edge.before path { stroke-dasharray: 5 4; }
.edge .label { font-size: 11px; fill: #3e4c59; text-anchor: middle;
  paint-order: stroke; stroke: #fff; stroke-width: 4px; }
.head { fill: #7b8794; }
pre { background: #f5f7fa; padding: 12px; overflow: auto; }
"""


def flow_html(
    flows: Sequence[Flow], markings: dict[str, Marking] | None = None, *, title: str = ""
) -> str:
    """One self-contained page drawing ``flows`` (inline SVG and CSS: it works opened from
    disk, with no network), coloured by ``markings`` when given, with the Mermaid source."""
    parts = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title or ', '.join(f.name for f in flows))}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title or 'slateflow: ' + ', '.join(f.name for f in flows))}</h1>",
    ]
    if markings is not None:
        parts.append(
            '<p class="legend"><span class="done">done</span><span class="active">active at '
            'the end</span><span class="unreached">not reached</span></p>'
        )
    for flow in flows:
        marking = None if markings is None else markings.get(flow.name, Marking())
        parts.append(f"<h2>flow {html.escape(flow.name)}</h2>")
        parts.append(flow_svg(flow, marking))
    parts.append("<details><summary>Mermaid source</summary><pre>")
    parts.append(html.escape(mermaid(flows, markings)))
    parts.append("</pre></details></body></html>\n")
    return "".join(parts)


# -- the command line ----------------------------------------------------------------------------


def add_arguments(parser: Any) -> None:
    """The ``slateflow draw`` arguments."""
    parser.add_argument("flow", metavar="MODULE:FLOW", help="e.g. myapp.flows:booking")
    parser.add_argument("--format", choices=("mermaid", "html"), default="mermaid")
    parser.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    parser.add_argument(
        "--explain",
        metavar="CALL",
        help="colour the steps a recorded call went through: a file State.open wrote, or a "
        "redis:// URL with --call",
    )
    parser.add_argument("--call", metavar="CALL_ID", help="the call, with a redis:// --explain")


def run(args: Any) -> int:
    """Run ``slateflow draw``; returns the exit code (2 for a bad module, name or call)."""
    try:
        flows = load_flows(args.flow)
        markings = (
            None if args.explain is None else recorded_marking(args.explain, flows, call=args.call)
        )
    except SlateError as exc:
        print(f"slateflow draw: {exc}", file=sys.stderr)
        return 2
    if args.format == "html":
        text = flow_html(flows, markings, title=f"slateflow draw {args.flow}")
    else:
        text = mermaid(flows, markings)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0
