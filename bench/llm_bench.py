"""What slateflow adds to a model call: an ``llm`` resolver over ``OpenAIModel`` against the raw
``openai`` client, on the same loopback server with zero think time, paired and interleaved.

    python bench/llm_bench.py [--quick]

The server (a ``ThreadingHTTPServer`` on 127.0.0.1, in this process) answers every chat
completion at once: the JSON form with usage, or an SSE stream of four pieces. Measured per
call (median of the paired rounds): the raw SDK call; the same through
``session.call(Resolver.llm(...))`` (request rendered from the State, the call, the key writes
with provenance); and for streams, the time to the first piece both ways. The issue's targets:
<= 150 us overhead a call, <= 100 us on the time to the first token.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio

from slateflow import Resolver, Session, State
from slateflow.integrations.openai import OpenAIModel

COMPLETION = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()


def _chunk(delta: dict[str, Any], finish: str | None) -> bytes:
    payload = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


STREAM = (
    b"".join(_chunk({"content": p}, None) for p in ("o", "k", " ", "!"))
    + _chunk({}, "stop")
    + b"data: [DONE]\n\n"
)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        return None

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as separate writes: without this, the client's delayed ACK
        # adds 40 ms to every answer (zero think time means zero).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        data, kind = (STREAM, "text/event-stream") if body.get("stream") else (COMPLETION, "json")
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


async def bench(rounds: int, url: str) -> dict[str, float]:
    model = OpenAIModel("bench", base_url=url)
    client = model.client
    ask = Resolver.llm("ask", model, "Say {word}")
    times: dict[str, list[float]] = {k: [] for k in ("raw", "slate", "raw_ttft", "slate_ttft")}
    messages = [{"role": "user", "content": "Say ok"}]
    async with Session(State()) as session:
        session.state.set("word", "ok")
        first: list[float] = []

        def heard(_: str) -> None:
            if not first:
                first.append(time.perf_counter())

        stream = Resolver.llm(
            "say", model, "Say {word}", stream=True, on_partial=heard, partial_key=False
        )
        for i in range(rounds + 20):  # the first 20 warm the connection up
            order = ("raw", "slate") if i % 2 else ("slate", "raw")
            for which in order:
                start = time.perf_counter()
                if which == "raw":
                    await client.chat.completions.create(model="bench", messages=messages)
                else:
                    await session.call(ask)
                if i >= 20:
                    times[which].append(time.perf_counter() - start)
            for which in order:
                start = time.perf_counter()
                if which == "raw":
                    chunks = await client.chat.completions.create(
                        model="bench", messages=messages, stream=True
                    )
                    got = None
                    async for _ in chunks:
                        if got is None:
                            got = time.perf_counter()
                    ttft = (got or start) - start
                else:
                    first.clear()
                    await session.call(stream)
                    ttft = first[0] - start
                if i >= 20:
                    times[f"{which}_ttft"].append(ttft)
    await model.aclose()
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (as in CI)")
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        got = anyio.run(bench, 30 if args.quick else 400, url)
    finally:
        server.shutdown()
    print(f"slateflow llm overhead (Python {sys.version.split()[0]}, loopback, medians)")
    print(f"{'measure':<52}{'value':>10}   target")
    print("-" * 72)
    rows = [
        ("raw openai client call", got["raw"], ""),
        ("session.call(Resolver.llm(OpenAIModel))", got["slate"], ""),
        ("  overhead a call", got["slate"] - got["raw"], "<= 150 us"),
        ("raw client stream, time to first piece", got["raw_ttft"], ""),
        ("streaming resolver, time to first on_partial", got["slate_ttft"], ""),
        ("  overhead on the first token", got["slate_ttft"] - got["raw_ttft"], "<= 100 us"),
    ]
    for name, seconds, target in rows:
        print(f"{name:<52}{seconds * 1e6:>7.0f} us   {target}")


if __name__ == "__main__":
    main()
