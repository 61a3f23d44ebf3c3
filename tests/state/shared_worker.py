"""A worker process for the multi-process tests: ``python shared_worker.py URL CALL N``.

It connects to the call, waits for ``go`` (so every worker starts together), then adds one to
``count`` N times with ``modify`` and N times with a transaction (retried on conflict, as an
app would), and prints how many times each function ran.
"""

from __future__ import annotations

import sys

from slateflow import State
from slateflow.errors import VersionConflictError


def main() -> None:
    url, call_id, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    runs = 0

    def add(value: int) -> int:
        nonlocal runs
        runs += 1
        return value + 1

    with State.connect(url, call_id) as state:
        print("ready", flush=True)
        sys.stdin.readline()  # the test says go
        for _ in range(n):
            state.modify("count", 0, add)
        retries = 0
        for _ in range(n):
            while True:
                try:
                    with state.transaction() as tx:
                        tx.set("tx_count", tx.get("tx_count", 0) + 1)
                    break
                except VersionConflictError:
                    retries += 1
        print(f"modify ran {runs} times, transactions retried {retries} times", flush=True)


if __name__ == "__main__":
    main()
