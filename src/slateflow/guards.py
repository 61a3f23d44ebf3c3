"""Guards over the State: ``from slateflow import guards`` or ``from slateflow.guards import ...``.

The implementation lives in :mod:`slateflow.flow.guards`; this module is its public address.
"""

from .flow import guards as _guards
from .flow.guards import *  # noqa: F403  (the names are flow.guards.__all__)

__all__ = _guards.__all__
