"""The flow layer: guards over the State that conversation steps wait on."""

from . import guards
from .guards import *  # noqa: F403  (the names are guards.__all__)

__all__ = guards.__all__
