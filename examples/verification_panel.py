"""A verification panel: ``python examples/verification_panel.py`` (``--trio`` for trio).

Three reviewers read a draft in parallel, a judge weighs their reviews, and the writer revises
until the judge approves, within a token budget. The shape of the work is code (a
``Workflow`` over an executor), not a model's choice, so it is reproducible and bounded; every
step's outcome also lands in the State, where a guard could wait on it. The agents here are
fakes that answer from rules; put LLM-backed agents behind the same ``LocalExecutor``.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio

from slateflow import State
from slateflow.orchestrate import (
    AgentStepSpec,
    LocalExecutor,
    LoopDecision,
    StepOutcome,
    Workflow,
    WorkflowBudget,
)

REVIEWERS = {
    "facts": "mentions the time",
    "tone": "is polite",
    "sources": "cites the booking system",
}
CHECKS = {
    "mentions the time": lambda draft: "19:30" in draft,
    "is polite": lambda draft: "please" in draft.lower() or "thank" in draft.lower(),
    "cites the booking system": lambda draft: "booking system" in draft,
}
REVISIONS = {
    "mentions the time": " Your table is at 19:30.",
    "is polite": " Thank you for calling.",
    "cites the booking system": " (Confirmed in the booking system.)",
}


def agents(budget: WorkflowBudget) -> LocalExecutor:
    """The reviewers, the judge and the writer; each records the tokens it 'used'."""

    def review(spec: AgentStepSpec) -> dict[str, Any]:
        budget.record(tokens=120, operator=spec.agent)
        want = REVIEWERS[spec.agent]
        draft = str(spec.input)
        return {"reviewer": spec.agent, "ok": CHECKS[want](draft), "wants": want}

    def judge(spec: AgentStepSpec) -> dict[str, Any]:
        budget.record(tokens=80, operator="judge")
        reviews: list[dict[str, Any]] = spec.input  # type: ignore[assignment]
        missing = [r["wants"] for r in reviews if not r["ok"]]
        return {"approved": not missing, "missing": missing}

    def write(spec: AgentStepSpec) -> str:
        budget.record(tokens=150, operator="writer")
        draft, missing = spec.input  # type: ignore[misc]
        # A careful writer fixes one thing per revision.
        return str(draft) + REVISIONS[missing[0]]

    return LocalExecutor(
        {"facts": review, "tone": review, "sources": review, "judge": judge, "writer": write},
        concurrency=3,
    )


async def verify(draft: str, token_limit: int, say: Any = print) -> tuple[str, bool, State]:
    """Run the panel on ``draft``; returns the final draft, whether it was approved, and the
    State holding every step's outcome."""
    state = State()
    budget = WorkflowBudget(limit_tokens=token_limit, workflow="panel", state=state)
    workflow = (
        Workflow.builder(agents(budget)).with_id("panel").with_budget(budget).with_store(state)
    ).build()
    current: dict[str, Any] = {"draft": draft, "round": 0, "approved": False}

    def reviews_of(text: str) -> list[AgentStepSpec]:
        n = current["round"]
        say(f"round {n}: {text!r}")
        return [AgentStepSpec(task_id=f"r{n}_{name}", agent=name, input=text) for name in REVIEWERS]

    async def judge_and_revise(reviews: list[StepOutcome]) -> LoopDecision[Any]:
        # After each round of reviews (run in parallel by the loop): the judge, then a revision.
        n = current["round"]
        if not all(r.success for r in reviews):
            say("  the budget ran out: the panel stops")
            return LoopDecision.stop()
        verdict = await workflow.phase(
            f"judge {n}",
            [AgentStepSpec(task_id=f"j{n}", agent="judge", input=[r.structured for r in reviews])],
        )
        if not verdict[0].success:
            say("  the budget ran out before the verdict")
            return LoopDecision.stop()
        judged: dict[str, Any] = verdict[0].structured  # type: ignore[assignment]
        if judged["approved"]:
            current["approved"] = True
            say("  approved")
            return LoopDecision.stop()
        say(f"  the judge wants: {', '.join(judged['missing'])}")
        revision = await workflow.phase(
            f"revise {n}",
            [
                AgentStepSpec(
                    task_id=f"w{n}", agent="writer", input=[current["draft"], judged["missing"]]
                )
            ],
        )
        if not revision[0].success:
            say("  the budget ran out before the revision")
            return LoopDecision.stop()
        current["draft"] = revision[0].output
        current["round"] = n + 1
        return LoopDecision.continue_(reviews_of(current["draft"]))

    # The loop: reviews in parallel, then judge_and_revise, until approved, out of budget, or
    # five rounds (the cap is mandatory: a panel that never approves must end).
    await workflow.loop(reviews_of(draft), judge_and_revise, 5)
    snap = budget.snapshot()
    say(f"tokens: {snap.consumed_tokens} of {snap.limit_tokens}; exhausted: {snap.exhausted}")
    say("milestones: " + ", ".join(f"{e.type}" for e in workflow.history))
    workflow.close()
    return str(current["draft"]), bool(current["approved"]), state


async def main(say: Any = print) -> tuple[bool, bool]:
    """The panel twice: with enough tokens it approves; with too few it stops in time."""
    say("== with a budget of 3,000 tokens")
    _, approved, _ = await verify("Your booking is confirmed.", 3000, say)
    say("== with a budget of 600 tokens")
    _, starved, _ = await verify("Your booking is confirmed.", 600, say)
    return approved, starved


if __name__ == "__main__":
    anyio.run(main, backend="trio" if "--trio" in sys.argv else "asyncio")
