"""OpenAIModel's wiring that needs no server: strict schemas, the lazy import of the SDK, and
the error that names the extra to install."""

from __future__ import annotations

import pytest

from slateflow.extras import require

pytest.importorskip("openai")

from slateflow.integrations.openai import OpenAIModel, strict_schema


def test_strict_is_off_by_default_for_servers_other_than_openai() -> None:
    assert OpenAIModel("m", base_url="http://127.0.0.1:9/v1").strict is False
    assert strict_schema({"type": "object", "properties": {"a": {"default": 1}}}) == {
        "type": "object",
        "properties": {"a": {}},
        "additionalProperties": False,
        "required": ["a"],
    }

    assert OpenAIModel("m", api_key="k").strict is True  # api.openai.com


def test_importing_slateflow_does_not_import_openai() -> None:
    import subprocess
    import sys

    code = "import sys, slateflow, slateflow.resolve; print('openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_missing_sdk_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from slateflow.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "openai", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'slateflow\[openai\]'"):
        OpenAIModel("gpt", api_key="k")


def test_require_names_the_extra() -> None:
    from slateflow.errors import MissingExtraError

    with pytest.raises(MissingExtraError, match=r"slateflow\[nothing\]"):
        require("slateflow_no_such_module", "nothing", "a test")


def test_a_property_called_default_is_kept_by_the_strict_rewrite() -> None:
    schema = {"type": "object", "properties": {"default": {"type": "string", "default": "x"}}}
    assert strict_schema(schema)["properties"] == {"default": {"type": "string"}}
