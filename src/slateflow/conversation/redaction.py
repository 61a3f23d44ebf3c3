"""Transcript redaction: card numbers, security codes, e-mails, IBANs and long digit runs,
written or spoken, never reach the State or a model.

The implementation lives in the state layer (``slateflow.state.redaction``), so the Session can
apply it to every user turn by default; this is its address in the conversation layer.
"""

from ..state.redaction import (
    CARD,
    EMAIL,
    EXPIRY,
    IBAN,
    LONG_NUMBER,
    REDACTED,
    SECURITY_CODE,
    Redactor,
    luhn_valid,
    redact,
)

__all__ = [
    "CARD",
    "EMAIL",
    "EXPIRY",
    "IBAN",
    "LONG_NUMBER",
    "REDACTED",
    "SECURITY_CODE",
    "Redactor",
    "luhn_valid",
    "redact",
]
