"""Chaos: thousands of random dispatches, and every run still ends exactly once.

Issue 3, "Reliability": random delays, failures, timeouts, retries, supersessions and
cancellations, on asyncio and trio, with a :class:`ManualClock` so every case is deterministic
and fast. After each session the checker asserts that

- every run ended in exactly one of done / error / cancelled, and never changed afterwards;
- the keys of every name match its last run (see :meth:`Harness.check_keys` for what "last"
  means under each ``on_conflict`` policy), and every write along the way came from a run that
  owned the keys at that moment;
- a background run's ``deliver`` was called exactly once, with the run's outcome;
- no source or delivery outlives the session, and ``active_count`` is 0.

Who wrote what is observed through a journal sink: the State feeds sinks synchronously inside
the commit, in the committing thread, so at that moment exactly the runs that have ended so far
are terminal. Each dispatch gets its own Resolver object (same name) whose source knows its
dispatch number ``k`` and returns ``{"k": k, "a": attempt}``, so results are attributable.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from anyio.abc import TaskGroup
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slateflow import ManualClock, Resolver, Retry, Scheduling, Session, State
from slateflow.errors import DispatchRejectedError, ResolverCancelledError, ResolverError
from slateflow.resolve import BackgroundResult, Run
from slateflow.state import Change

pytestmark = pytest.mark.chaos

NAMES = ("n0", "n1", "n2", "n3")
POLICIES = ("latest", "queue", "parallel", "reject")
TERMINAL = frozenset({"done", "error", "cancelled"})
# ok: return after the delay; fail: raise after it; hang: sleep past the timeout (or long);
# linger: on cancellation, keep working briefly (shielded) and then re-raise it;
# ignore: on cancellation, swallow it and return a value at once (the run must still end).
KINDS = ("ok", "ok", "ok", "fail", "fail", "hang", "linger", "ignore")
DELAYS = (0.0, 0.0, 0.1, 0.3, 0.7, 1.5)  # 0.0: "ok" and "fail" return / raise without awaiting
TIMEOUTS = (None, None, 0.5, 1.0, 2.0)
BACKOFFS = (0.0, 0.1, 0.5)
STEPS = (0.0, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0)
SCHEDULINGS = tuple(s.value for s in Scheduling)
DELIVERS = ("sync", "sync", "async", "raise")
HANG_WITHOUT_TIMEOUT = 6.0
LINGER = 0.2
EXIT_TICK = 0.5
# Real seconds a whole scenario may take before it counts as hung.
REAL_LIMIT = 120.0


# -- operations ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    kind: str
    delay: float


@dataclass(frozen=True)
class Submit:
    """``session.dispatch`` (or ``session.background``) of a fresh resolver named NAMES[name]."""

    name: int
    on_conflict: str | None  # the per-call override; None uses the resolver's own policy
    own_policy: str
    timeout: float | None
    retry: int  # Retry(attempts=retry), 0 for no Retry at all
    backoff: float
    plan: tuple[Attempt, ...]  # behaviour of attempt 1, 2, ... (the last one repeats)
    background: bool = False
    scheduling: str = "when_idle"
    deliver: str = "sync"


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class CancelName:
    name: int


@dataclass(frozen=True)
class CancelRun:
    pick: int  # which run in flight (modulo how many there are)


@dataclass(frozen=True)
class CancelAll:
    pass


@dataclass(frozen=True)
class ThreadWrite:
    value: int


@dataclass(frozen=True)
class Wait:
    pick: int  # a task awaits run.wait() of this run (any run so far, modulo)


Op = Submit | Advance | CancelName | CancelRun | CancelAll | ThreadWrite | Wait


@dataclass(frozen=True)
class Config:
    max_concurrency: int | None = None
    on_exit: str = "cancel"
    # How the session block ends: normally, by an outer cancel scope, or by an exception.
    leave: str = "normally"


class Boom(Exception):
    """Raised in the session block to leave it by an exception."""


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]


# -- the harness --------------------------------------------------------------------------------


@dataclass(eq=False)
class Rec:
    """What the test knows about one accepted dispatch."""

    k: int
    name: str
    op: Submit
    policy: str
    run: Run = field(init=False)
    started: bool = False  # wrote <name>:status = "running" (a queued run may never start)
    end_epoch: int = -1  # when it was first seen ended
    end_rank: int = 0  # 1 if it wrote a key in the commit where it was first seen ended
    snapshot: tuple[Any, ...] | None = None
    kinds: list[str] = field(default_factory=list)  # the behaviour of each attempt run
    ends: list[str] = field(default_factory=list)  # how each attempt ended: raise/return/cancel
    swallowed: int = 0
    deliveries: list[BackgroundResult] = field(default_factory=list)
    waits: list[tuple[str, Any]] = field(default_factory=list)


def snap(run: Run) -> tuple[Any, ...]:
    return (run.status, run.value, run.error, run.superseded, run.attempts)


class Sink:
    """A journal sink: called inside every commit, in the committing thread.

    The State reports (and swallows) what a sink raises, so a failed check is kept and
    re-raised by the driver.
    """

    def __init__(self, harness: Harness) -> None:
        self.h = harness

    def record(self, changes: Iterable[Change]) -> None:
        touched: dict[str, list[Change]] = {}
        for m in changes:
            name, _, part = m.key.partition(":")
            if name in self.h.pending and part in ("status", "result", "error"):
                touched.setdefault(name, []).append(m)
        if not touched:
            return  # the other thread's write
        try:
            assert threading.get_ident() == self.h.loop_thread, "a resolver key written off-loop"
            for name, changes in touched.items():
                self.h.on_commit(name, changes)
        except BaseException as exc:
            self.h.sink_errors.append(exc)
            raise


class Harness:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.clock = ManualClock()
        self.state = State(clock=self.clock, sinks=[Sink(self)])
        self.loop_thread = threading.get_ident()
        self.session: Session | None = None
        self.outer: TaskGroup | None = None
        self.recs: list[Rec] = []
        self.by_name: dict[str, list[Rec]] = {n: [] for n in NAMES}
        self.pending: dict[str, list[Rec]] = {n: [] for n in NAMES}
        self.epoch = 0
        self.live = 0  # sources and async deliveries running now
        self.finished: list[anyio.Event] = []  # one per source call / delivery, set in finally
        self.next_k = 0
        self.accepted = 0
        self.rejected = 0
        self.cancels = 0
        self.deliver_raised = 0
        self.failures_reported = 0
        self.exited = False
        self.live_at_exit = -1
        self.sink_errors: list[BaseException] = []
        self.state.receiver_failed.connect(self._receiver_failed, weak=False)

    def _receiver_failed(self, sender: object, **kwargs: Any) -> None:
        self.failures_reported += 1

    # -- observation ----------------------------------------------------------------------

    def _collect(self, name: str) -> list[Rec]:
        """Runs of ``name`` seen ended for the first time now (they get this epoch)."""
        newly: list[Rec] = []
        still: list[Rec] = []
        for rec in self.pending[name]:
            status = rec.run.status
            if status in TERMINAL:
                rec.end_epoch = self.epoch
                rec.snapshot = snap(rec.run)
                newly.append(rec)
            else:
                if status == "running":
                    rec.started = True
                still.append(rec)
        self.pending[name] = still
        return newly

    def on_commit(self, name: str, changes: list[Change]) -> None:
        """A commit of ``name``'s keys: check that a run that may write them wrote them."""
        assert self.session is not None
        self.epoch += 1
        newly = self._collect(name)
        owners = [r for r in newly if r.started and not r.run.superseded]
        for change in changes:
            part = change.key.partition(":")[2]
            new = change.new
            if part == "status" and new == "running":
                # A queued run starting: popped from the queue, its handle not yet "running".
                in_flight = self.session.runs(name)
                starting = [
                    r
                    for r in self.pending[name]
                    if r.run.status == "queued" and not any(r.run is x for x in in_flight)
                ]
                assert len(starting) <= 1, (name, starting)
                for r in starting:
                    r.started = True
                continue
            if change.removed:
                continue
            if part == "result":
                k = new["k"]
                writer = [r for r in owners if r.k == k]
                assert writer, f"{name}:result of dispatch {k} written by no owning run: {newly}"
                (rec,) = writer
                assert rec.run.status == "done", rec
                assert rec.run.value == new, rec
            elif part == "error":
                writer = [r for r in owners if r.run.status == "error" and r.run.error == new]
                assert writer, f"{name}:error {new!r} written by no owning failed run: {newly}"
            else:
                assert new in TERMINAL, (name, new)
                writer = [r for r in owners if r.run.status == new]
                assert writer, f"{name}:status={new!r} written by no owning run: {newly}"
                # The terminal status is written only when no other owning run is in flight.
                still_owning = [
                    r for r in self.session.runs(name) if r.status != "queued" and not r.superseded
                ]
                assert not still_owning, (name, new, still_owning)
            for rec in writer:
                rec.end_rank = 1

    def observe(self) -> None:
        """Between two driver operations: nothing is half-way through ending."""
        assert self.session is not None
        if self.sink_errors:
            raise self.sink_errors[0]
        self.epoch += 1
        in_flight = 0
        for name in NAMES:
            self._collect(name)
            in_flight += len(self.pending[name])
            # A superseded run still winding down writes nothing: the name is not busy for it.
            owners = [rec for rec in self.pending[name] if not rec.run.superseded]
            assert self.session.is_running(name) == bool(owners), name
        assert self.session.active_count == in_flight
        assert {id(r) for r in self.session.runs()} == {
            id(rec.run) for recs in self.pending.values() for rec in recs
        }

    # -- sources and deliveries -----------------------------------------------------------

    def source(self, rec: Rec) -> Any:
        clock = self.clock
        plan = rec.op.plan
        timeout = rec.op.timeout

        async def behave(state: State, kind: str, delay: float, attempt: int) -> Any:
            state.get("ext:x")
            value = {"k": rec.k, "a": attempt}
            if delay == 0.0 and kind in ("ok", "fail"):
                # A source that never awaits.
                if kind == "fail":
                    raise RuntimeError(f"boom k={rec.k} a={attempt}")
                return value
            if kind == "fail":
                await clock.sleep(delay)
                raise RuntimeError(f"boom k={rec.k} a={attempt}")
            if kind == "hang":
                await clock.sleep(delay + (timeout or HANG_WITHOUT_TIMEOUT) + 1.0)
            elif kind == "linger":
                try:
                    await clock.sleep(delay)
                except anyio.get_cancelled_exc_class():
                    rec.swallowed += 1
                    with anyio.CancelScope(shield=True):
                        await clock.sleep(LINGER)
                        await anyio.lowlevel.checkpoint()
                    raise
            elif kind == "ignore":
                try:
                    await clock.sleep(delay)
                except anyio.get_cancelled_exc_class():
                    rec.swallowed += 1  # and returns as if nothing happened
            else:
                await clock.sleep(delay)
            return value

        async def fetch(state: State) -> Any:
            attempt = len(rec.kinds) + 1
            step = plan[min(attempt, len(plan)) - 1]
            rec.kinds.append(step.kind)
            self.live += 1
            finished = anyio.Event()
            self.finished.append(finished)
            end = "cancel"
            try:
                value = await behave(state, step.kind, step.delay, attempt)
                end = "return"
                return value
            except Exception:
                end = "raise"
                raise
            finally:
                rec.ends.append(end)
                self.live -= 1
                finished.set()

        return fetch

    def deliver(self, rec: Rec) -> Any:
        kind = rec.op.deliver
        if kind == "async":

            async def adeliver(result: BackgroundResult) -> None:
                rec.deliveries.append(result)
                self.live += 1
                finished = anyio.Event()
                self.finished.append(finished)
                try:
                    await self.clock.sleep(0.05)
                finally:
                    self.live -= 1
                    finished.set()

            return adeliver

        def deliver(result: BackgroundResult) -> None:
            rec.deliveries.append(result)
            if kind == "raise":
                self.deliver_raised += 1
                raise RuntimeError("deliver failed (on purpose)")

        return deliver

    async def waiter(self, rec: Rec) -> None:
        try:
            value = await rec.run.wait()
        except ResolverCancelledError:
            rec.waits.append(("cancelled", None))
        except ResolverError as exc:
            rec.waits.append(("error", exc.error))
        else:
            rec.waits.append(("done", value))

    # -- the operations -------------------------------------------------------------------

    def submit(self, op: Submit) -> None:
        session = self.session
        assert session is not None
        name = NAMES[op.name]
        policy = op.on_conflict or op.own_policy
        rec = Rec(self.next_k, name, op, policy)
        self.next_k += 1
        resolver = Resolver.fetch(
            name,
            self.source(rec),
            reads=["ext:x"],
            timeout=op.timeout,
            retry=Retry(attempts=op.retry, backoff=op.backoff) if op.retry else None,
            on_conflict=op.own_policy,
        )
        busy = session.is_running(name)
        before = session.runs(name)
        try:
            if op.background:
                ack = session.background(
                    resolver,
                    self.deliver(rec),
                    op.scheduling,
                    on_conflict=op.on_conflict,
                )
                assert ack == {"status": "running", "resolver": name}
                new = [r for r in session.runs(name) if not any(r is b for b in before)]
                assert len(new) == 1, new
                run = new[0]
            else:
                run = session.dispatch(resolver, on_conflict=op.on_conflict)
        except DispatchRejectedError:
            assert busy, (name, policy)
            assert policy == "reject", (name, policy)
            self.rejected += 1
            return
        assert not (busy and policy == "reject"), "dispatched although busy with 'reject'"
        self.accepted += 1
        rec.run = run
        assert run.name == name
        if busy and policy == "queue":
            assert run.status == "queued"
        else:
            assert run.status == "running"
            assert self.state.get(f"{name}:status") == "running"
            rec.started = True
        if policy == "latest":
            # Every earlier run of the name was superseded (a queued one ended at once).
            for old in self.pending[name]:
                assert old.run.superseded, old
        self.recs.append(rec)
        self.by_name[name].append(rec)
        self.pending[name].append(rec)

    async def apply(self, op: Op) -> None:
        session = self.session
        assert session is not None
        if isinstance(op, Submit):
            self.submit(op)
        elif isinstance(op, Advance):
            await self.clock.advance(op.seconds)
        elif isinstance(op, CancelName):
            name = NAMES[op.name]
            expected = len(self.pending[name])
            assert session.cancel(name) == expected
            self.cancels += expected
        elif isinstance(op, CancelRun):
            flying = [rec for recs in self.pending.values() for rec in recs]
            if flying:
                rec = flying[op.pick % len(flying)]
                assert rec.run.cancel() is True
                self.cancels += 1
        elif isinstance(op, CancelAll):
            flying = sum(len(recs) for recs in self.pending.values())
            assert session.cancel_all() == flying
            self.cancels += flying
        elif isinstance(op, ThreadWrite):
            await anyio.to_thread.run_sync(self.state.set, "ext:x", op.value)
        elif isinstance(op, Wait) and self.recs:
            assert self.outer is not None
            self.outer.start_soon(self.waiter, self.recs[op.pick % len(self.recs)])

    async def ticker(self) -> None:
        # While the session closes: lingering sources, async deliveries and on_exit="wait"
        # need the manual clock to move.
        while not self.exited:
            await self.clock.advance(EXIT_TICK)

    async def run(self, ops: Iterable[Op], quota: int | None = None) -> None:
        config = self.config
        with anyio.fail_after(REAL_LIMIT):
            async with anyio.create_task_group() as outer:
                self.outer = outer
                try:
                    with anyio.CancelScope() as host:
                        async with Session(
                            self.state,
                            clock=self.clock,
                            max_concurrency=config.max_concurrency,
                            on_exit=config.on_exit,
                        ) as session:
                            self.session = session
                            try:
                                for op in ops:
                                    if quota is not None and self.accepted >= quota:
                                        break
                                    await self.apply(op)
                                    self.observe()
                            finally:
                                # Also when a check fails: lingering sources need the clock
                                # to move for the session to close and the failure to show.
                                outer.start_soon(self.ticker)
                            if config.leave == "cancelled":
                                host.cancel()
                                await anyio.lowlevel.checkpoint()
                                raise AssertionError("not cancelled")  # pragma: no cover
                            if config.leave == "raising":
                                raise Boom
                except BaseException as exc:
                    # Only the block's own exception comes out: no resolver's, no delivery's.
                    if config.leave != "raising" or not all(
                        isinstance(leaf, Boom) for leaf in leaves(exc)
                    ):
                        raise
                else:
                    assert config.leave != "raising", "the block's exception was lost"
                finally:
                    self.live_at_exit = self.live
                    self.exited = True
        self.check()

    # -- the checks -----------------------------------------------------------------------

    def check(self) -> None:
        session = self.session
        assert session is not None
        if self.sink_errors:
            raise self.sink_errors[0]
        # No task outlives the session.
        assert self.live_at_exit == 0
        assert all(event.is_set() for event in self.finished)
        assert session.active_count == 0
        assert session.runs() == []
        self.epoch += 1
        for name in NAMES:
            self._collect(name)
            assert not self.pending[name], self.pending[name]
        for rec in self.recs:
            self.check_run(rec)
        for name in NAMES:
            self.check_keys(name)
        assert self.failures_reported == self.deliver_raised

    def check_run(self, rec: Rec) -> None:
        run = rec.run
        op = rec.op
        # Exactly one terminal status, and it never changed after it was first seen.
        assert run.status in TERMINAL, rec
        assert run.done
        assert rec.snapshot == snap(run), (rec, rec.snapshot, snap(run))
        assert run.attempts == len(rec.kinds), (rec, run.attempts, rec.kinds)
        assert run.attempts <= max(op.retry, 1), rec
        if run.status == "done":
            assert run.value == {"k": rec.k, "a": run.attempts}, rec
            assert run.error is None
            assert not run.superseded
        elif run.status == "error":
            assert run.value is None
            # Everything the sources raise is retried, so an error used up every attempt.
            assert run.attempts == max(op.retry, 1), rec
            if rec.ends[-1] == "raise":
                assert run.error == f"boom k={rec.k} a={run.attempts}", rec
            else:
                assert "timed out" in (run.error or ""), (rec, run.error)
            assert not run.superseded
        else:
            assert run.value is None
            assert run.cancel_reason, rec
        if run.superseded:
            assert run.status == "cancelled"
        if not rec.started:
            assert run.status == "cancelled", rec
            assert run.attempts == 0, rec
        # A task waiting on the handle was woken, with the same outcome.
        for kind, value in rec.waits:
            assert kind == run.status, rec
            expected = {"done": run.value, "error": run.error, "cancelled": None}[kind]
            assert value == expected, rec
        # Background mode: delivered exactly once, with the outcome.
        if op.background:
            assert len(rec.deliveries) == 1, (rec, rec.deliveries)
            (result,) = rec.deliveries
            reported = {"done": "completed", "error": "error", "cancelled": "cancelled"}
            assert result.name == rec.name
            assert result.status == reported[run.status]
            assert result.value == (run.value if run.status == "done" else None)
            assert result.error == (run.error if run.status == "error" else None)
            assert result.superseded == run.superseded
            assert result.attempts == run.attempts
            assert result.scheduling == ("silent" if run.superseded else op.scheduling)
        else:
            assert rec.deliveries == []

    def check_keys(self, name: str) -> None:
        """The final keys of ``name`` are those of its last run.

        The runs that may write the keys are those that started (wrote ``running``) and were
        not superseded. "Last" is the order in which they ended: with "latest" that is the most
        recently dispatched accepted run (every earlier one was superseded), with "queue" the
        last one in the queue, with "parallel" the last to finish. ``<name>:status`` is the
        status of the last one; ``<name>:result`` / ``<name>:error`` come from the last one
        that ended done or error (a cancelled run leaves them as they were).
        """
        state = self.state
        owners = [r for r in self.by_name[name] if r.started and not r.run.superseded]
        order = sorted(owners, key=lambda r: (r.end_epoch, r.end_rank))
        status = state.get(f"{name}:status")
        if not order:
            assert status is None, (name, status)
            return
        last = order[-1]
        assert status == last.run.status, (name, status, last)
        outcomes = [r for r in order if r.run.status in ("done", "error")]
        if not outcomes:
            assert f"{name}:result" not in state
            assert f"{name}:error" not in state
            return
        final = outcomes[-1]
        run = final.run
        if run.status == "done":
            assert state.get(f"{name}:result") == run.value, (name, final)
            assert f"{name}:error" not in state
            prov = state.provenance(f"{name}:result")
            assert prov is not None
            assert prov.writer == name
            assert prov.meta["attempt"] == run.attempts
            assert prov.meta["mode"] == ("background" if final.op.background else "dispatch")
        else:
            assert state.get(f"{name}:error") == run.error, (name, final)
            assert f"{name}:result" not in state
            prov = state.provenance(f"{name}:error")
            assert prov is not None
            assert prov.writer == name
            assert prov.meta["attempts"] == run.attempts


# -- generating operations ----------------------------------------------------------------------


def random_submit(rng: random.Random) -> Submit:
    return Submit(
        name=rng.randrange(len(NAMES)),
        on_conflict=rng.choice((None, *POLICIES)),
        own_policy=rng.choice(POLICIES),
        timeout=rng.choice(TIMEOUTS),
        retry=rng.choice((0, 0, 1, 2, 3)),
        backoff=rng.choice(BACKOFFS),
        plan=tuple(
            Attempt(rng.choice(KINDS), rng.choice(DELAYS)) for _ in range(rng.randint(1, 3))
        ),
        background=rng.random() < 0.25,
        scheduling=rng.choice(SCHEDULINGS),
        deliver=rng.choice(DELIVERS),
    )


def random_ops(rng: random.Random) -> Iterator[Op]:
    while True:
        r = rng.random()
        if r < 0.45:
            yield random_submit(rng)
        elif r < 0.75:
            yield Advance(rng.choice(STEPS))
        elif r < 0.83:
            yield CancelRun(rng.randrange(1_000))
        elif r < 0.87:
            yield CancelName(rng.randrange(len(NAMES)))
        elif r < 0.93:
            yield Wait(rng.randrange(1_000_000))
        elif r < 0.935:
            yield CancelAll()
        elif r < 0.95:
            yield ThreadWrite(rng.randrange(100))
        else:
            yield Advance(0.0)


LEAVES = ("normally", "cancelled", "raising")


# -- the tests ----------------------------------------------------------------------------------

SEEDS = (
    (1, Config(None, "cancel", "normally")),
    (2, Config(2, "wait", "normally")),
    (3, Config(1, "cancel", "cancelled")),
    (4, Config(5, "wait", "raising")),
)
PER_SEED = 2_600  # accepted dispatches per seed: 4 x 2,600 >= 10,000 per backend


@pytest.mark.anyio
async def test_chaos_ten_thousand_dispatches_end_exactly_once() -> None:
    total = rejected = background = cancels = 0
    statuses: dict[str, int] = {"done": 0, "error": 0, "cancelled": 0}
    superseded = swallowed = retried = 0
    for seed, config in SEEDS:
        rng = random.Random(seed)
        harness = Harness(config)
        await harness.run(random_ops(rng), quota=PER_SEED)
        total += harness.accepted
        rejected += harness.rejected
        cancels += harness.cancels
        for rec in harness.recs:
            statuses[rec.run.status] += 1
            background += rec.op.background
            superseded += rec.run.superseded
            swallowed += rec.swallowed > 0
            retried += rec.run.attempts > 1
    assert total >= 10_000
    # The mix really exercised every path (not just a pile of instant successes).
    assert min(statuses.values()) >= 500, statuses
    assert min(rejected, background, cancels, superseded, swallowed, retried) >= 100, (
        rejected,
        background,
        cancels,
        superseded,
        swallowed,
        retried,
    )


attempts_st = st.builds(Attempt, kind=st.sampled_from(KINDS), delay=st.sampled_from(DELAYS))
submit_st = st.builds(
    Submit,
    name=st.integers(0, len(NAMES) - 1),
    on_conflict=st.sampled_from((None, *POLICIES)),
    own_policy=st.sampled_from(POLICIES),
    timeout=st.sampled_from(TIMEOUTS),
    retry=st.integers(0, 3),
    backoff=st.sampled_from(BACKOFFS),
    plan=st.lists(attempts_st, min_size=1, max_size=3).map(tuple),
    background=st.booleans(),
    scheduling=st.sampled_from(SCHEDULINGS),
    deliver=st.sampled_from(DELIVERS),
)
op_st: st.SearchStrategy[Op] = st.one_of(
    submit_st,
    submit_st,
    st.builds(Advance, st.sampled_from(STEPS)),
    st.builds(Advance, st.sampled_from(STEPS)),
    st.builds(CancelRun, st.integers(0, 20)),
    st.builds(CancelName, st.integers(0, len(NAMES) - 1)),
    st.builds(Wait, st.integers(0, 50)),
    st.just(CancelAll()),
    st.builds(ThreadWrite, st.integers(0, 9)),
)
config_st = st.builds(
    Config,
    max_concurrency=st.sampled_from((None, 1, 2, 5)),
    on_exit=st.sampled_from(("cancel", "wait")),
    leave=st.sampled_from(LEAVES),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(config_st, st.lists(op_st, max_size=80))
def test_chaos_property_every_run_ends_once(config: Config, ops: list[Op]) -> None:
    for backend in ("asyncio", "trio"):

        async def body() -> None:
            await Harness(config).run(ops)

        anyio.run(body, backend=backend)


# -- found while writing the chaos test -----------------------------------------------------------


@pytest.mark.anyio
async def test_retry_backoff_does_not_hold_a_concurrency_slot() -> None:
    """max_concurrency caps running sources: a run waiting out its backoff holds no slot."""
    clock = ManualClock()
    state = State(clock=clock)

    async def down(state: State) -> Any:
        raise RuntimeError("down")

    async def quick(state: State) -> Any:
        return "ok"

    async with Session(state, clock=clock, max_concurrency=1) as session:
        flaky = session.dispatch(Resolver.fetch("a", down, retry=Retry(attempts=2, backoff=30)))
        await clock.advance(0)
        assert flaky.attempts == 1  # failed once, now sleeping 30 s before its second attempt
        other = session.dispatch(Resolver.fetch("b", quick))
        await clock.advance(1)
        assert flaky.status == "running"
        assert other.status == "done"
