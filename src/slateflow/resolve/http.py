"""HTTP fetches: the request an HTTP resolver sends, filled from the State, and the pooled
client a Session holds (``pip install 'slateflow[http]'``).

The client library is ``httpx2``, the one the ``openai`` SDK (3.x) is built on, so a Session's
one pool serves its HTTP resolvers and its OpenAI models alike: one set of connection limits,
one set of keep-alive connections, one dependency. It is imported when the first request is
made, never by ``import slateflow``.
"""

from __future__ import annotations

import json as jsonlib
import re
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, urlsplit

from pydantic import TypeAdapter, ValidationError

from ..errors import HTTPCallError, ResolverDefinitionError, TemplateError
from ..extras import require, required
from .clock import real_work
from .retry import server_retry
from .template import MISSING, Reference, Template

if TYPE_CHECKING:
    from ..state import State

__all__ = ["DEFAULT_MAX_BYTES", "HTTPCall", "HTTPPool", "current_pool", "hosting", "unhost"]

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
Decode = Literal["auto", "json", "text"]
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
_METHOD = re.compile(r"[A-Z]+")
_WHOLE = re.compile(r"\{\s*([^{}?]+?)\s*\}")
_DETAIL = 300

_pool: ContextVar[HTTPPool | None] = ContextVar("slateflow_http_pool", default=None)


_lib: Any = None


def _httpx(what: str) -> Any:
    global _lib
    if _lib is None:  # imported once, at the first request, never by import slateflow
        _lib = require("httpx2", "http", what)
    return _lib


class HTTPPool:
    """A Session's pooled HTTP client: an ``httpx2.AsyncClient`` made on first use and closed
    with the session (``session.http``).

    ``max_connections`` caps the connections open at once (requests beyond it wait for one);
    ``timeout`` is the default seconds a request may take (a resolver's ``timeout`` overrides
    it). :meth:`client` is the client itself, for ``AsyncOpenAI(http_client=...)`` or your own
    calls (an :class:`~slateflow.integrations.openai.OpenAIModel` run by the session uses it
    by itself).
    """

    __slots__ = ("__weakref__", "_client", "_closed", "max_connections", "timeout")

    def __init__(self, *, max_connections: int = 100, timeout: float = 30.0) -> None:
        if type(max_connections) is not int or max_connections < 1:
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        self.max_connections = max_connections
        self.timeout = float(timeout)
        self._client: Any = None
        self._closed = False

    def client(self) -> Any:
        """The ``httpx2.AsyncClient`` (made now if it was not yet)."""
        if self._closed:
            raise HTTPCallError(
                "the Session's HTTP pool is closed; make requests inside the session",
                server="",
                status=None,
                retryable=False,
            )
        if self._client is None:
            httpx = _httpx("an HTTP resolver")
            self._client = httpx.AsyncClient(
                limits=httpx.Limits(
                    max_connections=self.max_connections,
                    max_keepalive_connections=self.max_connections,
                ),
                timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
            )
        return self._client

    @property
    def started(self) -> bool:
        """Whether the client was made (a session that never fetched never imports httpx2)."""
        return self._client is not None

    async def aclose(self) -> None:
        """Close the client and its connections (the session does, when it closes)."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._client is not None else "unused"
        return f"HTTPPool(max_connections={self.max_connections}, {state})"


def current_pool() -> HTTPPool | None:
    """The HTTP pool of the Session running the current resolver (None outside one)."""
    return _pool.get()


def hosting(pool: HTTPPool) -> Any:
    """Make ``pool`` the current one in this task (what a Session does for the runs it starts);
    returns the token to reset it with."""
    return _pool.set(pool)


def unhost(token: Any) -> None:
    """Undo :func:`hosting`."""
    _pool.reset(token)


class _Filled:
    """A request filled from the State: what is sent, and what may be shown of it."""

    __slots__ = ("headers", "json", "params", "secrets", "shown", "url")

    def __init__(self) -> None:
        self.url = ""
        self.shown = ""
        self.params: list[tuple[str, str]] = []
        self.headers: dict[str, str] = {}
        self.json: Any = None
        self.secrets: list[str] = []

    def mask(self, text: str) -> str:
        """``text`` with every secret value put into the request shown as ``***``."""
        for secret in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text


def _template(name: str, field: str, text: object) -> Template:
    if isinstance(text, Template):
        return text
    if not isinstance(text, str):
        raise ResolverDefinitionError(
            f"resolver {name!r}: {field} must be a str (a template), got {type(text).__name__}"
        )
    try:
        return Template(text)
    except TemplateError as exc:
        raise ResolverDefinitionError(f"resolver {name!r}: {field}: {exc}") from None


def _body(name: str, value: Any, where: str = "json") -> Any:
    """The JSON body as data whose strings are templates: ``"{key}"`` alone puts the value in
    as it is (a number stays a number), other strings are filled as text."""
    if isinstance(value, str):
        whole = _WHOLE.fullmatch(value)
        if whole is not None:
            try:
                return Reference(whole.group(1))
            except TemplateError:
                pass
        return _template(name, where, value)
    if isinstance(value, Mapping):
        return {str(k): _body(name, v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_body(name, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, bool | int | float):
        return value
    raise ResolverDefinitionError(
        f"resolver {name!r}: {where} holds a {type(value).__name__}; a JSON body holds JSON "
        "values and templates"
    )


class HTTPCall:
    """What an HTTP resolver does each attempt: fill the request from the State, send it
    through the session's pool, read the answer within ``max_bytes``, decode and check it."""

    __slots__ = (
        "_adapter",
        "_body",
        "_client",
        "_headers",
        "_params",
        "_url",
        "decode",
        "max_bytes",
        "method",
        "name",
        "output",
        "timeout",
    )

    def __init__(
        self,
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
        timeout: float | None = None,
        client: Any = None,
    ) -> None:
        if not isinstance(method, str) or not _METHOD.fullmatch(method.upper()):
            raise ResolverDefinitionError(
                f"resolver {name!r}: method must be an HTTP method such as 'GET', got {method!r}"
            )
        if client is None:
            required("httpx2", "http", f"resolver {name!r} (Resolver.http)")
        self.name = name
        self.method = method.upper()
        self._url = _template(name, "url", url)
        self._params = {
            str(k): (v if v is None else _template(name, f"params.{k}", _param_text(v)))
            for k, v in (params or {}).items()
        }
        self._headers = {
            str(k): _template(name, f"headers.{k}", v) for k, v in (headers or {}).items()
        }
        self._body: Any = None
        if callable(json):
            self._body = json
        elif json is not None:
            self._body = _body(name, json)
        if decode not in ("auto", "json", "text"):
            raise ResolverDefinitionError(
                f"resolver {name!r}: decode must be 'auto', 'json' or 'text', got {decode!r}"
            )
        self.decode: Decode = decode
        if type(max_bytes) is not int or max_bytes < 1:
            raise ResolverDefinitionError(
                f"resolver {name!r}: max_bytes must be an int >= 1, got {max_bytes!r}"
            )
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.output = output
        self._adapter: TypeAdapter[Any] | None = None
        if output is not None:
            try:
                self._adapter = TypeAdapter(output)
            except Exception as exc:
                raise ResolverDefinitionError(
                    f"resolver {name!r}: output must be a type pydantic can validate (a model, "
                    f"list[Model], dict[str, int], ...): {exc}"
                ) from None
        self._client = client

    @property
    def reads(self) -> tuple[str, ...]:
        """The State keys the request is filled from (the resolver's default ``reads``)."""
        keys: list[str] = [*self._url.keys]
        for template in [*self._params.values(), *self._headers.values()]:
            if template is not None:
                keys.extend(template.keys)
        if self._body is not None and not callable(self._body):
            keys.extend(_body_keys(self._body))
        return tuple(dict.fromkeys(keys))

    def fill(self, state: State) -> _Filled:
        """The request for now: URL, query, headers and body from the State."""
        out = _Filled()
        name = self.name
        out.url, out.shown, secrets = self._url.fill(state, owner=name, quote=_segment)
        out.secrets.extend(secrets)
        shown_query: list[str] = []
        for key, template in self._params.items():
            if template is None:
                continue
            real, shown, secrets = template.fill(state, owner=name)
            out.params.append((key, real))
            shown_query.append(f"{quote(key, safe='')}={quote(shown, safe='*')}")
            out.secrets.extend(secrets)
        if shown_query:
            out.shown += ("&" if "?" in out.shown else "?") + "&".join(shown_query)
        for key, template in self._headers.items():
            real, _, secrets = template.fill(state, owner=name)
            out.headers[key] = real
            out.secrets.extend(secrets)
        body = self._body
        if callable(body):
            out.json = body(state)
        elif body is not None:
            out.json = _fill_body(body, state, name, out.secrets)
        return out

    async def __call__(self, state: State) -> tuple[Any, dict[str, Any]]:
        httpx = _httpx(f"resolver {self.name!r} (Resolver.http)")
        request = self.fill(state)
        client = self._client
        own = None
        if client is None:
            pool = _pool.get()
            if pool is not None:
                client = pool.client()
            else:
                # Run outside a Session (resolver.resolve(state)): a client for this call only.
                own = client = httpx.AsyncClient()
        where = f"{self.name} ({self.method} {request.shown})"
        server = _server(request.shown)
        begin = time.perf_counter()
        try:
            with real_work():
                status, headers, body = await self._send(httpx, client, request, where, server)
        finally:
            if own is not None:
                await own.aclose()
        latency = time.perf_counter() - begin
        if not 200 <= status < 300:
            retryable, after = server_retry(status, headers)
            detail = request.mask(_detail(body))
            raise HTTPCallError(
                f"HTTP {status} from {where}" + (f": {detail}" if detail else ""),
                server=server,
                status=status,
                retryable=retryable,
                retry_after=after,
            )
        value = self._decode(body, headers.get("content-type", ""), where, server, request)
        meta = {
            "method": self.method,
            "url": request.shown,
            "status": status,
            "latency_ms": round(latency * 1000.0, 3),
            "bytes": len(body),
        }
        return value, meta

    async def _send(
        self, httpx: Any, client: Any, request: _Filled, where: str, server: str
    ) -> tuple[int, Any, bytes]:
        options: dict[str, Any] = {}
        if request.params:
            options["params"] = request.params
        if request.headers:
            options["headers"] = request.headers
        if self._body is not None:
            options["json"] = request.json
        if self.timeout is not None:
            options["timeout"] = self.timeout
        try:
            async with client.stream(self.method, request.url, **options) as response:
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit():
                    if int(declared) > self.max_bytes:
                        raise self._too_large(where, server, int(declared))
                    # Within the cap by the server's word (a longer body is a protocol error
                    # the client raises): read it whole, the fast path.
                    return response.status_code, response.headers, await response.aread()
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise self._too_large(where, server, None)
                    chunks.append(chunk)
                return response.status_code, response.headers, b"".join(chunks)
        except httpx.TransportError as exc:
            # A connection never made sent nothing: always safe to retry. A request that may
            # have reached the server is retried only when repeating it changes nothing.
            connect = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            timed_out = isinstance(exc, httpx.TimeoutException)
            kind = "timed out" if timed_out else "could not be reached" if connect else "failed"
            said = request.mask(str(exc) or type(exc).__name__)
            raise HTTPCallError(
                f"{where} {kind}: {type(exc).__name__}: {said}",
                server=server,
                status=None,
                retryable=connect or self.method in _IDEMPOTENT,
            ) from None
        except httpx.InvalidURL as exc:
            raise HTTPCallError(
                f"{where}: not a URL that can be requested: {request.mask(str(exc))}",
                server=server,
                status=None,
                retryable=False,
            ) from None

    def _too_large(self, where: str, server: str, declared: int | None) -> HTTPCallError:
        size = f" ({declared} bytes declared)" if declared is not None else ""
        return HTTPCallError(
            f"the answer to {where} is larger than max_bytes={self.max_bytes}{size}; nothing "
            "was kept (raise max_bytes if it should fit)",
            server=server,
            status=None,
            retryable=False,
        )

    def _decode(
        self, body: bytes, content_type: str, where: str, server: str, request: _Filled
    ) -> Any:
        as_json = self.decode == "json" or (
            self.decode == "auto" and ("json" in content_type.lower() or self._adapter)
        )
        text = body.decode("utf-8", errors="replace")
        value: Any = text
        if as_json:
            try:
                value = jsonlib.loads(text) if text.strip() else None
            except ValueError as exc:
                raise HTTPCallError(
                    f"the answer to {where} is not JSON ({exc}): {request.mask(text[:_DETAIL])!r}",
                    server=server,
                    status=200,
                    retryable=False,
                ) from None
        adapter = self._adapter
        if adapter is None:
            return value
        try:
            return adapter.dump_python(adapter.validate_python(value), mode="json")
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors()
            )
            raise HTTPCallError(
                f"the answer to {where} does not match {_type_name(self.output)}: "
                f"{request.mask(problems)}",
                server=server,
                status=200,
                retryable=False,
            ) from None


def _param_text(value: Any) -> Any:
    """A query value as template text (numbers and booleans as JSON spells them)."""
    if isinstance(value, str | Template):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _segment(text: str) -> str:
    return quote(text, safe="")


def _server(shown: str) -> str:
    parts = urlsplit(shown)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else shown


def _detail(body: bytes) -> str:
    text = body[: _DETAIL * 4].decode("utf-8", errors="replace").strip()
    try:
        data = jsonlib.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error", data.get("detail", data.get("message")))
        if isinstance(error, dict):
            error = error.get("message", error)
        if isinstance(error, str):
            text = error
    return " ".join(text.split())[:_DETAIL]


def _type_name(output: Any) -> str:
    return str(getattr(output, "__name__", None) or output)


def _body_keys(body: Any) -> list[str]:
    if isinstance(body, Reference):
        return [body.key]
    if isinstance(body, Template):
        return list(body.keys)
    if isinstance(body, dict):
        return [k for v in body.values() for k in _body_keys(v)]
    if isinstance(body, list):
        return [k for v in body for k in _body_keys(v)]
    return []


def _fill_body(body: Any, state: State, owner: str, secrets: list[str]) -> Any:
    if isinstance(body, Reference):
        value = body.lookup(state)
        if value is MISSING:
            raise TemplateError(
                f"resolver {owner!r}: the request body needs {body.key!r}"
                + (f" (path {body.text!r})" if body.text != body.key else "")
                + ", which is not set"
            )
        if state.is_secret(body.key):
            secrets.extend(_strings(value))
        return value
    if isinstance(body, Template):
        real, _, found = body.fill(state, owner=owner)
        secrets.extend(found)
        return real
    if isinstance(body, dict):
        return {k: _fill_body(v, state, owner, secrets) for k, v in body.items()}
    if isinstance(body, list):
        return [_fill_body(v, state, owner, secrets) for v in body]
    return body


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [jsonlib.dumps(value)] if value is not None else []
