"""The conversation layer: reading what the caller said (recognizers, extractors with promotion
rules) and keeping secrets out of the transcript (redaction).

A :class:`Call` (the conversation over a Session) runs the extractors on each turn
(``call.add_extractor``, ``call.user_turn``).
Digressions, repair and voice timing are part of a flow's definition; they are re-exported here
with the rest of what a voice or chat agent needs.
"""

from ..flow import Digression, FlowStack, RepairPolicy, StackRunner, VoiceTiming
from ..resolve import Session, Turn, TurnContext
from .call import Call
from .extract import Extract, ExtractionResult, Extractor, Field, Trigger, TurnExtractor
from .llm_extract import LLMExtractor
from .promotion import Decision, Promotion, keep_known, non_empty, overwrite, true_only
from .recognizers import (
    Recognition,
    Recognizer,
    datetime,
    fuzzy,
    integer,
    integer_near,
    money,
    one_of,
    party_size,
    regex,
    yes_no,
)
from .redaction import (
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
from .tools import ToolClaim, ToolResult

__all__ = [
    "CARD",
    "EMAIL",
    "EXPIRY",
    "IBAN",
    "LONG_NUMBER",
    "REDACTED",
    "SECURITY_CODE",
    "Call",
    "Decision",
    "Digression",
    "Extract",
    "ExtractionResult",
    "Extractor",
    "Field",
    "FlowStack",
    "LLMExtractor",
    "Promotion",
    "Recognition",
    "Recognizer",
    "Redactor",
    "RepairPolicy",
    "StackRunner",
    "ToolClaim",
    "ToolResult",
    "Trigger",
    "Turn",
    "TurnContext",
    "TurnExtractor",
    "VoiceTiming",
    "datetime",
    "fuzzy",
    "integer",
    "integer_near",
    "keep_known",
    "luhn_valid",
    "money",
    "non_empty",
    "one_of",
    "overwrite",
    "party_size",
    "redact",
    "regex",
    "true_only",
    "yes_no",
]

# A session makes its conversation with this when nobody attached one (session.conversation).
Session.conversation_factory = Call

