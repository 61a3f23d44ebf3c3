"""Guards over the State: ``from slateflow import guards`` or ``from slateflow.guards import ...``.

The implementation lives in :mod:`slateflow.flow.guards`; this module is its public address.
"""

from .flow.guards import (
    EMPTY_MARKING,
    GUARD_FORMAT,
    Explanation,
    Guard,
    Marking,
    all_,
    always,
    any_,
    called_ok,
    captured,
    custom,
    done,
    eq,
    failed,
    fresh,
    is_set,
    is_true,
    not_,
    pending,
    resolved,
)

__all__ = [
    "EMPTY_MARKING",
    "GUARD_FORMAT",
    "Explanation",
    "Guard",
    "Marking",
    "all_",
    "always",
    "any_",
    "called_ok",
    "captured",
    "custom",
    "done",
    "eq",
    "failed",
    "fresh",
    "is_set",
    "is_true",
    "not_",
    "pending",
    "resolved",
]
