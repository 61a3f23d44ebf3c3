"""Resolver.http against a real HTTP server on 127.0.0.1 serving availability JSON with faults,
through the real httpx2 client, on asyncio and trio: requests filled from the State, secrets
sent but never shown, answers decoded and validated, failures told apart by status, retries
that honour Retry-After, the size cap, and the Session's one pool."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from http_server import AvailabilityServer, availability_server
from slateflow import ManualClock, Resolver, Retry, Session, State
from slateflow.errors import (
    HTTPCallError,
    ResolverDefinitionError,
    ResolverError,
    TemplateError,
)
from slateflow.resolve import HTTP_RETRY, NO_RETRY, HTTPPool

pytest.importorskip("httpx2")

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore:Async generator 'httpx2._models:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Async generator 'httpcore2.:ResourceWarning"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[AvailabilityServer]:
    with availability_server() as running:
        yield running


def filled(values: dict[str, Any]) -> State:
    state = State()
    state.update(values)
    return state


class Slots(BaseModel):
    date: str
    slots: list[str]


async def test_a_get_filled_from_the_state_writes_the_decoded_json(
    server: AvailabilityServer,
) -> None:
    state = filled({"booking:date": "2026-12-01"})
    slots = Resolver.http("slots", "GET", server.url + "/slots", params={"date": "{booking:date}"})
    async with Session(state) as session:
        value = await session.call(slots)
    assert value == {"date": "2026-12-01", "slots": ["09:00", "09:30"]}
    assert state["slots:result"] == value
    assert slots.reads == ("booking:date",)


async def test_provenance_records_method_url_status_latency_and_size(
    server: AvailabilityServer,
) -> None:
    state = filled({"booking:date": "2026-12-01"})
    slots = Resolver.http("slots", "GET", server.url + "/slots", params={"date": "{booking:date}"})
    async with Session(state) as session:
        await session.call(slots)
    provenance = state.provenance("slots:result")
    assert provenance is not None
    assert provenance.source == "fetch"
    assert provenance.writer == "slots"
    meta = provenance.meta
    assert meta["method"] == "GET"
    assert meta["url"] == server.url + "/slots?date=2026-12-01"
    assert meta["status"] == 200
    assert meta["latency_ms"] > 0
    assert meta["bytes"] > 0


async def test_values_in_the_path_are_percent_encoded_but_a_base_url_from_a_key_is_not(
    server: AvailabilityServer,
) -> None:
    state = filled({"cfg:base": server.url, "patient:name": "Ana María/Ruiz?x"})
    echo = Resolver.http("echo", "GET", "{cfg:base}/echo/{patient:name}")
    async with Session(state) as session:
        answer = await session.call(echo)
    assert answer["path"] == "/echo/Ana%20Mar%C3%ADa%2FRuiz%3Fx"


async def test_headers_and_a_json_body_are_filled_and_a_lone_placeholder_keeps_its_type(
    server: AvailabilityServer,
) -> None:
    state = filled({"booking:party": 4, "booking:slot": {"time": "09:30"}, "user:name": "Ana"})
    book = Resolver.http(
        "book",
        "POST",
        server.url + "/echo/book",
        headers={"X-Caller": "{user:name}"},
        json={
            "party": "{booking:party}",
            "time": "{booking:slot.time}",
            "note": "for {user:name}",
            "tags": ["phone", "{user:name}"],
            "paid": False,
        },
    )
    async with Session(state) as session:
        answer = await session.call(book)
    assert answer["method"] == "POST"
    assert answer["headers"]["x-caller"] == "Ana"
    assert answer["json"] == {
        "party": 4,
        "time": "09:30",
        "note": "for Ana",
        "tags": ["phone", "Ana"],
        "paid": False,
    }
    assert set(book.reads) == {"booking:party", "booking:slot", "user:name"}


async def test_a_json_body_may_be_a_function_of_the_state(server: AvailabilityServer) -> None:
    state = filled({"n": 2})
    post = Resolver.http(
        "post", "POST", server.url + "/echo/f", json=lambda s: {"double": s["n"] * 2}
    )
    async with Session(state) as session:
        assert (await session.call(post))["json"] == {"double": 4}


async def test_secrets_are_sent_but_masked_in_provenance_and_errors(
    server: AvailabilityServer,
) -> None:
    state = filled({"auth:token": "s3cr3t-token-value", "patient:id": "P-991"})
    state.policy("auth:*", secret=True)
    echo = Resolver.http(
        "echo",
        "GET",
        server.url + "/echo/x",
        params={"token": "{auth:token}", "id": "{patient:id}"},
        headers={"Authorization": "Bearer {auth:token}"},
    )
    leak = Resolver.http(
        "leak", "GET", server.url + "/leak", params={"token": "{auth:token}"}, retry=NO_RETRY
    )
    async with Session(state) as session:
        answer = await session.call(echo)
        assert answer["query"]["token"] == "s3cr3t-token-value"  # the request carries it
        assert answer["headers"]["authorization"] == "Bearer s3cr3t-token-value"
        meta = state.provenance("echo:result").meta  # type: ignore[union-attr]
        assert "s3cr3t" not in str(meta)
        assert meta["url"] == server.url + "/echo/x?token=***&id=P-991"
        with pytest.raises(ResolverError) as caught:
            await session.call(leak)
    message = state["leak:error"]
    assert "HTTP 401 from leak (GET " in message
    assert "token=***" in message
    assert "bad token ***" in message  # the server echoed it back: masked too
    assert "s3cr3t" not in message
    assert "s3cr3t" not in str(caught.value)


async def test_a_secret_in_the_path_is_masked_in_the_shown_url(
    server: AvailabilityServer,
) -> None:
    state = filled({"card:number": "4111111111111111"})
    state.policy("card:*", secret=True)
    missing = Resolver.http("card", "GET", server.url + "/e404/{card:number}", retry=NO_RETRY)
    async with Session(state) as session:
        with pytest.raises(ResolverError):
            await session.call(missing)
    assert "4111" not in state["card:error"]
    assert "/e404/***" in state["card:error"]


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_a_client_error_fails_once_naming_resolver_method_url_and_status(
    server: AvailabilityServer, status: int
) -> None:
    path = f"/e{status}"
    before = server.calls.get(path, 0)
    state = filled({"slots:result": ["old"]})
    slots = Resolver.http("slots", "GET", server.url + path)
    async with Session(state) as session:
        with pytest.raises(ResolverError) as caught:
            await session.call(slots)
    assert server.calls[path] == before + 1  # not retried
    assert state["slots:error"].startswith(f"HTTP {status} from slots (GET {server.url}{path})")
    assert f"status {status}" in state["slots:error"]  # the server's own message
    assert "slots:result" not in state  # nothing half-written, the stale value gone
    cause = caught.value.__cause__
    assert isinstance(cause, HTTPCallError)
    assert (cause.status, cause.retryable, cause.server) == (status, False, server.url)


async def test_a_503_is_retried_after_the_wait_the_server_asked(
    server: AvailabilityServer, anyio_backend: str
) -> None:
    clock = ManualClock()
    slots = Resolver.http("slots", "GET", f"{server.url}/flaky/{anyio_backend}?fail=1")
    async with Session(State(), clock=clock) as session:
        began = clock.monotonic()
        run = session.dispatch(slots)
        assert await run.wait() == {"slots": ["10:00"]}
    assert run.attempts == 2
    assert clock.monotonic() - began == pytest.approx(HTTP_RETRY.backoff)


@pytest.mark.parametrize(
    ("query", "after"), [("after=2", 2.0), ("after_ms=250", 0.25)], ids=["seconds", "ms"]
)
async def test_retry_after_is_honoured_in_seconds_and_milliseconds(
    server: AvailabilityServer, query: str, after: float
) -> None:
    clock = ManualClock()
    slots = Resolver.http(
        "slots", "GET", f"{server.url}/e503?{query}", retry=Retry(attempts=2, backoff=0)
    )
    async with Session(State(), clock=clock) as session:
        began = clock.monotonic()
        run = session.dispatch(slots)
        with pytest.raises(ResolverError, match="HTTP 503"):
            await run.wait()
    assert run.attempts == 2
    assert clock.monotonic() - began == pytest.approx(after)
    assert isinstance(run.exception, HTTPCallError)
    assert run.exception.retry_after == pytest.approx(after)


async def test_a_refused_connection_is_retried_then_fails_naming_the_server() -> None:
    with availability_server() as gone:
        url = gone.url
    clock = ManualClock()
    slots = Resolver.http("slots", "GET", url + "/slots")
    async with Session(State(), clock=clock) as session:
        run = session.dispatch(slots)
        with pytest.raises(ResolverError, match="could not be reached"):
            await run.wait()
    assert run.attempts == HTTP_RETRY.attempts
    assert f"slots (GET {url}/slots) could not be reached" in run.error  # type: ignore[operator]


async def test_a_dropped_connection_is_not_retried_for_a_post(
    server: AvailabilityServer,
) -> None:
    before = server.calls.get("/hangup", 0)
    clock = ManualClock()
    post = Resolver.http("book", "POST", server.url + "/hangup", json={"a": 1})
    get = Resolver.http("look", "GET", server.url + "/hangup")
    async with Session(State(), clock=clock) as session:
        with pytest.raises(ResolverError):
            await session.dispatch(post).wait()
        assert server.calls["/hangup"] == before + 1  # it may have booked: not sent again
        with pytest.raises(ResolverError):
            await session.dispatch(get).wait()
        assert server.calls["/hangup"] == before + 1 + HTTP_RETRY.attempts


@pytest.mark.parametrize("route", ["big", "chunked"])
async def test_an_answer_over_the_size_cap_fails_and_keeps_nothing(
    server: AvailabilityServer, route: str
) -> None:
    state = State()
    big = Resolver.http("big", "GET", f"{server.url}/{route}?n=200000", max_bytes=50_000)
    small = Resolver.http("small", "GET", f"{server.url}/{route}?n=1000", max_bytes=50_000)
    async with Session(state) as session:
        with pytest.raises(ResolverError, match="larger than max_bytes=50000"):
            await session.call(big)
        assert await session.call(small) == "x" * 1000
    assert "big:result" not in state
    assert isinstance(state["big:error"], str)


async def test_output_validates_the_answer_and_writes_its_json_data(
    server: AvailabilityServer,
) -> None:
    state = filled({"d": "2026-12-02"})
    slots = Resolver.http(
        "slots", "GET", server.url + "/slots", params={"date": "{d}"}, output=Slots
    )
    wrong = Resolver.http("wrong", "GET", server.url + "/echo/x", output=Slots)
    many = Resolver.http("many", "GET", server.url + "/slots?date=x", output=dict[str, Any])
    async with Session(state) as session:
        assert await session.call(slots) == {"date": "2026-12-02", "slots": ["09:00", "09:30"]}
        with pytest.raises(ResolverError, match="does not match Slots"):
            await session.call(wrong)
        assert (await session.call(many))["date"] == "x"
    assert "wrong:result" not in state
    assert "date: Field required" in state["wrong:error"]


async def test_text_and_broken_json_answers(server: AvailabilityServer) -> None:
    text = Resolver.http("text", "GET", server.url + "/text")
    broken = Resolver.http("broken", "GET", server.url + "/notjson")
    forced = Resolver.http("forced", "GET", server.url + "/text", decode="json")
    async with Session(State()) as session:
        assert await session.call(text) == "open all day"
        with pytest.raises(ResolverError, match="is not JSON"):
            await session.call(broken)
        with pytest.raises(ResolverError, match="is not JSON"):
            await session.call(forced)


async def test_a_missing_key_fails_the_run_before_anything_is_sent(
    server: AvailabilityServer,
) -> None:
    before = server.calls.get("/slots", 0)
    slots = Resolver.http("slots", "GET", server.url + "/slots", params={"date": "{b:date}"})
    body = Resolver.http("body", "POST", server.url + "/slots", json={"d": "{b:date}"})
    async with Session(State()) as session:
        with pytest.raises(ResolverError) as caught:
            await session.call(slots)
        assert isinstance(caught.value.__cause__, TemplateError)
        with pytest.raises(ResolverError, match="b:date"):
            await session.call(body)
    assert server.calls.get("/slots", 0) == before


async def test_the_session_makes_one_pool_and_closes_it_with_itself(
    server: AvailabilityServer,
) -> None:
    state = filled({"d": "x"})
    slots = Resolver.http("slots", "GET", server.url + "/slots", params={"date": "{d}"})
    session = Session(state)
    assert not session.http.started  # no fetch yet: httpx2 not even needed
    async with session:
        await session.call(slots)
        client = session.http.client()
        await session.dispatch(slots).wait()
        assert session.http.client() is client
    assert not session.http.started
    with pytest.raises(HTTPCallError, match="pool is closed"):
        session.http.client()


async def test_a_pool_of_ones_own_limits_is_used(server: AvailabilityServer) -> None:
    pool = HTTPPool(max_connections=2)
    slots = Resolver.http("slots", "GET", server.url + "/slots?date=x", on_conflict="parallel")
    async with Session(State(), http=pool) as session:
        runs = [session.dispatch(slots) for _ in range(20)]
        for run in runs:
            await run.wait()
        assert session.http is pool
    assert all(run.status == "done" for run in runs)


async def test_outside_a_session_a_call_uses_a_client_of_its_own(
    server: AvailabilityServer,
) -> None:
    state = State()
    slots = Resolver.http("slots", "GET", server.url + "/slots?date=y")
    assert (await slots.resolve(state))["date"] == "y"


def test_bad_definitions_are_refused_when_the_resolver_is_built() -> None:
    with pytest.raises(ResolverDefinitionError, match="method"):
        Resolver.http("a", "GET /x", "http://127.0.0.1/")
    with pytest.raises(ResolverDefinitionError, match="max_bytes"):
        Resolver.http("a", "GET", "http://127.0.0.1/", max_bytes=0)
    with pytest.raises(ResolverDefinitionError, match="url"):
        Resolver.http("a", "GET", "http://127.0.0.1/{unclosed")
    with pytest.raises(ResolverDefinitionError, match="decode"):
        Resolver.http("a", "GET", "http://127.0.0.1/", decode="xml")  # type: ignore[arg-type]
    with pytest.raises(ResolverDefinitionError, match=r"json\.when"):
        Resolver.http("a", "POST", "http://127.0.0.1/", json={"when": object()})


def test_importing_slateflow_does_not_import_httpx2() -> None:
    import subprocess
    import sys

    code = (
        "import sys, slateflow, slateflow.resolve\n"
        "from slateflow import Resolver, Session, State\n"
        "Resolver.http('a', 'GET', 'http://127.0.0.1/{k}')\n"
        "Session(State())\n"
        "print('httpx2' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_missing_httpx2_is_named_when_the_resolver_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from slateflow.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "httpx2", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'slateflow\[http\]'"):
        Resolver.http("slots", "GET", "http://127.0.0.1:9/slots")
