"""Resolvers: named async sources (agent, fetch, llm, function) whose results land in the State."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal, Protocol, TypedDict, Unpack, runtime_checkable

import anyio.to_thread
from pydantic import BaseModel, ValidationError

from ..errors import InvalidKeyError, ResolverDefinitionError
from ..state import Actor, Key, State, error_key, result_key, status_key
from ..state.keys import META_PREFIX, check_key, compile_pattern
from ..state.provenance import Stamp
from .clock import SYSTEM_CLOCK, Clock
from .http import DEFAULT_MAX_BYTES, Decode, HTTPCall
from .llm import LLM, LLMRequest, ToolSpec
from .llm_call import LLMCall, Messages, Partial, tool_specs
from .retry import HTTP_RETRY, Retry
from .template import Template

__all__ = [
    "CONFLICT_POLICIES",
    "OnConflict",
    "Resolver",
    "ResolverOptions",
    "TextAgent",
]

OnConflict = Literal["latest", "queue", "reject", "parallel"]
CONFLICT_POLICIES: tuple[OnConflict, ...] = ("latest", "queue", "reject", "parallel")

# A run's value with the extra provenance fields its source reported (model and usage for an LLM).
Produced = tuple[Any, dict[str, Any] | None]
# A source: awaited with the state, returns the value (or a WithMeta carrying provenance fields).
Source = Callable[[State], Awaitable[Any]]


class WithMeta:
    """A source's value together with extra provenance fields for its result."""

    __slots__ = ("meta", "value")

    def __init__(self, value: Any, meta: dict[str, Any]) -> None:
        self.value = value
        self.meta = meta


def _plainly_sync(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is a function that certainly returns no awaitable: a plain ``def``,
    method or builtin (a lambda or a callable object may still return one, so they pass)."""
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target):
        return False
    if inspect.isbuiltin(target):
        return True
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        call = type(target).__call__  # a callable object: what calling it runs
        return (
            inspect.isfunction(call)
            and not inspect.iscoroutinefunction(call)
            and not _may_await(call)
        )
    return target.__name__ != "<lambda>" and not _may_await(target)


def _may_await(fn: Callable[..., Any]) -> bool:
    """A sync function declared to return an awaitable (``-> Awaitable[...]``) is fine."""
    returns = getattr(fn, "__annotations__", {}).get("return")
    text = returns if isinstance(returns, str) else getattr(returns, "__name__", repr(returns))
    return any(word in str(text) for word in ("Awaitable", "Coroutine", "Future", "Task"))


def _label(fn: Callable[..., Any]) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return str(getattr(fn, "__name__", type(fn).__name__))


def _must_be_str(name: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not isinstance(value, str):
            raise TypeError(
                f"agent of resolver {name!r} returned {type(value).__name__}, not str; "
                "use Resolver.fetch for other values"
            )

    return check


@runtime_checkable
class TextAgent(Protocol):
    """A sub-agent: ``async def run(self, state) -> str``, reading its inputs from the State."""

    async def run(self, state: State, /) -> str:
        """Answer ``prompt`` (with the State at hand); the text becomes the resolver's value."""


class ResolverOptions(TypedDict, total=False):
    """Options every resolver accepts (see :class:`Resolver`)."""

    reads: Iterable[str | Key[Any]] | None
    writes: Iterable[str | Key[Any]] | str | None
    reactive: bool
    debounce: float
    timeout: float | None
    retry: Retry | None
    ttl: float | None
    on_conflict: OnConflict


def _writes(name: str, writes: object) -> tuple[str, ...]:
    """The declared extra keys or patterns, checked: valid, and none of the runtime's."""
    if writes is None:
        return ()
    items = [writes] if isinstance(writes, str | Key) else writes
    if not isinstance(items, Iterable):
        raise ResolverDefinitionError(
            f"resolver {name!r}: writes must be a key, a pattern or a list of them, got "
            f"{type(writes).__name__}"
        )
    found: list[str] = []
    for item in items:
        text = item.name if isinstance(item, Key) else item
        try:
            compile_pattern(text)
        except InvalidKeyError as exc:
            raise ResolverDefinitionError(f"resolver {name!r}: writes: {exc}") from None
        if str(text).startswith(META_PREFIX):
            raise ResolverDefinitionError(
                f"resolver {name!r}: writes {text!r}, but 'state_meta:' keys are read-only views "
                "of provenance"
            )
        found.append(str(text))
    return tuple(dict.fromkeys(found))


def _seconds(name: str, field: str, value: object, *, allow_zero: bool) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not allow_zero)
    ):
        need = ">= 0" if allow_zero else "> 0"
        raise ResolverDefinitionError(
            f"resolver {name!r}: {field} must be a finite number of seconds {need}, got {value!r}"
        )
    return float(value)


class Resolver:
    """A named async source whose value lands in the State as ``<name>:result``.

    Build one with :meth:`agent`, :meth:`fetch`, :meth:`llm` or :meth:`function`. Run it with
    ``await resolver.resolve(state)`` (call mode) or through a :class:`~slateflow.Session`
    (``dispatch`` and ``background`` modes). Every run writes the same keys:

    - at start ``<name>:status = "running"``;
    - on success, in one batch: ``<name>:result``, ``<name>:status = "done"``, and
      ``<name>:error`` and ``<name>:failures`` removed;
    - on failure (after retries), in one batch: ``<name>:error`` (a readable message),
      ``<name>:status = "error"``, ``<name>:failures`` (runs in a row that failed, counting
      this one), and ``<name>:result`` removed;
    - on cancellation ``<name>:status = "cancelled"``.

    Options (all keyword-only): ``reads`` (keys the source depends on; their versions at start are
    recorded in the result's provenance as ``inputs``; an llm resolver defaults to its prompt's
    keys), ``reactive`` (in a Session, re-run when a ``reads`` key changes, after ``debounce``
    seconds of quiet), ``timeout`` (seconds per attempt), ``retry`` (a :class:`Retry`), ``ttl``
    (seconds a result stays fresh, see ``slateflow.resolve.is_fresh(state, name)``) and
    ``on_conflict`` (what a
    Session does when the name is dispatched while a run is in flight: ``"latest"`` cancels the
    old run, ``"queue"`` runs them one after another, ``"reject"`` refuses the new one,
    ``"parallel"`` runs both).

    While the source runs, its writes to the State are fenced: it may write its own
    ``<name>:*`` keys except the three above, which belong to the runtime, and the keys it
    declares with ``writes`` (keys or patterns, e.g. ``writes=["booking:*"]``); anything else
    raises :class:`~slateflow.errors.PolicyViolation` and fails the run. Every write is stamped
    with its source and name (provenance ``writer``) and still passes the State's policies
    (read-only keys, declared writers, schemas).
    """

    __slots__ = (
        "actor",
        "check",
        "debounce",
        "error_key",
        "failures_key",
        "kind",
        "name",
        "on_conflict",
        "partial_key",
        "reactive",
        "reads",
        "refresh_error",
        "refresh_result",
        "result_key",
        "retry",
        "source",
        "stamp",
        "status_key",
        "template",
        "timeout",
        "ttl",
        "writes",
    )

    def __init__(
        self,
        name: str,
        kind: str,
        source: Source,
        *,
        template: Template | None = None,
        check: Callable[[Any], None] | None = None,
        reads: Iterable[str | Key[Any]] | None = None,
        writes: Iterable[str | Key[Any]] | str | None = None,
        reactive: bool = False,
        debounce: float = 0.05,
        timeout: float | None = None,
        retry: Retry | None = None,
        ttl: float | None = None,
        on_conflict: OnConflict = "latest",
    ) -> None:
        if type(name) is not str or not name:
            raise ResolverDefinitionError(f"a resolver name must be a non-empty str, got {name!r}")
        try:
            check_key(result_key(name))
        except Exception:
            raise ResolverDefinitionError(
                f"resolver name {name!r} cannot prefix state keys ({name!r}:result is not a valid "
                "key); use letters, digits, '_' or '-', joined by ':'"
            ) from None
        if result_key(name).startswith(META_PREFIX):
            raise ResolverDefinitionError(
                f"resolver name {name!r} would write under 'state_meta:', whose keys are "
                "read-only views of provenance; choose another name"
            )
        if type(kind) is not str or not kind:
            raise ResolverDefinitionError(f"resolver {name!r}: kind must be a non-empty str")
        self.name = name
        """The resolver's name: it writes ``<name>:result``, ``<name>:error``, ``<name>:status``."""
        self.kind = kind
        """The provenance source of its values: ``agent``, ``fetch``, ``llm`` or ``function``."""
        self.source = source
        self.template = template
        # Called with each value the source returns; raises to make the run an error.
        self.check = check
        self.result_key = result_key(name)
        self.error_key = error_key(name)
        self.status_key = status_key(name)
        self.failures_key = f"{name}:failures"
        """``<name>:failures``: how many runs in a row ended in an error (removed by a run
        that succeeds); ``failed(name, times=n)`` reads it."""
        self.partial_key: str | None = None
        """``<name>:partial`` for a streaming llm resolver (removed when a run ends), else
        None."""
        self.refresh_result = frozenset([self.result_key])
        self.refresh_error = frozenset([self.error_key])
        # Built once: the provenance of its status writes, and the fence around its source.
        self.stamp = Stamp(kind, name, None, None)
        self.writes = _writes(name, writes)
        """The keys (or patterns) beyond its own ``<name>:*`` that its source may write."""
        self.actor = Actor(
            name,
            kind,
            [f"{name}:*", *self.writes],
            [self.result_key, self.error_key, self.status_key],
        )
        if reads is None:
            names: tuple[str, ...] = template.keys if template is not None else ()
        else:
            if isinstance(reads, str | Key):
                reads = [reads]
            try:
                names = tuple(
                    dict.fromkeys(r.name if isinstance(r, Key) else check_key(r) for r in reads)
                )
            except InvalidKeyError as exc:
                raise ResolverDefinitionError(f"resolver {name!r}: reads: {exc}") from None
        self.reads = names
        """The keys the source depends on (versions recorded at start as ``inputs``)."""
        self.reactive = bool(reactive)
        if self.reactive:
            if not names:
                raise ResolverDefinitionError(
                    f"resolver {name!r} is reactive but reads nothing; pass reads=[...] with the "
                    "keys whose changes should re-run it"
                )
            own = [k for k in names if k.startswith(f"{name}:")]
            if own:
                raise ResolverDefinitionError(
                    f"reactive resolver {name!r} reads its own keys {own}, so every result would "
                    "re-run it; read other keys only"
                )
        self.debounce = _seconds(name, "debounce", debounce, allow_zero=True) or 0.0
        self.timeout = _seconds(name, "timeout", timeout, allow_zero=False)
        self.ttl = _seconds(name, "ttl", ttl, allow_zero=False)
        if retry is not None and not isinstance(retry, Retry):
            raise ResolverDefinitionError(
                f"resolver {name!r}: retry must be a Retry(...), got {type(retry).__name__}"
            )
        self.retry = retry
        if on_conflict not in CONFLICT_POLICIES:
            raise ResolverDefinitionError(
                f"resolver {name!r}: on_conflict must be one of {list(CONFLICT_POLICIES)}, "
                f"got {on_conflict!r}"
            )
        self.on_conflict: OnConflict = on_conflict

    # -- constructors ------------------------------------------------------------------------

    @classmethod
    def agent(
        cls,
        name: str,
        agent: TextAgent | Callable[[State], Awaitable[str]],
        **options: Unpack[ResolverOptions],
    ) -> Resolver:
        """Resolve by running a sub-agent: ``await agent.run(state)`` (or ``await agent(state)``).

        Its ``str`` output becomes the result; any other type is an error. Source ``"agent"``.
        """
        run = getattr(agent, "run", None)
        fn = run if callable(run) else agent
        if not callable(fn):
            raise ResolverDefinitionError(
                f"resolver {name!r}: agent must have an async run(state) method or be an async "
                f"callable taking the state, got {type(agent).__name__}"
            )

        return cls(name, "agent", fn, check=_must_be_str(name), **options)

    @classmethod
    def fetch(
        cls,
        name: str,
        fn: Callable[[State], Awaitable[Any]],
        **options: Unpack[ResolverOptions],
    ) -> Resolver:
        """Resolve by awaiting ``fn(state)``: the seam for HTTP, tools and MCP.

        It returns a JSON value (or a pydantic model); raise to record an error. Source
        ``"fetch"``.
        """
        if not callable(fn):
            raise ResolverDefinitionError(
                f"resolver {name!r}: fetch needs an async callable taking the state, "
                f"got {type(fn).__name__}"
            )
        if _plainly_sync(fn):
            raise ResolverDefinitionError(
                f"resolver {name!r}: fetch needs an async callable ('async def {_label(fn)}"
                f"(state)'), got the plain function {_label(fn)!r}, whose result cannot be "
                "awaited; make it async, or use Resolver.function(name, fn) for sync code "
                "(thread=True if it blocks)"
            )

        return cls(name, "fetch", fn, **options)

    @classmethod
    def http(
        cls,
        name: str,
        method: str,
        url: str | Template,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, Any] | None = None,
        json: Any = None,
        output: Any = None,
        decode: Decode = "auto",
        max_bytes: int = DEFAULT_MAX_BYTES,
        client: Any = None,
        **options: Unpack[ResolverOptions],
    ) -> Resolver:
        """Resolve by one HTTP request whose URL, query, headers and body are filled from the
        State (``pip install 'slateflow[http]'``).

        ``url``, each ``params`` / ``headers`` value and each string in ``json`` is a
        :class:`Template` (``"{patient:id}"``); a value put into the URL is percent-encoded,
        except one that starts it (a base URL from a key). In ``json``, a string that is one
        placeholder alone puts the value in as it is (``{"party": "{booking:party}"}`` sends
        a number); ``json`` may also be a function of the State. Secret keys go into the
        request, and nowhere else: the URL in errors and provenance shows them as ``***``, and
        a server echoing one back has it masked.

        The request goes through the Session's pooled client (``session.http``; outside a
        Session, a client made for the call, or ``client``: an ``httpx2.AsyncClient`` of
        yours). The answer is read up to ``max_bytes`` (more fails the run, nothing kept),
        decoded as JSON when the server says so (``decode="json"`` / ``"text"`` to choose)
        and, with ``output`` (a pydantic model or any type pydantic validates, such as
        ``list[Slot]``), validated: the result is its JSON data. A non-2xx answer fails the run
        with :class:`~slateflow.errors.HTTPCallError`: ``HTTP 503 from availability (GET
        http://host/slots)``. By default it retries 3 times (connection failures, 408, 429,
        5xx; a request that may have reached the server only when its method is idempotent),
        waiting at least what ``Retry-After`` asks; pass ``retry=`` to choose. ``timeout``
        bounds each attempt. The result's provenance records the method, the URL (masked),
        the status, the latency and the size. ``reads`` defaults to the keys the request is
        filled from. Source ``"fetch"``.
        """
        call = HTTPCall(
            name,
            method,
            url,
            params=params,
            headers=headers,
            json=json,
            output=output,
            decode=decode,
            max_bytes=max_bytes,
            timeout=options.get("timeout"),
            client=client,
        )
        options.setdefault("retry", HTTP_RETRY)
        options.setdefault("reads", call.reads)

        async def source(state: State) -> WithMeta:
            value, meta = await call(state)
            return WithMeta(value, meta)

        return cls(name, "fetch", source, **options)

    @classmethod
    def llm(
        cls,
        name: str,
        llm: LLM,
        prompt: str | Template = "",
        *,
        system: str | None = None,
        messages: Messages = (),
        tools: Iterable[ToolSpec | dict[str, Any]] = (),
        tool_choice: str | None = None,
        output: type[BaseModel] | None = None,
        stream: bool = False,
        on_partial: Partial | None = None,
        partial_key: bool = True,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        **options: Unpack[ResolverOptions],
    ) -> Resolver:
        """Resolve by one LLM call over a prompt rendered from the State, or a conversation.

        ``prompt`` is a :class:`Template` (``{key}``, ``{key.path}``, ``{key?}``; see
        :mod:`slateflow.resolve.template`), rendered at each attempt; a missing or secret key
        fails the run with a :class:`~slateflow.errors.TemplateError`. ``messages`` is a
        conversation (:class:`~slateflow.resolve.Message` objects, or a function of the State
        returning them), sent before the prompt. ``tools`` (:class:`~slateflow.resolve.ToolSpec`
        or dicts of its fields) the model may call; the result is then ``{"text": ...,
        "tool_calls": [...]}``. ``output``: a pydantic model the answer must be (its JSON
        schema goes with the request; the answer is validated here, and the result is the
        model's JSON data; an invalid one fails the run with
        :class:`~slateflow.errors.LLMOutputError`). Otherwise the text is the result.

        ``stream=True`` reads the answer through ``llm.stream(request)``: while the run is in
        flight the text so far goes to ``on_partial`` (a callback, sync or async, for a voice
        loop that speaks as it comes) and to ``<name>:partial`` (for guards, watchers and other
        readers of the State; ``partial_key=False`` keeps it out of the State, e.g. on a
        durable one that would journal every piece); the key is removed when the run ends,
        and the result is written once, whole. A stream cut off is an error
        (:class:`~slateflow.errors.LLMStreamError`), never a truncated result.

        The model and token usage go into the result's provenance (``usage`` None when the
        server did not report it, with ``usage_estimate``). ``reads`` defaults to the prompt's
        keys. Source ``"llm"``.
        """
        generate = getattr(llm, "generate", None)
        if not callable(generate):
            raise ResolverDefinitionError(
                f"resolver {name!r}: llm must have an async generate(request) method, "
                f"got {type(llm).__name__}"
            )
        if output is not None and not (isinstance(output, type) and issubclass(output, BaseModel)):
            raise ResolverDefinitionError(
                f"resolver {name!r}: output must be a pydantic model class, got {output!r}"
            )
        if not prompt and not messages:
            raise ResolverDefinitionError(
                f"resolver {name!r}: give the prompt, the messages, or both"
            )
        template = (
            None if not prompt else prompt if isinstance(prompt, Template) else Template(prompt)
        )
        # Validated once here, so a bad option is a definition error, not a run failure.
        try:
            base = LLMRequest(
                system=system,
                tools=tool_specs(name, tools),
                tool_choice=tool_choice,
                stream=bool(stream),
                model=model,
                temperature=temperature,
                max_tokens=max_tokens,
            )
        except ValidationError as exc:
            raise ResolverDefinitionError(
                f"resolver {name!r}: bad LLM request options: "
                + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            ) from None
        call = LLMCall(
            name,
            llm,
            template,
            base,
            messages=messages,
            output=output,
            on_partial=on_partial,
            write_partial=partial_key,
        )

        async def source(state: State) -> WithMeta:
            value, meta = await call(state)
            return WithMeta(value, meta)

        resolver = cls(name, "llm", source, template=template, **options)
        resolver.partial_key = call.partial_key
        return resolver

    @classmethod
    def function(
        cls,
        name: str,
        fn: Callable[[State], Any],
        *,
        thread: bool = False,
        **options: Unpack[ResolverOptions],
    ) -> Resolver:
        """Resolve by a plain computation over the state, ``fn(state)``, sync or async.

        A sync ``fn`` runs on the event loop; pass ``thread=True`` for blocking code, so it runs
        in a worker thread and a timeout can abandon it. Source ``"function"``.
        """
        if not callable(fn):
            raise ResolverDefinitionError(
                f"resolver {name!r}: function needs a callable taking the state, "
                f"got {type(fn).__name__}"
            )
        if thread:

            async def source(state: State) -> Any:
                return await anyio.to_thread.run_sync(fn, state, abandon_on_cancel=True)

        else:

            async def source(state: State) -> Any:
                value = fn(state)
                if inspect.isawaitable(value):
                    value = await value
                return value

        return cls(name, "function", source, **options)

    # -- running -----------------------------------------------------------------------------

    async def resolve(self, state: State, *, clock: Clock | None = None) -> Any:
        """Run now, in the calling task (call mode); returns the value or raises.

        Writes the keys described on the class. On failure (after retries) raises
        :class:`~slateflow.errors.ResolverError` whose message is also in ``<name>:error``.
        Cancelling the caller cancels the run (``<name>:status = "cancelled"``).
        """
        from .run import Run

        run = Run(self, "call", state, clock or SYSTEM_CLOCK)
        return await run.call()

    def __repr__(self) -> str:
        return f"Resolver.{self.kind}({self.name!r})"
