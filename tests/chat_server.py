"""A real HTTP server on 127.0.0.1 speaking the OpenAI chat-completions wire format (JSON and
SSE streaming), for the integration tests: what it answers is chosen by the request's model.

- ``hello``: "Hello there!" with usage (streamed: four pieces, then a usage chunk, ``[DONE]``);
- ``nousage``: the same without usage;
- ``tools``: two parallel tool calls (streamed: their arguments in pieces);
- ``json``: a JSON answer for a schema;
- ``cut``: streamed, two pieces, then the connection closes (no finish, no ``[DONE]``);
- ``e429`` / ``e503ms`` / ``e400`` / ``e401`` / ``e404``: that status (429 with
  ``Retry-After: 2``, 503 with ``retry-after-ms: 250``), an OpenAI error body;
- ``flaky``: 503 the first time, then ``hello``;
- ``agent``: a scripted restaurant agent (see ``_agent``), for the agent-loop example;
- ``slow``: the first streamed piece only once the test sets ``first_token`` (a
  ``threading.Event``; the server gives up waiting after ``SAFETY`` seconds).

A request whose assistant tool call is not followed by its tool result is refused with a 400,
as real servers refuse it.

Every request body is kept in ``requests``.
"""

from __future__ import annotations

import json
import re
import threading
from contextlib import AbstractContextManager
from typing import Any

from loopback import LoopbackHandler, LoopbackServer, serving


class ChatServer(LoopbackServer):
    def __init__(self) -> None:
        super().__init__(_Handler)
        self.requests: list[dict[str, Any]] = []
        self.calls: dict[str, int] = {}
        self.first_token = threading.Event()
        self.first_token.set()

    @property
    def url(self) -> str:
        return f"{self.base}/v1"


def chat_server() -> AbstractContextManager[ChatServer]:
    return serving(ChatServer())


SAFETY = 10.0
"""How long ``slow`` holds its first piece at most, should a test never release it."""

ERRORS = {"e429": 429, "e503ms": 503, "e400": 400, "e401": 401, "e404": 404}


class _Handler(LoopbackHandler):
    server: ChatServer

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        self.server.requests.append(body)
        model = str(body.get("model"))
        n = self.server.calls[model] = self.server.calls.get(model, 0) + 1
        if model == "flaky" and n == 1:
            self._error(503, {"retry-after-ms": "100"})
            return
        unanswered = _unanswered_tool_calls(body.get("messages", []))
        if unanswered:
            # As real servers do: an assistant tool call must be followed by its tool result.
            self._error(400, {}, f"tool_call_ids did not have response messages: {unanswered}")
            return
        if model in ERRORS:
            status = ERRORS[model]
            headers = {"retry-after": "2"} if status == 429 else {}
            if model == "e503ms":
                headers = {"retry-after-ms": "250"}
            self._error(status, headers)
            return
        if model == "agent":
            self._message(model, _agent(body))
        elif body.get("stream"):
            self._stream(model, body)
        else:
            self._json(model)

    # -- answers ---------------------------------------------------------------------------

    def _json(self, model: str) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": "Hello there!"}
        if model == "tools":
            message = {"role": "assistant", "content": None, "tool_calls": TOOL_CALLS}
        elif model == "json":
            message = {"role": "assistant", "content": '{"day": "friday", "party": 4}'}
        self._message(model, message)

    def _message(self, model: str, message: dict[str, Any]) -> None:
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        payload: dict[str, Any] = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1767225600,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        if model != "nousage":
            payload["usage"] = {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, model: str, body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        if model == "slow":
            self.server.first_token.wait(SAFETY)
        if model == "tools":
            deltas: list[dict[str, Any]] = [
                {"role": "assistant", "tool_calls": [_piece(0, TOOL_CALLS[0], 0, 10)]},
                {"tool_calls": [_piece(0, TOOL_CALLS[0], 10, None)]},
                {"tool_calls": [_piece(1, TOOL_CALLS[1], 0, None)]},
            ]
            finish = "tool_calls"
        else:
            deltas = [{"role": "assistant", "content": ""}]
            deltas += [{"content": p} for p in ("Hel", "lo ", "there", "!")]
            finish = "stop"
        if model == "cut":
            for delta in deltas[:3]:
                self._event(self._chunk(model, delta, None))
            self.wfile.flush()
            self.close_connection = True
            return
        for delta in deltas:
            self._event(self._chunk(model, delta, None))
        self._event(self._chunk(model, {}, finish))
        include = (body.get("stream_options") or {}).get("include_usage")
        if include and model != "nousage":
            usage = {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}
            self._event({**self._chunk(model, {}, None), "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _chunk(self, model: str, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1767225600,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def _event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()

    def _error(self, status: int, headers: dict[str, str], message: str = "") -> None:
        text = message or f"scripted {status}"
        data = json.dumps(
            {"error": {"message": text, "type": "test", "code": str(status)}}
        ).encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _agent(body: dict[str, Any]) -> dict[str, Any]:
    """A scripted restaurant agent: reads the caller's last line (or the last tool result) and
    the instructions, and calls only the tools it was offered, as a model does."""
    messages = body.get("messages", [])
    system = next((m["content"] for m in messages if m.get("role") == "system"), "")
    offered = {t["function"]["name"] for t in body.get("tools") or []}
    last = messages[-1] if messages else {}

    def say(text: str) -> dict[str, Any]:
        return {"role": "assistant", "content": text}

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if name not in offered:
            return say(f"(I may not call {name} now.)")
        n = sum(len(m.get("tool_calls") or []) for m in messages)
        fn = {"name": name, "arguments": json.dumps(arguments)}
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": f"call_{n}", "type": "function", "function": fn}],
        }

    if last.get("role") == "tool":
        called = {
            c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or []
        }
        name = called.get(last.get("tool_call_id"), "")
        if name == "note_booking":
            return say("Let me check which times are free that day.")
        if name == "choose_time":
            booking = re.search(r"Booking: ([^\n]*)", system)
            return say(f"To confirm: {booking.group(1) if booking else '?'} Is that right?")
        if name == "confirm":
            return call("book", {})
        if name == "book":
            return say("You're booked. Goodbye!")
        return say("Done.")
    text = str(last.get("content") or "")
    wanted = re.search(r"table for (\d+).*?(\d{4}-\d{2}-\d{2})", text)
    if wanted:
        return call("note_booking", {"party": int(wanted.group(1)), "day": wanted.group(2)})
    if "what times" in text.lower():
        free = re.search(r"Free times: \[([^\]]*)\]", system)
        if free is None:
            return say("I'm still checking.")
        return say("We have " + ", ".join(json.loads(f"[{free.group(1)}]")) + ".")
    picked = re.search(r"\b(\d\d:\d\d)\b", text)
    if picked:
        return call("choose_time", {"time": picked.group(1)})
    if text.lower().startswith("yes"):
        return call("confirm", {"yes": True})
    return say("Sorry, could you say that again?")


def _unanswered_tool_calls(messages: list[dict[str, Any]]) -> list[str]:
    open_calls: list[str] = []
    for message in messages:
        if message.get("role") == "tool":
            if message.get("tool_call_id") in open_calls:
                open_calls.remove(message["tool_call_id"])
            continue
        if open_calls:
            return open_calls
        open_calls = [c["id"] for c in message.get("tool_calls") or []]
    return open_calls


TOOL_CALLS = [
    {
        "id": "call_a",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"day": "friday"}'},
    },
    {
        "id": "call_b",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"day": "saturday"}'},
    },
]


def _piece(index: int, call: dict[str, Any], start: int, end: int | None) -> dict[str, Any]:
    arguments = call["function"]["arguments"][start:end]
    piece: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if start == 0:
        piece["id"] = call["id"]
        piece["type"] = "function"
        piece["function"]["name"] = call["function"]["name"]
    return piece
