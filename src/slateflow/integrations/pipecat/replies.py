"""Which context each reply on a pipecat call was spoken from: :class:`Replies`.

The steering processor writes a context into the ``LLMContext`` before the model runs; the tap,
further down the pipeline, sees the reply's words later, and an interruption reaches the tap
after the steering may already have written the next turn's context. So the two keep one ledger,
in *epochs*: every interruption the steering sees starts a new one, and each context it writes is
tagged with the epoch it was written in; the tap counts the interruptions it sees, so it knows
which epoch's replies it is hearing. A reply's words confirm the oldest pending context of that
epoch (the model had it); an interruption confirms the one whose words were cut off mid-way and
drops the others of its epoch, which never reached the caller (their results are told again,
and the message that carried them leaves the ``LLMContext``, so the model does not act on a
line the caller never heard).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ...conversation import Conversation, TurnContext

__all__ = ["Replies"]


class Replies:
    """The contexts written for one call and not yet answered, by epoch (see the module)."""

    __slots__ = ("_open", "conversation", "forget", "steered", "tapped")

    def __init__(
        self, conversation: Conversation, forget: Callable[[dict[str, Any]], None]
    ) -> None:
        self.conversation = conversation
        self.forget = forget
        """Takes a dropped context's message out of the ``LLMContext``."""
        self.steered = 0
        """Interruptions the steering processor has seen (the epoch it writes in)."""
        self.tapped = 0
        """Interruptions the tap has seen (the epoch it hears)."""
        self._open: deque[tuple[int, TurnContext, dict[str, Any] | None]] = deque()

    @property
    def waiting(self) -> bool:
        """Whether a context written for the model has not been answered yet."""
        self._prune()
        return bool(self._open)

    def written(self, context: TurnContext, message: dict[str, Any] | None = None) -> None:
        """The steering wrote ``context`` for the model (pending until answered), in
        ``message`` when it added one to the ``LLMContext``."""
        if context.status == "pending":
            self._open.append((self.steered, context, message))

    def interruption_steered(self) -> None:
        """An interruption passed the steering: what it writes from now on is a new epoch."""
        self.steered += 1

    def spoke(self, words: str) -> None:
        """A reply was spoken (``words``: up to where it ended): the oldest pending context of
        the epoch the tap hears was the one it answered."""
        answered = self._answered()
        if words.strip():
            self.conversation.agent_said(words.strip(), context=answered)
        elif answered is not None:
            answered.handed_over()

    def carried(self) -> set[str]:
        """The lines that contexts of the current epoch, still unanswered, carry in messages
        of the ``LLMContext``: a context written after them need not repeat them (if the
        interruption that drops them comes, it drops the new one too)."""
        self._prune()
        return {
            line
            for epoch, context, message in self._open
            if epoch == self.steered and message is not None
            for line in context.lines
        }

    def acted(self) -> None:
        """The model answered with a tool call: it got the oldest pending context."""
        answered = self._answered()
        if answered is not None:
            answered.handed_over()

    def interruption_tapped(self, words: str) -> None:
        """An interruption reached the tap after ``words`` of the reply were spoken: that
        reply's context was heard (as far as it went); the other contexts of the epoch never
        reached the caller and are dropped."""
        if words.strip():
            self.spoke(words)
        epoch = self.tapped
        while self._open and self._open[0][0] <= epoch:
            _, context, message = self._open.popleft()
            if context.status == "pending":
                context.dropped()
                if message is not None:
                    self.forget(message)
        self.tapped += 1

    def _answered(self) -> TurnContext | None:
        self._prune()
        if self._open and self._open[0][0] <= self.tapped:
            return self._open.popleft()[1]
        return None

    def _prune(self) -> None:
        # A context concluded elsewhere (a turn built after it, the goodbye) is no longer open.
        while self._open and self._open[0][1].status != "pending":
            self._open.popleft()
