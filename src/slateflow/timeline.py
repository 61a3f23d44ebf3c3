"""``slateflow timeline``: one self-contained HTML page showing what a recorded call did.

Lanes on a time axis: the caller's turns, flow steps entered and done, resolver runs (from
their ``<name>:status`` key: running, then done / error / cancelled), tool calls (their
``tool:<name>:result`` / ``:error`` keys), and every state change as a mark that shows, on hover
or click, the old and new value, the version, who wrote it (provenance) and which guards read
the key (when the flows are given). Secrets stay masked (as in ``slateflow replay``); values
are cut at ``max_value_chars``. Filters by key glob and lane. The flows, when given, are drawn
with the steps the call went through highlighted (:mod:`slateflow.draw`).

The page holds its data as JSON and draws itself with an inline script: no network, so it
works opened from disk. It records when it finished drawing (``performance.now()``) in
``data-rendered-ms`` on its root element. :mod:`slateflow.timeline_live` serves it live.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any

from .draw import Marking, flow_svg
from .flow import Flow, Guard
from .replay import ReplayCommit, Timeline, load

__all__ = [
    "add_arguments",
    "build",
    "call_data",
    "changes_data",
    "guard_readers",
    "lanes",
    "page",
    "run",
]

_MAX_VALUE = 200


def _show(value: Any, limit: int) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def guard_readers(flows: Iterable[Flow]) -> dict[str, list[str]]:
    """Which guards read each key: ``key -> ["flow/step: <how the guard reads>", ...]``
    (a step's ``done`` and ``gate`` guards and the ``when`` of the edges into it)."""
    readers: dict[str, list[str]] = {}
    for flow in flows:
        for step in flow.steps:
            guards: list[tuple[str, Guard]] = []
            if step.done is not None:
                guards.append(("done", step.done))
            gate = getattr(step, "gate", None)
            if isinstance(gate, Guard):
                guards.append(("gate", gate))
            guards += [(f"from {e.step}", e.when) for e in step.after if e.when is not None]
            for role, guard in guards:
                label = f"{flow.name}/{step.id} {role}: {guard.describe()}"
                for key in guard.keys_read():
                    readers.setdefault(key, []).append(label)
    return readers


def changes_data(
    commits: Sequence[ReplayCommit],
    readers: dict[str, list[str]] | None = None,
    *,
    max_value_chars: int = _MAX_VALUE,
) -> list[dict[str, Any]]:
    """Every change of ``commits`` as the page's marks (values cut, secrets masked)."""
    readers = readers or {}
    out = []
    for commit in commits:
        for c in commit.changes:
            mark: dict[str, Any] = {
                "seq": commit.seq,
                "at": commit.at_ns,
                "key": c.key,
                "version": c.version,
                "source": c.source,
                "writer": c.writer,
                "origin": commit.origin,
            }
            if c.redacted:
                mark["old"] = mark["new"] = "***"
            else:
                mark["old"] = None if c.created else _show(c.old, max_value_chars)
                mark["new"] = "(removed)" if c.version == 0 else _show(c.new, max_value_chars)
            if c.confidence is not None:
                mark["confidence"] = c.confidence
            if c.key in readers:
                mark["readers"] = readers[c.key]
            out.append(mark)
    return out


def lanes(commits: Sequence[ReplayCommit], end_ns: int) -> dict[str, list[dict[str, Any]]]:
    """Turns, flow steps, resolver runs and tool calls, read off the keys that record them."""
    turns: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    open_runs: dict[str, dict[str, Any]] = {}
    for commit in commits:
        at = commit.at_ns
        said = next((c.new for c in commit.changes if c.key == "turn:user"), None)
        for c in commit.changes:
            key = c.key
            if key == "session:turn" and isinstance(c.new, int):
                text = "***" if c.redacted else said
                turns.append({"at": at, "number": c.new, "text": text})
            elif key.startswith("flow:") and key.endswith((":active", ":done")):
                flow, kind = key[5:].rsplit(":", 1)
                before = set(c.old or []) if isinstance(c.old, list) else set()
                now = c.new if isinstance(c.new, list) else []
                for step in now:
                    if step not in before:
                        kind_name = "entered" if kind == "active" else "done"
                        steps.append({"at": at, "flow": flow, "step": step, "kind": kind_name})
            elif key.startswith("tool:") and key.endswith((":result", ":error")):
                name, kind = key[5:].rsplit(":", 1)
                tools.append({"at": at, "name": name, "status": "ok" if kind == "result" else
                              "error"})  # fmt: skip
            elif key.endswith(":status") and not key.startswith(("tool:", "flow:")):
                name = key[: -len(":status")]
                status = c.new
                if status == "running":
                    open_runs[name] = {"name": name, "start": at, "end": None,
                                       "status": "running"}  # fmt: skip
                    runs.append(open_runs[name])
                elif name in open_runs and isinstance(status, str):
                    run = open_runs.pop(name)
                    run["end"], run["status"] = at, status
    for run in open_runs.values():
        run["end"] = end_ns  # still running when the record ends
    return {"turns": turns, "steps": steps, "runs": runs, "tools": tools}


def call_data(
    found: Timeline,
    label: str,
    flows: Sequence[Flow] = (),
    *,
    max_value_chars: int = _MAX_VALUE,
) -> dict[str, Any]:
    """The page's data for a call's :class:`~slateflow.replay.Timeline`."""
    commits = found.commits
    start = commits[0].at_ns if commits else 0
    end = commits[-1].at_ns if commits else 0
    markings = _markings(commits, flows)
    return {
        "call": label,
        "start": start,
        "end": end,
        "head": found.head,
        "lanes": lanes(commits, end),
        "changes": changes_data(commits, guard_readers(flows), max_value_chars=max_value_chars),
        "flows": [
            {"name": f.name, "svg": flow_svg(f, markings.get(f.name, Marking()))} for f in flows
        ],
    }


def _markings(commits: Sequence[ReplayCommit], flows: Sequence[Flow]) -> dict[str, Marking]:
    values: dict[str, Any] = {}
    wanted = {f"flow:{f.name}:{part}" for f in flows for part in ("done", "active")}
    for commit in commits:
        for c in commit.changes:
            if c.key in wanted:
                values[c.key] = c.new
    return {
        f.name: Marking(
            frozenset(v for v in values.get(f"flow:{f.name}:done") or [] if isinstance(v, str)),
            frozenset(v for v in values.get(f"flow:{f.name}:active") or [] if isinstance(v, str)),
        )
        for f in flows
    }


def page(data: dict[str, Any], *, live: bool = False) -> str:
    """The HTML page drawing ``data`` (see :func:`call_data`); ``live``: it also follows
    ``/events`` (server-sent events) for changes made after it was built."""
    template = resources.files("slateflow").joinpath("timeline_page.html").read_text("utf-8")
    # "</" would end the script element the data sits in.
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return (
        template.replace("__TITLE__", _escape(f"slateflow timeline: {data['call']}"))
        .replace("__LIVE__", "true" if live else "false")
        .replace("__DATA__", payload)
    )


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def build(
    path: str | os.PathLike[str],
    *,
    call: str | None = None,
    flows: Sequence[Flow] = (),
    keys: str | Iterable[str] = (),
    show_secrets: bool = False,
    max_value_chars: int = _MAX_VALUE,
    live: bool = False,
) -> str:
    """The timeline page of the call recorded at ``path`` (a file ``State.open`` wrote, or a
    ``redis://`` URL with ``call``). ``flows`` add the flow drawings and the guards reading
    each key; ``keys`` keeps only changes to keys matching these globs (the lanes still read
    every key). Secrets are masked unless ``show_secrets``."""
    found = load(path, call=call, show_secrets=show_secrets)
    label = f"{path} call {call}" if call else str(path)
    data = call_data(found, label, flows, max_value_chars=max_value_chars)
    if keys:
        from fnmatch import fnmatchcase

        globs = [keys] if isinstance(keys, str) else list(keys)
        data["changes"] = [
            c for c in data["changes"] if any(fnmatchcase(c["key"], g) for g in globs)
        ]
    return page(data, live=live)


# -- the command line ----------------------------------------------------------------------------


def add_arguments(parser: Any) -> None:
    """The ``slateflow timeline`` arguments."""
    parser.add_argument("path", metavar="CALL", help="a file State.open wrote, or a redis:// URL")
    parser.add_argument("--call", metavar="CALL_ID", help="the call, with a redis:// URL")
    parser.add_argument("-o", "--output", metavar="FILE", help="the page (default: CALL.html)")
    parser.add_argument("--flow", action="append", default=[], metavar="MODULE:FLOW",
                        help="draw this flow; show which of its guards read each key")  # fmt: skip
    parser.add_argument("--keys", action="append", default=[], metavar="GLOB",
                        help="keep only the changes of matching keys")  # fmt: skip
    parser.add_argument("--show-secrets", action="store_true", help="do not mask secret keys")
    parser.add_argument("--live", action="store_true",
                        help="serve the page on 127.0.0.1 and follow the call")  # fmt: skip
    parser.add_argument("--port", type=int, default=0, help="with --live (default: any free)")


def run(args: Any) -> int:
    """Run ``slateflow timeline``; returns the exit code (2 for a bad call, module or flow)."""
    import sys
    from pathlib import Path

    from .draw import load_flows
    from .errors import SlateError

    try:
        flows = [f for spec in args.flow for f in load_flows(spec)]
        if args.live:
            from .timeline_live import serve

            return serve(args, flows)
        text = build(args.path, call=args.call, flows=flows, keys=args.keys,
                     show_secrets=args.show_secrets)  # fmt: skip
    except SlateError as exc:
        print(f"slateflow timeline: {exc}", file=sys.stderr)
        return 2
    name = args.output or f"{args.call or Path(str(args.path)).stem}.html"
    Path(name).write_text(text, encoding="utf-8")
    print(f"slateflow timeline: wrote {name}")
    return 0
