"""The conversation layer: the call a voice or chat loop talks to, and reading what the caller
said.

A :class:`Conversation` over a :class:`~slateflow.Session` takes each user turn and returns
what the model should be told now (a :class:`TurnContext`, handed over in two phases), runs the
flows that govern the call (``run_flow``), admits and runs tool calls, and hands background
results to the model without losing or repeating one when the caller interrupts. Extractors
(:class:`Extract`, :class:`LLMExtractor`) read the turns with recognizers and promotion rules;
a :class:`Redactor` keeps secrets out of the transcript.
"""

from .context import (
    DEFAULT_MAX_TRANSCRIPT,
    VOICE_TIMING_KEY,
    Handover,
    HandoverMode,
    Turn,
    TurnContext,
    end_turn,
)
from .conversation import Conversation
from .extract import Extract, ExtractionResult, Extractor, Field, Trigger, TurnExtractor
from .inbox import DEFAULT_INBOX_LIMIT, DELIVERED_KEY, Inbox
from .llm_extract import LLMExtractor
from .promotion import Decision, Promotion, keep_known, non_empty, overwrite, true_only
from .protocols import Governor, TurnHook
from .recognizers import (
    Recognition,
    Recognizer,
    choice,
    date_of_birth,
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
    BIRTH_DATE,
    CARD,
    CARD_DIGITS,
    EMAIL,
    EXPIRY,
    IBAN,
    LONG_NUMBER,
    MEMBER_ID,
    REDACTED,
    SECURITY_CODE,
    Redactor,
    luhn_valid,
    mask_spans,
    redact,
)
from .tools import ToolClaim, ToolFailed, ToolResult

__all__ = [
    "BIRTH_DATE",
    "CARD",
    "CARD_DIGITS",
    "DEFAULT_INBOX_LIMIT",
    "DEFAULT_MAX_TRANSCRIPT",
    "DELIVERED_KEY",
    "EMAIL",
    "EXPIRY",
    "IBAN",
    "LONG_NUMBER",
    "MEMBER_ID",
    "REDACTED",
    "SECURITY_CODE",
    "VOICE_TIMING_KEY",
    "Conversation",
    "Decision",
    "Extract",
    "ExtractionResult",
    "Extractor",
    "Field",
    "Governor",
    "Handover",
    "HandoverMode",
    "Inbox",
    "LLMExtractor",
    "Promotion",
    "Recognition",
    "Recognizer",
    "Redactor",
    "ToolClaim",
    "ToolFailed",
    "ToolResult",
    "Trigger",
    "Turn",
    "TurnContext",
    "TurnExtractor",
    "TurnHook",
    "choice",
    "date_of_birth",
    "datetime",
    "end_turn",
    "fuzzy",
    "integer",
    "integer_near",
    "keep_known",
    "luhn_valid",
    "mask_spans",
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
