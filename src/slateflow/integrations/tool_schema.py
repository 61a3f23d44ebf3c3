"""A tool's JSON schema, derived from its function: type hints give the types (pydantic),
the docstring gives the descriptions (parsed with ``griffelib``, the library mkdocstrings
uses: Google, NumPy and Sphinx styles); and the schema in the formats the model APIs take.

- a parameter's type hint is its type (anything pydantic validates: ``int``, ``date``,
  ``Literal["a", "b"]``, a model, ``list[str]``, ``X | None``); a default makes it optional;
  ``Annotated[int, Field(ge=1)]`` adds constraints;
- a single parameter whose type is a pydantic model *is* the schema (the model's fields are
  the arguments, and the function receives the model);
- a first parameter annotated :class:`ToolContext` (or named ``ctx`` / ``context`` without a
  hint) is left out of the schema: the call's context goes there;
- ``*args``, ``**kwargs`` and positional-only parameters are refused: a model calls with
  named arguments.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from ..errors import ToolDefinitionError
from ..extras import require

__all__ = ["Signature", "anthropic_schema", "gemini_schema", "openai_schema", "read_signature"]

_SECTIONS = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns|Raises|Yields|Examples?)\s*:?\s*$"
    r"|^\s*:(param|type|returns?|raises)\b"
    r"|^\s*-{3,}\s*$",
    re.MULTILINE,
)
_CONTEXT_NAMES = frozenset({"ctx", "context"})


class Signature:
    """What a tool function's signature and docstring say: its description, the model that
    validates its arguments (and gives the schema), where the context goes, and whether the
    arguments arrive as one model."""

    __slots__ = ("context", "description", "model", "single")

    def __init__(
        self, description: str, model: type[BaseModel], context: str | None, single: str | None
    ) -> None:
        self.description = description
        self.model = model
        self.context = context
        """The name of the parameter the call's context goes to, or None."""
        self.single = single
        """The name of the one parameter that receives the arguments as a model, or None."""

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments (an object)."""
        schema = self.model.model_json_schema()
        schema.pop("title", None)
        schema.setdefault("properties", {})
        return schema


def read_signature(
    fn: Callable[..., Any], name: str, context_type: type, description: str | None = None
) -> Signature:
    """Read ``fn``'s signature and docstring (see the module docs); ``name`` names the tool in
    errors. Raises :class:`~slateflow.errors.ToolDefinitionError`."""
    try:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)
    except (TypeError, ValueError, NameError) as exc:
        raise ToolDefinitionError(f"tool {name!r}: cannot read its signature ({exc})") from None
    summary, documented = _docstring(fn, name)
    params = list(signature.parameters.values())
    context = None
    if params and _is_context(params[0], hints, context_type):
        context = params[0].name
        params = params[1:]
    fields: dict[str, Any] = {}
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolDefinitionError(
                f"tool {name!r}: parameter {param.name!r} is {param.kind.description}; a model "
                "calls a tool with named arguments, so give each one a name"
            )
        hint = hints.get(param.name, Any)
        if hint is context_type:
            raise ToolDefinitionError(
                f"tool {name!r}: the context parameter {param.name!r} must come first"
            )
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (
            hint,
            Field(default, description=documented.get(param.name) or None),
        )
    single = None
    if len(fields) == 1:
        ((only, (hint, _)),) = fields.items()
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            single = only
    if single is not None:
        model = fields[single][0]
    else:
        try:
            model = create_model(
                _model_name(name),
                __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
                **fields,
            )
            model.model_json_schema()
        except Exception as exc:
            raise ToolDefinitionError(
                f"tool {name!r}: its parameters cannot be described as JSON schema ({exc}); "
                "use types pydantic knows (str, int, date, Literal, models, lists, ...)"
            ) from None
    text = description if description is not None else summary
    if not text:
        raise ToolDefinitionError(
            f"tool {name!r} has no description: write a docstring (its first paragraph tells "
            "the model what the tool does) or pass description=..."
        )
    return Signature(text, model, context, single)


def _is_context(param: inspect.Parameter, hints: dict[str, Any], context_type: type) -> bool:
    hint = hints.get(param.name)
    if hint is context_type:
        return True
    return hint is None and param.name in _CONTEXT_NAMES


def _model_name(name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^0-9A-Za-z]+", name) if part) or "T"


def _docstring(fn: Callable[..., Any], name: str) -> tuple[str, dict[str, str]]:
    """The description (the text before any section) and each parameter's description."""
    text = inspect.getdoc(fn) or ""
    if not text:
        return "", {}
    if not _SECTIONS.search(text):
        return " ".join(text.split("\n\n")[0].split()) if text else "", {}
    griffe = require("griffe", "tools", f"tool {name!r} (its docstring has sections)")
    doc = griffe.Docstring(text, lineno=1)
    if re.search(r"^\s*:(param|type|returns?|raises)\b", text, re.MULTILINE):
        sections = griffe.parse_sphinx(doc, warnings=False)
    elif re.search(r"^\s*-{3,}\s*$", text, re.MULTILINE):
        sections = griffe.parse_numpy(doc, warnings=False)
    else:
        sections = griffe.parse_google(doc, warnings=False)
    summary = ""
    params: dict[str, str] = {}
    for section in sections:
        kind = section.kind.value
        if kind == "text" and not summary:
            summary = " ".join(str(section.value).split("\n\n")[0].split())
        elif kind == "parameters":
            for item in section.value:
                params[item.name] = " ".join(str(item.description).split())
    return summary, params


# -- the formats the model APIs take ----------------------------------------------------------


def openai_schema(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """The tool as OpenAI's chat completions (and every compatible server) take it."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def anthropic_schema(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """The tool as Anthropic's Messages API takes it."""
    return {"name": name, "description": description, "input_schema": parameters}


def gemini_schema(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """The tool as a Gemini function declaration: the OpenAPI subset Gemini takes (references
    put in place, ``X | None`` as ``nullable``, no ``title``, ``default`` or
    ``additionalProperties``, a ``const`` as a one-value ``enum``)."""
    defs = parameters.get("$defs", {})
    return {"name": name, "description": description, "parameters": _gemini(parameters, defs, 0)}


_GEMINI_DROP = frozenset({"title", "default", "additionalProperties", "$defs", "examples"})


def _gemini(schema: Any, defs: dict[str, Any], depth: int) -> Any:
    if not isinstance(schema, dict):
        return schema
    if depth > 32:
        raise ToolDefinitionError("a tool schema nests too deep (a recursive model?) for Gemini")
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        merged = {**defs.get(ref.removeprefix("#/$defs/"), {}), **schema}
        merged.pop("$ref")
        return _gemini(merged, defs, depth + 1)
    variants = schema.get("anyOf")
    if isinstance(variants, list):
        kept = [v for v in variants if v != {"type": "null"}]
        if len(kept) == 1 and len(kept) < len(variants):
            rest = {k: v for k, v in schema.items() if k != "anyOf"}
            return {
                **_gemini(kept[0], defs, depth + 1),
                **_gemini(rest, defs, depth),
                "nullable": True,
            }
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _GEMINI_DROP:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "properties" and isinstance(value, dict):
            out[key] = {k: _gemini(v, defs, depth + 1) for k, v in value.items()}
        elif isinstance(value, dict):
            out[key] = _gemini(value, defs, depth + 1)
        elif isinstance(value, list):
            out[key] = [_gemini(v, defs, depth + 1) for v in value]
        else:
            out[key] = value
    return out
