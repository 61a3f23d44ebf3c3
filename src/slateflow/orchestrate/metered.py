"""Model calls charged to a budget: every call's token usage (or its estimate) and cost land in a
:class:`~slateflow.orchestrate.WorkflowBudget`, so limits and decisions act on real calls.

``MeteredLLM(llm, budget)`` wraps any :class:`~slateflow.resolve.LLM` (streaming ones too: the
usage of the final response is recorded); a :class:`~slateflow.orchestrate.SwappableLLM` given to
a workflow that has a budget is metered by the workflow itself. A call whose server reported no
usage is charged its estimate (:func:`~slateflow.resolve.estimate_usage`), never nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

from ..errors import OrchestrationError
from ..resolve.llm import LLM, LLMDelta, LLMRequest, LLMResponse, estimate_usage
from .budget import WorkflowBudget, money

__all__ = ["MeteredLLM", "charge"]


def charge(
    budget: WorkflowBudget,
    request: LLMRequest,
    response: LLMResponse,
    *,
    operator: str,
    input_per_1k: Decimal = Decimal(0),
    output_per_1k: Decimal = Decimal(0),
) -> None:
    """Record ``response``'s tokens (its usage, or the estimate when the server reported none)
    and their cost at the given prices per 1,000 tokens in ``budget``."""
    usage = response.usage if response.usage is not None else estimate_usage(request, response)
    cost = (input_per_1k * usage.input_tokens + output_per_1k * usage.output_tokens) / 1000
    budget.record(tokens=usage.total_tokens, cost=cost, operator=operator)


class MeteredLLM:
    """``llm`` with every call charged to ``budget`` (see the module docstring).

    ``input_per_1k`` / ``output_per_1k``: the price of 1,000 input / output tokens (Decimal,
    or a str or number turned into one), so ``limit_cost`` applies; ``operator`` names the
    calls in the budget's events (default: the response's model).
    """

    def __init__(
        self,
        llm: LLM,
        budget: WorkflowBudget,
        *,
        input_per_1k: Decimal | str | float = 0,
        output_per_1k: Decimal | str | float = 0,
        operator: str | None = None,
    ) -> None:
        if not callable(getattr(llm, "generate", None)):
            raise OrchestrationError(f"MeteredLLM wraps an LLM (with generate), got {llm!r}")
        if not isinstance(budget, WorkflowBudget):
            raise OrchestrationError(f"MeteredLLM charges a WorkflowBudget, got {budget!r}")
        self.llm = llm
        self.budget = budget
        self.input_per_1k = money(input_per_1k, "MeteredLLM: input_per_1k")
        self.output_per_1k = money(output_per_1k, "MeteredLLM: output_per_1k")
        self.operator = operator

    async def generate(self, request: LLMRequest, /) -> LLMResponse:
        """The wrapped model's answer, its usage charged to the budget."""
        response = await self.llm.generate(request)
        self._charge(request, response)
        return response

    async def stream(self, request: LLMRequest, /) -> AsyncIterator[LLMDelta | LLMResponse]:
        """The wrapped LLM's stream, its final response charged."""
        stream = getattr(self.llm, "stream", None)
        if not callable(stream):
            raise OrchestrationError(f"MeteredLLM: {self.llm!r} cannot stream")
        pieces: AsyncIterator[Any] = stream(request)
        try:
            async for piece in pieces:
                if isinstance(piece, LLMResponse):
                    self._charge(request, piece)
                yield piece
        finally:
            close = getattr(pieces, "aclose", None)
            if close is not None:
                await close()

    def _charge(self, request: LLMRequest, response: LLMResponse) -> None:
        charge(
            self.budget,
            request,
            response,
            operator=self.operator or response.model or "llm",
            input_per_1k=self.input_per_1k,
            output_per_1k=self.output_per_1k,
        )

    def __repr__(self) -> str:
        return f"MeteredLLM({self.llm!r})"
