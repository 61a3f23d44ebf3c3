"""Prompt templates: parsing, rendering from the state, error messages and secrets."""

from __future__ import annotations

import contextlib
import copy
import json
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import fingerprint
from slateflow import SlateError, State
from slateflow.errors import StateValueError, TemplateError
from slateflow.resolve.template import Template, render

quick = settings(deadline=None)


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def make_state(**values: Any) -> State:
    state = State()
    for key, value in values.items():
        state.set(key, value)
    return state


@pytest.fixture
def state() -> State:
    state = State()
    state.set("user:name", "Ann")
    state.set("availability:result", {"slots": ["9:00", "10:00", "11:00"]})
    state.set("files:report.pdf", {"pages": 3, "tags": ["q3", "final"]})
    state.set("prices", {"2024": 10, "items": [{"sku": "a"}, {"sku": "b"}]})
    return state


# -- literals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ""),
        ("plain text, no placeholders", "plain text, no placeholders"),
        ("{{", "{"),
        ("}}", "}"),
        ("{{user:name}}", "{user:name}"),
        ('Reply as JSON: {{"open": true}}', 'Reply as JSON: {"open": true}'),
        ("{{{{", "{{"),
        ("{{}}", "{}"),
        ("multi\nline {{ text }}\n", "multi\nline { text }\n"),
        ("unicode é ✓ {{x}}", "unicode é ✓ {x}"),
    ],
)
def test_literals_and_escaped_braces(state: State, text: str, expected: str) -> None:
    template = Template(text)
    assert template.render(state) == expected
    assert template.keys == ()


def test_escaped_braces_around_a_placeholder(state: State) -> None:
    assert Template("{{{user:name}}}").render(state) == "{Ann}"
    assert Template("a{{b}}{user:name}{{").render(state) == "a{b}Ann{"


def test_static_template_never_reads_the_state() -> None:
    # A template without placeholders has nothing to read; any object will do as the state.
    # type: ignore[arg-type]
    assert Template("no {{placeholders}}").render(object()) == "no {placeholders}"


# -- values ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Ann", "Ann"),
        ("", ""),
        ('quoted "text" with {braces}', 'quoted "text" with {braces}'),
        ("é ✓", "é ✓"),
        (3, "3"),
        (-2, "-2"),
        (0, "0"),
        (1.5, "1.5"),
        (-0.0, "-0.0"),
        (1e100, "1e+100"),
        (True, "true"),
        (False, "false"),
        (None, "null"),
        ([], "[]"),
        ({}, "{}"),
        ([1, "a", None, True, 2.5], '[1,"a",null,true,2.5]'),
        ({"open": True}, '{"open":true}'),
        ({"name": "é", "n": [1, {"x": None}]}, '{"name":"é","n":[1,{"x":null}]}'),
    ],
)
def test_strings_render_as_is_everything_else_as_compact_json(value: Any, expected: str) -> None:
    state = make_state(v=value)
    assert Template("{v}").render(state) == expected
    assert Template("<{v}>").render(state) == f"<{expected}>"
    assert expected == (value if isinstance(value, str) else compact(value))


def test_several_placeholders_and_literals(state: State) -> None:
    template = Template("Hello {user:name}, slots: {availability:result.slots}.")
    assert template.render(state) == 'Hello Ann, slots: ["9:00","10:00","11:00"].'


def test_a_value_too_long_to_render_never_reaches_a_template() -> None:
    with pytest.raises(StateValueError, match="more than 4300 digits"):
        make_state(big=10**5000)  # refused when written
    assert Template("{big}").render(make_state(big=10**4299), owner="r").startswith("1000")


# -- paths ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{availability:result.slots}", '["9:00","10:00","11:00"]'),
        ("{availability:result.slots.0}", "9:00"),
        ("{availability:result.slots.2}", "11:00"),
        ("{availability:result.slots.-1}", "11:00"),
        ("{availability:result.slots.-3}", "9:00"),
        ("{availability:result.slots.-0}", "9:00"),
        ("{prices.items.1.sku}", "b"),
        ("{prices.items.-2}", '{"sku":"a"}'),
        # On a dict an integer step is a field name.
        ("{prices.2024}", "10"),
    ],
)
def test_dotted_paths_into_dicts_and_lists(state: State, text: str, expected: str) -> None:
    assert Template(text).render(state) == expected


def test_path_to_a_null_value_is_present() -> None:
    state = make_state(doc={"x": None})
    assert Template("{doc.x?absent}").render(state) == "null"


# -- bracketed keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{[files:report.pdf]}", '{"pages":3,"tags":["q3","final"]}'),
        ("{[files:report.pdf].pages}", "3"),
        ("{[files:report.pdf].tags.-1}", "final"),
        ("{ [files:report.pdf].pages }", "3"),
        ("{[user:name]}", "Ann"),
        ("{[files:report.pdf].missing?none}", "none"),
    ],
)
def test_bracketed_keys_may_contain_dots(state: State, text: str, expected: str) -> None:
    assert Template(text).render(state) == expected


def test_bracketed_keys_with_other_reserved_characters() -> None:
    state = make_state(**{"q:what?": "why", "odd:{x}": "braces", "v1.2:notes": "n"})
    assert Template("{[q:what?]} {[odd:{x}]} {[v1.2:notes]}").render(state) == "why braces n"
    assert Template("{[q:what?]}").keys == ("q:what?",)


def test_dotted_key_without_brackets_reads_a_path_and_hints_at_brackets(state: State) -> None:
    with pytest.raises(TemplateError) as info:
        Template("{files:report.pdf}").render(state)
    message = str(info.value)
    assert "key 'files:report' is not set" in message
    assert "{[files:report.pdf]}" in message


# -- ? and defaults -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hi {user:nick?}!", "Hi !"),
        ("Hi {user:nick?there}!", "Hi there!"),
        ("Hi {user:nick ? there }!", "Hi there!"),
        ("Hi {user:nick?dear friend}!", "Hi dear friend!"),
        ("{user:nick?n/a: none, (really)}", "n/a: none, (really)"),
        ("{user:nick?.}", "."),
        ("{user:name?there}", "Ann"),
        ("{availability:result.open?}", ""),
        ("{availability:result.open?closed}", "closed"),
        ("{availability:result.slots.9?none}", "none"),
        ("{availability:result.slots.0.x?none}", "none"),
        ("{availability:result.slots.x?none}", "none"),
        ("{user:name.first?-}", "-"),
        ("{availability:result.slots.1?none}", "10:00"),
    ],
)
def test_optional_placeholders_render_their_default(state: State, text: str, expected: str) -> None:
    assert Template(text).render(state) == expected


# -- whitespace -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["{user:name}", "{ user:name }", "{user:name }", "{  user:name}", "{\n\tuser:name\n}"],
)
def test_whitespace_just_inside_the_braces_is_ignored(state: State, text: str) -> None:
    template = Template(text)
    assert template.render(state) == "Ann"
    assert template.keys == ("user:name",)


# -- syntax errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "column", "fragment"),
    [
        ("a } b", 3, "lone '}'"),
        ("}", 1, "lone '}'"),
        ("{{x}", 4, "lone '}'"),
        ("}}}", 3, "lone '}'"),
        ("abc {x", 5, "unclosed '{'"),
        ("{", 1, "unclosed '{'"),
        ("{x?abc", 1, "unclosed '{'"),
        ("{x.y ", 1, "unclosed '{'"),
        ("{}", 1, "empty placeholder"),
        ("ab { }", 4, "empty placeholder"),
        ("{a::b}", 2, "'a::b'"),
        ("{ user:* }", 3, "'user:*'"),
        ("{:a}", 2, "':a'"),
        ('{"a": 1}', 2, "literal braces"),
        ("{[abc}", 2, "unclosed '['"),
        ("{[files:report.pdf}", 2, "unclosed '['"),
        ("{[]}", 3, "empty"),
        ("{[a b]}", 3, "'a b'"),
        ("{items[0]}", 7, "'['"),
        ("{a.b[1]}", 5, "'['"),
        ("{a]}", 3, "']'"),
        ("{a.}", 4, "expected a step"),
        ("{a..b}", 4, "expected a step"),
        ("{.a}", 2, "expected a key"),
        ("{?x}", 2, "expected a key"),
        ("{a.?x}", 4, "expected a step"),
        ("{a b}", 4, "found 'b'"),
        ("{a . b}", 4, "found '.'"),
        ("{a{b}}", 3, "'{' inside a placeholder"),
        ("{a?{b}}", 4, "'{' inside a default"),
        ("{[x]y}", 5, "found 'y'"),
    ],
)
def test_syntax_errors_name_the_position(text: str, column: int, fragment: str) -> None:
    with pytest.raises(TemplateError) as info:
        Template(text)
    message = str(info.value)
    assert message.startswith(f"template syntax error at column {column}: "), message
    assert fragment in message
    # A snippet of the line with a caret under the offending character.
    snippet, caret = message.splitlines()[-2:]
    assert snippet == "    " + text
    assert caret == "    " + " " * (column - 1) + "^"


def test_syntax_errors_are_value_errors_and_slate_errors() -> None:
    with pytest.raises(ValueError, match="lone"):
        Template("}")
    with pytest.raises(SlateError):
        Template("{")


def test_syntax_error_in_a_multiline_template_gives_line_and_column() -> None:
    with pytest.raises(TemplateError, match=r"at line 3, column 5: lone '}'") as info:
        Template("first line\nsecond {ok}\nabc } def")
    assert str(info.value).splitlines()[-2:] == ["    abc } def", "        ^"]


def test_syntax_error_snippet_is_clipped_on_long_lines() -> None:
    text = "x" * 200 + " } " + "y" * 200
    with pytest.raises(TemplateError, match="column 202") as info:
        Template(text)
    snippet, caret = str(info.value).splitlines()[-2:]
    assert len(snippet) < 100
    assert snippet.startswith("    …")
    assert snippet.endswith("…")
    assert snippet[caret.index("^")] == "}"


def test_invalid_key_error_names_the_key() -> None:
    with pytest.raises(TemplateError, match=r"invalid state key 'booking::date'"):
        Template("Date: {booking::date}")


def test_template_text_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="str"):
        Template(42)  # type: ignore[arg-type]


# -- missing keys and paths -----------------------------------------------------------------


def test_missing_key_names_the_placeholder_and_the_key(state: State) -> None:
    with pytest.raises(TemplateError) as info:
        Template("Hi {user:nick}").render(state, owner="summary")
    assert str(info.value) == (
        "resolver 'summary': template placeholder {user:nick} -> key 'user:nick' is not set; "
        "set the key first, or write {user:nick?} to render it empty"
    )


def test_missing_key_without_owner_has_no_resolver_prefix(state: State) -> None:
    with pytest.raises(TemplateError) as info:
        Template("Hi { user:nick }").render(state)
    message = str(info.value)
    assert message.startswith("template placeholder { user:nick } -> key 'user:nick'")
    assert "{user:nick?}" in message


def test_missing_key_error_is_a_slate_error(state: State) -> None:
    with pytest.raises(SlateError):
        Template("{nope}").render(state)


def test_missing_field_names_the_step(state: State) -> None:
    with pytest.raises(TemplateError) as info:
        Template("{availability:result.open}").render(state, owner="summary")
    assert str(info.value).startswith(
        "resolver 'summary': template placeholder {availability:result.open} -> "
        "'availability:result' has no field 'open' (it is a dict with fields: slots)"
    )
    assert "{availability:result.open?}" in str(info.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{availability:result.slots.3}", "'availability:result.slots' has no index 3 "),
        ("{availability:result.slots.-4}", "has no index -4 (it is a list of 3 items)"),
        ("{availability:result.slots.first}", "'availability:result.slots' has no field 'first'"),
        ("{availability:result.slots.first}", "index it with a number"),
        ("{availability:result.slots.0.hour}", "'availability:result.slots.0' has no field"),
        ("{availability:result.slots.0.hour}", "(it is a string)"),
        ("{availability:result.slots.0.1}", "has no index 1 (it is a string)"),
        ("{[files:report.pdf].pages.x}", "'[files:report.pdf].pages' has no field 'x'"),
        ("{[files:report.pdf].pages.x}", "(it is a number)"),
        ("{prices.items.0.price}", "'prices.items.0' has no field 'price'"),
        ("{empty:dict.a}", "(it is an empty dict)"),
        ("{empty:list.0}", "(it is an empty list)"),
        ("{flag.a}", "(it is a boolean)"),
        ("{nothing.a}", "(it is null)"),
    ],
)
def test_missing_path_errors_name_the_failing_step(state: State, text: str, fragment: str) -> None:
    state.set("empty:dict", {})
    state.set("empty:list", [])
    state.set("flag", True)
    state.set("nothing", None)
    with pytest.raises(TemplateError) as info:
        Template(text).render(state)
    assert fragment in str(info.value)


def test_missing_path_error_lists_a_bounded_number_of_fields() -> None:
    state = make_state(big={f"field{i}": i for i in range(50)})
    with pytest.raises(TemplateError) as info:
        Template("{big.nope}").render(state)
    assert "field9, ... (40 more)" in str(info.value)
    assert "field10" not in str(info.value)


def test_first_missing_placeholder_is_reported(state: State) -> None:
    with pytest.raises(TemplateError, match=r"\{b\}"):
        Template("{user:name} {b} {c}").render(state)


# -- secrets --------------------------------------------------------------------------------

CARD = "4111-1111-1111-1111"


@pytest.fixture
def secret_state(state: State) -> State:
    state.set("user:card", CARD)
    state.set("user:wallet", {"card": CARD, "pin": 1234})
    state.policy("user:card", secret=True)
    state.policy("user:wallet", secret=True)
    return state


@pytest.mark.parametrize(
    "text",
    [
        "{user:card}",
        "Card: { user:card }",
        "{user:card?}",
        "{user:card?hidden}",
        "{[user:card]}",
        "{user:wallet.card}",
        "{user:wallet.pin?}",
        "{user:wallet.nope?}",
        "{user:wallet.nope}",
        "{user:name} {user:card}",
        "{missing} {user:card}",
    ],
)
def test_secret_keys_never_render(secret_state: State, text: str) -> None:
    with pytest.raises(TemplateError) as info:
        Template(text).render(secret_state, owner="summary")
    message = str(info.value)
    assert "is secret" in message
    assert message.startswith("resolver 'summary': template placeholder {")
    assert CARD not in message
    assert "1234" not in message
    assert CARD not in repr(info.value.args)
    assert info.value.__cause__ is None
    assert info.value.__context__ is None


def test_optional_secret_says_the_question_mark_does_not_hide_it(secret_state: State) -> None:
    with pytest.raises(TemplateError, match=r"even with '\?'"):
        Template("{user:card?}").render(secret_state)


def test_secret_key_raises_even_when_not_set() -> None:
    state = State()
    state.policy("user:*", secret=True)
    for text in ("{user:card}", "{user:card?}", "{user:card.x?none}"):
        with pytest.raises(TemplateError, match="'user:card' is secret"):
            Template(text).render(state)


def test_secrecy_is_checked_on_every_render(state: State) -> None:
    template = Template("Card: {user:card?none}")
    state.set("user:card", CARD)
    assert template.render(state) == f"Card: {CARD}"
    state.policy("user:card", secret=True)
    with pytest.raises(TemplateError, match="secret"):
        template.render(state)


def test_secret_does_not_leak_through_other_errors(secret_state: State) -> None:
    # A path error on a secret dict would list its fields; the secret check comes first.
    with pytest.raises(TemplateError) as info:
        Template("{user:wallet.nope}").render(secret_state)
    assert "pin" not in str(info.value)


# -- keys -----------------------------------------------------------------------------------


def test_keys_are_distinct_in_first_appearance_order() -> None:
    template = Template("{b} {a.x} {b?} {[c.d].e} {a} {{z}} {c} { b.y }")
    assert template.keys == ("b", "a", "c.d", "c")


def test_keys_of_a_static_template_are_empty() -> None:
    assert Template("{{x}}").keys == ()


# -- the state is only read -----------------------------------------------------------------


def test_render_does_not_mutate_the_state(secret_state: State) -> None:
    before = secret_state.snapshot()
    print_before = fingerprint(secret_state)
    texts = [
        "{user:name} {availability:result.slots.-1} {[files:report.pdf]}",
        "{nope?x}",
        "{nope}",
        "{availability:result.open}",
        "{files:report.pdf}",
        "{user:card?}",
    ]
    for text in texts:
        with contextlib.suppress(TemplateError):
            Template(text).render(secret_state, owner="r")
    assert secret_state.snapshot() == before
    assert fingerprint(secret_state) == print_before


def test_rendered_containers_are_copies(state: State) -> None:
    rendered = Template("{availability:result}").render(state)
    assert json.loads(rendered) == state.get("availability:result")


def test_each_render_sees_current_values(state: State) -> None:
    template = Template("{user:name} / {counter?none}")
    assert template.render(state) == "Ann / none"
    state.set("user:name", "Bo")
    state.set("counter", 1)
    assert template.render(state) == "Bo / 1"
    state.set("counter", {"n": 2})
    assert template.render(state) == 'Bo / {"n":2}'
    state.remove("counter")
    assert template.render(state) == "Bo / none"


def test_render_inside_a_transaction_sees_its_writes(state: State) -> None:
    template = Template("{user:name} {draft?none}")
    with state.transaction():
        state.set("draft", "d1")
        assert template.render(state) == "Ann d1"
    assert template.render(state) == "Ann d1"


# -- the object -----------------------------------------------------------------------------


def test_text_repr_equality_hash_and_pickle() -> None:
    text = "Hello {user:name}"
    template = Template(text)
    assert template.text == text
    assert repr(template) == "Template('Hello {user:name}')"
    assert template == Template(text)
    assert template != Template("Hello {user:name }")
    assert template != text
    assert hash(template) == hash(Template(text))
    assert len({template, Template(text)}) == 1
    clone = pickle.loads(pickle.dumps(template))
    assert clone == template
    assert clone.keys == template.keys
    assert copy.deepcopy(template) == template


def test_long_repr_is_clipped() -> None:
    template = Template("x" * 500)
    assert repr(template) == f"Template({'x' * 50 + '…'!r}, 500 chars)"


def test_template_is_immutable() -> None:
    template = Template("{a}")
    with pytest.raises(AttributeError):
        template.text = "{b}"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        template.other = 1  # type: ignore[attr-defined]


def test_module_render_function(state: State) -> None:
    assert render("Hi {user:name}{x?!}", state) == "Hi Ann!"
    assert render("Hi {user:name}{x?!}", state) == "Hi Ann!"
    with pytest.raises(TemplateError, match="resolver 'r': template placeholder"):
        render("{x}", state, owner="r")
    with pytest.raises(TemplateError, match="syntax error"):
        render("{", state)
    with pytest.raises(TypeError):
        render(None, state)  # type: ignore[arg-type]


# -- properties -----------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
simple_keys = st.from_regex(r"[a-z][a-z0-9_]{0,7}(:[a-z0-9_]{1,8}){0,2}", fullmatch=True)


@quick
@given(st.text())
def test_escaped_text_renders_to_itself(text: str) -> None:
    template = Template(escape(text))
    assert template.render(State()) == text
    assert template.keys == ()


@quick
@given(simple_keys, json_values, st.text(), st.text())
def test_any_json_value_renders_as_itself_or_compact_json(
    key: str, value: Any, before: str, after: str
) -> None:
    state = State()
    state.set(key, value)
    expected = value if isinstance(value, str) else compact(value)
    assert Template("{" + key + "}").render(state) == expected
    text = escape(before) + "{ " + key + " }" + escape(after)
    assert Template(text).render(state) == before + expected + after


@quick
@given(st.lists(json_values, min_size=1, max_size=6), st.data())
def test_any_list_index_renders_that_item(items: list[Any], data: st.DataObject) -> None:
    state = make_state(items=items)
    index = data.draw(st.integers(min_value=-len(items), max_value=len(items) - 1))
    item = items[index]
    expected = item if isinstance(item, str) else compact(item)
    assert Template(f"{{items.{index}}}").render(state) == expected
    assert Template(f"{{items.{len(items)}?missing}}").render(state) == "missing"
