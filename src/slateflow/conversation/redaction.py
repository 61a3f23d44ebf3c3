"""Transcript redaction: card numbers and long digit runs never reach the State or a model.

The implementation lives in the state layer (``slateflow.state.redaction``), so the Session can
apply it to every user turn by default; this is its address in the conversation layer.
"""

from ..state.redaction import CARD, LONG_NUMBER, luhn_valid, redact

__all__ = ["CARD", "LONG_NUMBER", "luhn_valid", "redact"]
