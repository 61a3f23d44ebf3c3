"""What slateflow adds to an HTTP fetch: ``Resolver.http`` through a Session against the raw
``httpx2`` client, on the same loopback server with zero think time, paired and interleaved.

    python bench/http_bench.py [--quick]

The server (a ``ThreadingHTTPServer`` on 127.0.0.1, in this process) answers ``/slots`` with
a small JSON body at once. Measured: one fetch at a time (median of the paired rounds: the raw
``client.get`` and JSON decoding; ``session.call(Resolver.http(...))`` with the URL's query
filled from the State, the answer read within the size cap, decoded, written with
provenance); and 1,000 concurrent fetches (the raw client in a task group; the resolver
dispatched 1,000 times through one Session, ``on_conflict="parallel"``), both on a pool of
the same limits. The issue's targets: <= 100 us a call; >= 0.8x the raw client's throughput.
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
import httpx2

from slateflow import Resolver, Session, State
from slateflow.resolve import HTTPPool

BODY = json.dumps({"date": "2026-12-01", "slots": ["09:00", "09:30", "12:00"]}).encode()
CONNECTIONS = 100


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        return None

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 2048


def _limits() -> httpx2.Limits:
    return httpx2.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)


async def one_at_a_time(rounds: int, url: str) -> dict[str, float]:
    times: dict[str, list[float]] = {"raw": [], "slate": []}
    slots = Resolver.http("slots", "GET", url + "/slots", params={"date": "{day}"})
    client = httpx2.AsyncClient(limits=_limits())
    session = Session(State(), http=HTTPPool(max_connections=CONNECTIONS))
    async with client, session:
        session.state.set("day", "2026-12-01")
        for i in range(rounds + 20):  # the first 20 warm the connections up
            order = ("raw", "slate") if i % 2 else ("slate", "raw")
            for which in order:
                start = time.perf_counter()
                if which == "raw":
                    (await client.get(url + "/slots", params={"date": "2026-12-01"})).json()
                else:
                    await session.call(slots)
                if i >= 20:
                    times[which].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


async def concurrent(n: int, url: str) -> dict[str, float]:
    slots = Resolver.http(
        "slots", "GET", url + "/slots", params={"date": "{day}"}, on_conflict="parallel"
    )
    got: dict[str, list[float]] = {"raw": [], "slate": []}
    client = httpx2.AsyncClient(limits=_limits())
    session = Session(State(), http=HTTPPool(max_connections=CONNECTIONS))
    async with client, session:
        session.state.set("day", "2026-12-01")

        async def raw_one() -> None:
            (await client.get(url + "/slots", params={"date": "2026-12-01"})).json()

        for i in range(4):  # paired: raw then slateflow, then the other way round
            for which in ("raw", "slate") if i % 2 == 0 else ("slate", "raw"):
                start = time.perf_counter()
                if which == "raw":
                    async with anyio.create_task_group() as tg:
                        for _ in range(n):
                            tg.start_soon(raw_one)
                else:
                    runs = [session.dispatch(slots) for _ in range(n)]
                    for run in runs:
                        await run.wait()
                got[which].append(n / (time.perf_counter() - start))
    return {k: statistics.median(v[1:]) for k, v in got.items()}  # the first pair warms up


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (as in CI)")
    args = parser.parse_args(argv)
    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        single = anyio.run(one_at_a_time, 30 if args.quick else 400, url)
        many = anyio.run(concurrent, 200 if args.quick else 1000, url)
    finally:
        server.shutdown()
    print(f"slateflow HTTP fetch overhead (Python {sys.version.split()[0]}, loopback, medians)")
    print(f"{'measure':<52}{'value':>12}   target")
    print("-" * 76)
    print(f"{'raw httpx2 client GET + json':<52}{single['raw'] * 1e6:>9.0f} us")
    print(f"{'session.call(Resolver.http(...))':<52}{single['slate'] * 1e6:>9.0f} us")
    overhead = (single["slate"] - single["raw"]) * 1e6
    print(f"{'  overhead a call':<52}{overhead:>9.0f} us   <= 100 us")
    print(f"{'raw client, concurrent fetches':<52}{many['raw']:>9.0f} /s")
    print(f"{'Resolver.http via one Session, concurrent':<52}{many['slate']:>9.0f} /s")
    ratio = many["slate"] / many["raw"]
    print(f"{'  throughput vs the raw client':<52}{ratio:>11.2f}x   >= 0.8x")


if __name__ == "__main__":
    main()
