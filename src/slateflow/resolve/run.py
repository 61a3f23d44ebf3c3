"""One run of a resolver: attempts, timeouts, retries, and the key writes every mode shares.

:class:`Run` is also the handle a Session's ``dispatch`` returns. Its ``status`` has one owner:
only the run's own transitions change it (:meth:`Run.queue`, :meth:`Run.begin`,
:meth:`Run.refused`, :meth:`Run.dropped` and the run itself as it executes), and the session's
scheduler is what calls them for dispatched runs (``tests/test_structure.py`` checks that no
other module assigns it).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.lowlevel
from anyio import TaskHandle

from .. import tracing
from ..errors import (
    ResolverCancelledError,
    ResolverError,
    ResolverTimeoutError,
    SlateError,
    WaitTimeoutError,
)
from ..state import SECRET_MASK, State
from ..state.provenance import Stamp
from .background import ToModel, is_secret_resolver
from .clock import Clock, wait_on
from .resolver import Produced, Resolver, WithMeta

if TYPE_CHECKING:
    from .background import Deliver, Scheduling

__all__ = ["Mode", "Run", "RunStatus"]

log = logging.getLogger("slateflow.resolve")

Mode = Literal["call", "dispatch", "background"]
RunStatus = Literal["queued", "running", "done", "error", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"done", "error", "cancelled"})

# A source still running this long (clock seconds) after its deadline swallowed the cancellation.
IGNORED_AFTER = 0.1

# An error message longer than this is cut, so a huge exception text cannot break a size policy.
MAX_ERROR_CHARS = 2000


def traced(run: Run) -> AbstractContextManager[object]:
    """The span of ``run`` when tracing is on (see :mod:`slateflow.tracing`): entered in the
    run's own task, around its attempts and the writing of its outcome."""
    tracer = tracing.current
    return nullcontext() if tracer is None else tracer.run(run)


def _leaked(exc: BaseException) -> bool:
    """Whether a BaseException out of a source is the source's own doing, not a cancellation of
    the task running it (nor the host's KeyboardInterrupt / SystemExit)."""
    if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
        return False
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        # A cancellation delivered to this task comes with a cancelled enclosing scope.
        return anyio.current_effective_deadline() != -math.inf and not _task_cancelling()
    return not isinstance(exc, BaseExceptionGroup) or _leaked_group(exc)


def _leaked_group(group: BaseExceptionGroup[BaseException]) -> bool:
    return all(_leaked(e) for e in group.exceptions)


def _task_cancelling() -> bool:
    """On asyncio: whether this task has a cancellation request pending."""
    import asyncio

    try:
        task = asyncio.current_task()
    except RuntimeError:
        return False  # not on asyncio
    return task is not None and task.cancelling() > 0


def error_message(exc: BaseException) -> str:
    """The readable message written to ``<name>:error`` for ``exc``."""
    text = str(exc).strip() or type(exc).__name__
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 1] + "…"
    return text


class Run:
    """One run of a resolver, and its handle: ``status``, ``cancel()``, ``await wait()``.

    ``status`` moves from ``"queued"`` (waiting its turn, ``on_conflict="queue"``) or
    ``"running"`` to exactly one of ``"done"``, ``"error"`` or ``"cancelled"``. After it ends,
    ``value`` (the source's return value), ``error`` (the message), ``exception``, ``attempts``,
    ``inputs`` (key versions read at the start of the last attempt), ``duration`` and
    ``superseded`` (cancelled because a newer run of the name took over) tell what happened.
    """

    __slots__ = (
        "_event",
        "_handle",
        "_mono",
        "_on_cancel",
        "_produced",
        "_status",
        "attempts",
        "cancel_reason",
        "clock",
        "deliver",
        "duration",
        "error",
        "exception",
        "ignored_cancel",
        "inputs",
        "mode",
        "outcome_seq",
        "resolver",
        "scheduling",
        "started_at",
        "state",
        "status",
        "superseded",
        "to_inbox",
        "value",
    )

    def __init__(
        self,
        resolver: Resolver,
        mode: Mode,
        state: State,
        clock: Clock,
        *,
        deliver: Deliver | None = None,
        scheduling: Scheduling | None = None,
    ) -> None:
        self.resolver = resolver
        self.mode: Mode = mode
        self.state = state
        self.clock = clock
        self.status: RunStatus = "running"
        """``"queued"`` or ``"running"``, then exactly one of ``"done"``, ``"error"`` or
        ``"cancelled"``. Read-only: only the run's own transitions change it."""
        self.value: Any = None
        self.error: str | None = None
        self.exception: BaseException | None = None
        self.attempts = 0
        self.inputs: dict[str, int] | None = None
        self.started_at: float | None = None
        self.duration: float | None = None
        self.superseded = False
        self.cancel_reason: str | None = None
        self.ignored_cancel = False
        self.deliver = deliver
        self.scheduling = scheduling
        # The outcome goes to a model (a conversation's deliver): on a durable state it then
        # records how to hand it over again after a restart.
        self.to_inbox = isinstance(deliver, ToModel)
        self.outcome_seq = 0  # the commit that recorded the outcome
        # The task running it (dispatch and background modes): cancel() cancels it.
        self._handle: TaskHandle[None] | None = None
        # Set by a Session: ends a queued run at once, or watches a started one wind down.
        self._on_cancel: Callable[[Run], None] | None = None
        self._event: anyio.Event | None = None
        self._mono = 0.0
        self._produced: Produced | None = None

    # -- the handle ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The resolver's name."""
        return self.resolver.name

    @property
    def done(self) -> bool:
        """Whether the run has ended (done, error or cancelled)."""
        return self.status in TERMINAL

    def cancel(self, reason: str = "cancelled") -> bool:
        """Ask the run to stop; returns False if it had already ended.

        It ends as ``"cancelled"`` at its next await (at once if it has not started).
        """
        if self.status in TERMINAL:
            return False
        if self.cancel_reason is None:
            self.cancel_reason = reason
        if self._handle is not None:
            self._handle.cancel()
        if self._on_cancel is not None:
            self._on_cancel(self)
        return True

    async def wait(self, *, raise_error: bool = True) -> Any:
        """Wait for the run to end and return its value.

        Raises :class:`~slateflow.errors.ResolverError` if it failed and
        :class:`~slateflow.errors.ResolverCancelledError` if it was cancelled; with
        ``raise_error=False`` returns the value, or None for a run that did not succeed. Waits
        on the session's clock (a ``ManualClock`` jumps to its timers; ``WaitTimeoutError``
        when nothing could ever end the run).
        """
        if self.status not in TERMINAL:
            if self._event is None:
                self._event = anyio.Event()
            # On the run's clock: under a ManualClock time jumps to the next timer while
            # every task waits, and a run nothing could ever end fails the wait.
            if await wait_on(self.clock, self._event, None) == "stuck":
                raise WaitTimeoutError(
                    f"waited for the run of resolver {self.name!r}, which cannot end: every "
                    "task is blocked and no timer is due (does its source wait for something "
                    "this task was to do?)"
                )
        if raise_error:
            if self.status == "error":
                raise self._resolver_error() from self._cause()
            if self.status == "cancelled":
                raise ResolverCancelledError(
                    f"run of resolver {self.name!r} was {self.cancel_reason or 'cancelled'}; "
                    f"read {self.resolver.status_key!r} or dispatch it again"
                )
        return self.value if self.status == "done" else None

    def __repr__(self) -> str:
        return f"<Run {self.name!r} {self.mode} {self.status}>"

    # -- transitions the scheduler drives --------------------------------------------------

    def queue(self, on_cancel: Callable[[Run], None]) -> None:
        """The run waits its turn (``on_conflict="queue"``); ``on_cancel`` ends it unstarted."""
        self.status = "queued"
        self._on_cancel = on_cancel

    def begin(self, handle: TaskHandle[None], on_cancel: Callable[[Run], None]) -> None:
        """The run started in the task ``handle``; ``on_cancel`` watches it wind down."""
        self.status = "running"
        self._handle = handle
        self._on_cancel = on_cancel

    def refused(self, exc: Exception) -> None:
        """A queued run could not start: the State refused its ``running`` status."""
        self.exception = exc
        self.error = error_message(exc)
        self.status = "error"
        self._on_cancel = None
        self.notify()

    def dropped(self) -> None:
        """A queued run ends without starting (cancelled or superseded)."""
        if self.cancel_reason is None:
            self.cancel_reason = "cancelled"
        self.status = "cancelled"
        self._on_cancel = None
        self.notify()

    # -- running ---------------------------------------------------------------------------

    async def call(self) -> Any:
        """Call mode: write ``running``, run in this task, write the outcome, return or raise."""
        with traced(self):
            self.write_running()
            try:
                await self.execute()
                if anyio.current_effective_deadline() == -math.inf:
                    # The caller was cancelled while the source ran, and the source returned
                    # anyway (it swallowed the cancellation, or never awaited after it): the
                    # run is cancelled, and the checkpoint raises the caller's cancellation.
                    self.cancel_reason = "caller cancelled"
                    self._cancelled()
                    self.write_outcome()
                    self.notify()
                    await anyio.lowlevel.checkpoint()
            except BaseException:
                self.finish_cancelled("caller cancelled")
                raise
            self.write_outcome()
        if self.status == "error":
            raise self._resolver_error() from self._cause()
        return self.value

    async def execute(self, limiter: anyio.CapacityLimiter | None = None) -> None:
        """Run the attempts; sets ``status`` to done / error / cancelled (writes nothing).

        Cancellation (of the run's task, or from outside) propagates; the caller then calls
        :meth:`finish_cancelled`. With a ``limiter``, the run first waits for a slot in it.
        """
        clock = self.clock
        self.started_at = clock.time()
        self._mono = clock.monotonic()
        self.status = "running"
        if self.cancel_reason is not None:
            # Cancelled before it started: a source that never awaits must not run at all.
            self.duration = 0.0
            self._cancelled()
            return
        resolver = self.resolver
        try:
            if limiter is not None:
                self._produced = await self._attempts(limiter)
            elif resolver.retry is None and resolver.timeout is None:
                # The common case, inlined: a frame less to allocate and run for every dispatch.
                self.attempts = 1
                state = self.state
                if resolver.reads:
                    version = state.version
                    self.inputs = {k: version(k) for k in resolver.reads}
                token = state.engine.context.push_actor(resolver.actor)
                try:
                    produced = await resolver.source(state)
                finally:
                    state.engine.context.pop_actor(token)
                self._produced = self._accept(produced)
            else:
                self._produced = await self._attempts()
        except Exception as exc:
            self.duration = clock.monotonic() - self._mono
            if self.cancel_reason is not None:
                self._cancelled()
                return
            self._failed(exc)
            return
        except BaseException as exc:
            if _leaked(exc):
                # Not a cancellation of this task: a library leaked its own (an HTTP client's
                # timeout), or a source raised a BaseException. It is this run's error; the
                # session and its other runs go on.
                self.duration = clock.monotonic() - self._mono
                self._failed(exc)
                return
            raise
        self.duration = clock.monotonic() - self._mono
        if self.cancel_reason is not None:
            # Finished after cancel() was called (before the cancellation reached it, or by
            # swallowing it): the request wins and the value is discarded.
            self._cancelled()
            return
        self.status = "done"

    def _failed(self, exc: BaseException) -> None:
        self.exception = exc
        self.error = error_message(exc)
        if not isinstance(exc, Exception):
            self.error = (
                f"{type(exc).__name__}: {self.error} (raised by the source of resolver "
                f"{self.name!r} although the run was not cancelled; it counts as this run's error)"
            )
        self.status = "error"
        self.value = None

    def _cancelled(self) -> None:
        self.status = "cancelled"
        self.value = None
        self._produced = None
        if self.cancel_reason is None:
            self.cancel_reason = "cancelled"

    async def _attempts(self, limiter: anyio.CapacityLimiter | None = None) -> Produced:
        resolver = self.resolver
        retry = resolver.retry
        attempt = 0
        while True:
            attempt += 1
            try:
                if limiter is None:
                    return self._accept(await self._attempt(attempt))
                # A slot is held while a source runs, not while it waits out a backoff.
                async with limiter:
                    if attempt == 1:
                        # Measured from when it may run, not from when it was queued.
                        self.started_at = self.clock.time()
                        self._mono = self.clock.monotonic()
                    return self._accept(await self._attempt(attempt))
            except Exception as exc:
                if retry is None or not retry.should_retry(exc, attempt):
                    raise
                failed = exc
                log.debug(
                    "resolver %r attempt %d failed, retrying: %s",
                    resolver.name,
                    attempt,
                    type(exc).__name__ if self._secret() else repr(exc),
                )
            assert retry is not None
            await self.clock.sleep(retry.delay(attempt, failed))

    def _accept(self, produced: Any) -> Produced:
        """Split what a source returned into value and extra provenance, and check the value.

        (The State validates and copies the value itself when it is written.)
        """
        if type(produced) is WithMeta:
            value, extra = produced.value, produced.meta
        else:
            value, extra = produced, None
        check = self.resolver.check
        if check is not None:
            check(value)
        self.value = value
        return value, extra

    async def _attempt(self, attempt: int) -> Any:
        resolver = self.resolver
        state = self.state
        self.attempts = attempt
        if resolver.reads:
            version = state.version
            self.inputs = {k: version(k) for k in resolver.reads}
        token = state.engine.context.push_actor(resolver.actor)
        try:
            timeout = resolver.timeout
            if timeout is None:
                return await resolver.source(state)
            begin = self.clock.monotonic()
            with self.clock.deadline(timeout) as scope:
                produced = await resolver.source(state)
            if not scope.cancel_called:
                return produced
            overrun = self.clock.monotonic() - begin - timeout
            if not scope.cancelled_caught and overrun >= IGNORED_AFTER:
                self._report_ignored(overrun)
        finally:
            state.engine.context.pop_actor(token)
        raise ResolverTimeoutError(
            f"resolver {resolver.name!r} timed out after {timeout:g}s (attempt {attempt}); "
            "raise its timeout or make the source faster"
        )

    def _report_ignored(self, overrun: float) -> None:
        self.ignored_cancel = True
        log.warning(
            "resolver %r timed out but its source ignored the cancellation and ran %.3gs past "
            "its timeout; its value is discarded. Do not catch cancellation (BaseException) in "
            "a source.",
            self.name,
            overrun,
        )

    def _secret(self) -> bool:
        return is_secret_resolver(self.state, self.name)

    def _resolver_error(self) -> ResolverError:
        attempts = f" after {self.attempts} attempts" if self.attempts > 1 else ""
        error = SECRET_MASK if self._secret() else self.error or ""
        return ResolverError(
            f"resolver {self.name!r} failed{attempts}: {error} "
            f"(the message is in {self.resolver.error_key!r})",
            name=self.name,
            error=error,
            attempts=self.attempts,
        )

    def _cause(self) -> BaseException | None:
        # A secret resolver's exception usually quotes what it was about, and a chained cause is
        # printed with every traceback: it stays on ``run.exception`` only.
        return None if self._secret() else self.exception

    # -- the key writes --------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        started = self.started_at if self.started_at is not None else self.clock.time()
        meta: dict[str, Any] = {
            "mode": self.mode,
            # Unix seconds: formatting a datetime would cost as much as the rest of the write.
            "started_at": round(started, 6),
            "duration": round(self.duration or 0.0, 6),
        }
        if self.inputs is not None:
            meta["inputs"] = self.inputs
        if self.to_inbox and self.state.store is not None:
            meta["inbox"] = True
            meta["scheduling"] = (
                self.scheduling.value if self.scheduling is not None else "when_idle"
            )
        return meta

    def _commit(
        self,
        writes: dict[str, Any],
        removes: tuple[str, ...],
        meta: dict[str, Any],
        refresh: frozenset[str] = frozenset(),
    ) -> int:
        # The meta is built here from JSON values only, so the stamp skips re-validating it.
        resolver = self.resolver
        stamp = Stamp(resolver.kind, resolver.name, None, meta)
        return self.state.engine.commit_owned(writes, removes, stamp, self.mode, refresh=refresh)

    def write_running(self) -> None:
        """``<name>:status = "running"``; raises (writing nothing) if governance refuses it."""
        resolver = self.resolver
        state = self.state
        if state.store is not None:
            # A durable state remembers how the run was started, so a restart can re-dispatch
            # it the same way (session.resume) if it never finished.
            meta: dict[str, Any] = {"mode": self.mode}
            if self.scheduling is not None:
                meta["scheduling"] = str(self.scheduling.value)
            self._commit({resolver.status_key: "running"}, (), meta)
            return
        state.engine.commit_owned({resolver.status_key: "running"}, (), resolver.stamp, self.mode)

    def write_outcome(self, *, status: bool = True) -> None:
        """Write the ended run's keys in one batch (without the status key if ``status=False``).

        If the State refuses the result (a schema, a size cap), the run becomes an error
        instead; if it refuses even that, the status alone is written, and failing that the
        problem is logged. The keys never stay ``running`` because of a refused write.
        """
        resolver = self.resolver
        if self.status == "done":
            assert self._produced is not None
            value, extra = self._produced
            meta = self._meta()
            meta["attempt"] = self.attempts
            if extra:
                meta.update(extra)
            if resolver.ttl is not None:
                meta["ttl"] = resolver.ttl
            writes = {resolver.result_key: value}
            if status:
                writes[resolver.status_key] = "done"
            try:
                # An equal value from a new run is still written: its age and inputs are new.
                removes = (resolver.error_key, *self._partial(), *self._failures())
                self.outcome_seq = self._commit(writes, removes, meta, resolver.refresh_result)
                return
            except SlateError as exc:
                self.exception = exc
                self.error = error_message(exc)
                self.status = "error"
                self.value = None
        if self.status == "error":
            meta = self._meta()
            meta["attempts"] = self.attempts
            meta["exception"] = type(self.exception).__name__ if self.exception else "Exception"
            writes = {resolver.error_key: self.error}
            if status:
                writes[resolver.status_key] = "error"
                failures = self.state.get(resolver.failures_key, 0)
                writes[resolver.failures_key] = (failures if type(failures) is int else 0) + 1
            try:
                self.outcome_seq = self._commit(
                    writes, (resolver.result_key, *self._partial()), meta, resolver.refresh_error
                )
                return
            except SlateError as exc:
                log.error("resolver %r: its error could not be written: %s", self.name, exc)
        elif self.status != "cancelled":
            return
        if status:
            meta = self._meta()
            if self.status == "cancelled":
                meta["reason"] = self.cancel_reason or "cancelled"
            try:
                removes = self._partial()
                self.outcome_seq = self._commit({resolver.status_key: self.status}, removes, meta)
            except SlateError as exc:
                log.error("resolver %r: its status could not be written: %s", self.name, exc)

    def _failures(self) -> tuple[str, ...]:
        # A success ends a run of failures: "failed twice" counts failures in a row.
        key = self.resolver.failures_key
        return (key,) if key in self.state else ()

    def _partial(self) -> tuple[str, ...]:
        # A streaming run's answer so far goes with it: it was never the result.
        key = self.resolver.partial_key
        return (key,) if key is not None and key in self.state else ()

    def finish_cancelled(self, reason: str, *, write: bool = True) -> None:
        """End as cancelled because the surrounding scope was cancelled (session exit, caller)."""
        if self.status in TERMINAL:
            return
        if self.duration is None:
            self.duration = self.clock.monotonic() - self._mono if self._mono else 0.0
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self._cancelled()
        if write:
            self.write_outcome()
        self.notify()

    def notify(self) -> None:
        """Wake tasks waiting in :meth:`wait` (called once the run has ended)."""
        if self._event is not None:
            self._event.set()
