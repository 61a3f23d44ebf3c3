"""Retry policy for resolvers: how many attempts, how long to wait between them, what to retry."""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import ResolverDefinitionError, SlateError

__all__ = ["HTTP_RETRY", "NO_RETRY", "Retry", "RetryOn", "retry_hint", "server_retry"]

RetryOn = type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]


def retry_hint(exc: BaseException) -> tuple[bool | None, float | None]:
    """What a failure says of retrying it: its ``retryable`` attribute (True, False, or None:
    no opinion) and its ``retry_after`` (seconds the server asked to wait, or None). An
    integration's errors set them (an HTTP 429 with ``Retry-After: 2``: retryable, 2 s)."""
    retryable = getattr(exc, "retryable", None)
    after = getattr(exc, "retry_after", None)
    wait: float | None = None
    if isinstance(after, int | float) and not isinstance(after, bool):
        wait = float(after) if math.isfinite(after) and after >= 0 else None
    return (retryable if isinstance(retryable, bool) else None, wait)


def server_retry(status: int, headers: Mapping[str, str]) -> tuple[bool, float | None]:
    """What an HTTP error answer says of trying again: whether to (408, 409, 429 and 5xx yes,
    other statuses no, unless the server's ``x-should-retry: true|false`` says otherwise) and
    how long to wait first (``retry-after-ms``, or ``retry-after`` in seconds or as an HTTP
    date; None when it did not say)."""
    retryable = status in (408, 409, 429) or status >= 500
    said = headers.get("x-should-retry")
    if said in ("true", "false"):
        retryable = said == "true"
    return retryable, _retry_after(headers)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            if header == "retry-after-ms":
                continue
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                continue
            seconds = when.timestamp() - time.time()
        if math.isfinite(seconds):
            return max(0.0, seconds)
    return None


def _default_retry_on(exc: BaseException) -> bool:
    # slateflow's own errors (a missing template key, a policy refusing the result) come from the
    # state or the definition, and retrying them would only repeat them, unless the error says
    # otherwise (a model server's 429 or 503). Timeouts are retried.
    said, _ = retry_hint(exc)
    if said is not None:
        return said
    if isinstance(exc, TimeoutError):
        return True
    return isinstance(exc, Exception) and not isinstance(exc, SlateError)


@dataclass(frozen=True, slots=True)
class Retry:
    """Run a resolver up to ``attempts`` times, waiting between attempts.

    The wait before attempt ``n + 1`` is ``backoff * multiplier ** (n - 1)``, capped at
    ``max_backoff``, then reduced by up to ``jitter`` of itself at random (``jitter=0.5`` waits
    between 50% and 100% of it). Waits use the Session's clock, so a manual clock controls them.

    ``retry_on`` chooses which failures are retried: an exception class, a tuple of them, or a
    predicate. By default a failure that says whether it may be retried (a ``retryable``
    attribute, as an integration's HTTP errors have: 429 and 5xx yes, 400 / 401 / 404 no) is
    taken at its word; otherwise every ``Exception`` except slateflow's own errors is retried (a
    timeout is retried too); cancellation never is. A failure that carries ``retry_after``
    (a server's ``Retry-After``) waits at least that long, within ``max_backoff``.
    """

    attempts: int = 3
    backoff: float = 0.5
    multiplier: float = 2.0
    max_backoff: float = 30.0
    jitter: float = 0.0
    retry_on: RetryOn | None = None

    def __post_init__(self) -> None:
        if type(self.attempts) is not int or self.attempts < 1:
            raise ResolverDefinitionError(
                f"Retry(attempts={self.attempts!r}): attempts must be an int >= 1"
            )
        for field, value in (
            ("backoff", self.backoff),
            ("multiplier", self.multiplier),
            ("max_backoff", self.max_backoff),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ResolverDefinitionError(f"Retry({field}={value!r}): must be a number >= 0")
            if not math.isfinite(value):
                raise ResolverDefinitionError(f"Retry({field}={value!r}): must be finite")
        jitter = self.jitter
        if (
            isinstance(jitter, bool)
            or not isinstance(jitter, int | float)
            or not 0.0 <= jitter <= 1.0
        ):
            raise ResolverDefinitionError(f"Retry(jitter={jitter!r}): must be a number in [0, 1]")
        on = self.retry_on

        def exception_class(t: object) -> bool:
            return isinstance(t, type) and issubclass(t, BaseException)

        if on is not None and not (
            exception_class(on)
            or (isinstance(on, tuple) and on and all(exception_class(t) for t in on))
            or (callable(on) and not isinstance(on, type | tuple))
        ):
            raise ResolverDefinitionError(
                f"Retry(retry_on={on!r}): give an exception class, a tuple of them, or a "
                "predicate taking the exception"
            )

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        """Whether a failure of attempt number ``attempt`` (1-based) is retried."""
        if attempt >= self.attempts:
            return False
        on = self.retry_on
        if on is None:
            return _default_retry_on(exc)
        if isinstance(on, type | tuple):
            return isinstance(exc, on)
        return bool(on(exc))

    def delay(self, attempt: int, exc: BaseException | None = None) -> float:
        """Seconds to wait after attempt number ``attempt`` (1-based) failed (with ``exc``: at
        least the ``retry_after`` it carries, up to ``max_backoff``)."""
        wait = min(self.max_backoff, self.backoff * self.multiplier ** (attempt - 1))
        if self.jitter:
            wait -= wait * self.jitter * random.random()
        if exc is not None:
            _, after = retry_hint(exc)
            if after is not None:
                wait = min(self.max_backoff, max(wait, after))
        return wait


NO_RETRY = Retry(attempts=1)
"""One attempt, no retries (``retry=NO_RETRY`` turns off a resolver's default retries)."""

HTTP_RETRY = Retry(attempts=3, backoff=0.25, max_backoff=10.0)
"""An HTTP resolver's retries unless it is given its own: 3 attempts, 0.25 s then 0.5 s
apart, or what the server's ``Retry-After`` asks (up to 10 s)."""
