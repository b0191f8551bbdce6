"""gd2po_jax.tasks.synthetic_tools.world: the tools, their schemas and phrasings, and the texts of the world.

What the synthetic task relies on: a request names every value exactly (so the right call follows
from the text), values survive the JSON round trip the reward makes, and no text of the world can
be mistaken for a tag or break a one-call-per-line `<tool_call>` block.
"""

import json
import string

import pytest

from gd2po_jax.tasks.synthetic_tools import world as tw

KINDS = {"string": str, "integer": int, "number": float, "boolean": bool}


def _slots(template: str) -> list[str]:
    return [field for _, field, _, _ in string.Formatter().parse(template) if field]


def _render(tool: tw.Tool, template: str, values: dict) -> str:
    return template.format(**{p.name: p.say(values[p.name]) for p in tool.params})


# ---------------------------------------------------------------- Param and Tool


def test_param_schema_is_an_enum_or_a_type():
    unit = tw._enum("unit", ("celsius", "fahrenheit"))
    assert (unit.kind, unit.schema()) == ("string", {"enum": ["celsius", "fahrenheit"]})
    minute = tw._enum("minute", (0, 15), {0: "00", 15: "15"})
    assert (minute.kind, minute.schema()) == ("integer", {"enum": [0, 15]})
    assert tw._i("nights", range(2, 4)) == tw.Param("nights", "integer", (2, 3))
    assert tw._s("city", ["Oslo"]).schema() == {"type": "string"}
    assert tw._flag("remote", "remote", "on-site").schema() == {"type": "boolean"}


def test_param_says_a_value_through_its_surface():
    flag = tw._flag("breakfast", "with breakfast", "without breakfast")
    assert (flag.say(True), flag.say(False)) == ("with breakfast", "without breakfast")
    assert tw._i("nights", (2,)).say(2) == "2"
    assert tw._p("value", "number", (0.5,)).say(0.5) == "0.5"
    with pytest.raises(KeyError):
        flag.say("maybe")  # a value outside the vocabulary has no surface


def test_schema_text_is_one_json_line_in_parameter_order():
    tool = tw.TOOLS_BY_NAME["book_hotel"]
    text = tool.schema_text()
    assert "\n" not in text
    assert list(json.loads(text)) == ["city", "nights", "breakfast"]
    assert json.loads(text) == {"city": {"type": "string"}, "nights": {"type": "integer"},
                                "breakfast": {"type": "boolean"}}


# ---------------------------------------------------------------- the tools


def test_tools_are_unique_and_indexed_by_name():
    names = [t.name for t in tw.TOOLS]
    assert 30 <= len(names) <= 40
    assert len(set(names)) == len(names) == len(tw.TOOLS_BY_NAME)
    assert all(tw.TOOLS_BY_NAME[t.name] is t for t in tw.TOOLS)
    assert len({t.need for t in tw.TOOLS}) == len(tw.TOOLS)  # refusals name the right tool
    assert len({t.description for t in tw.TOOLS}) == len(tw.TOOLS)
    assert {p.kind for t in tw.TOOLS for p in t.params} == set(KINDS)


@pytest.mark.parametrize("tool", tw.TOOLS, ids=lambda t: t.name)
def test_every_template_has_one_slot_per_parameter(tool):
    names = [p.name for p in tool.params]
    assert names and len(set(names)) == len(names)
    assert len(tool.templates) >= 2
    for template in tool.templates:
        assert sorted(_slots(template)) == sorted(names), template
    assert set(tool.distinct) <= set(names)


@pytest.mark.parametrize("tool", tw.TOOLS, ids=lambda t: t.name)
def test_values_are_typed_json_scalars_that_survive_the_round_trip(tool):
    for param in tool.params:
        assert len(param.values) >= 2 and len(set(param.values)) == len(param.values), param.name
        for value in param.values:
            assert type(value) is KINDS[param.kind], (param.name, value)
            back = json.loads(json.dumps(value))
            assert back == value and type(back) is type(value), (param.name, value)


@pytest.mark.parametrize("tool", tw.TOOLS, ids=lambda t: t.name)
def test_a_request_names_each_value_exactly(tool):
    """Changing one value changes the request text, so the right call follows from the text."""
    for param in tool.params:
        surfaces = [param.say(v) for v in param.values]
        assert len(set(surfaces)) == len(surfaces), param.name
    base = {p.name: p.values[0] for p in tool.params}
    params = {p.name: p for p in tool.params}
    for i, name in enumerate(tool.distinct):  # distinct parameters start from different values
        base[name] = params[name].values[i]
    for template in tool.templates:
        for param in tool.params:
            texts = {_render(tool, template, {**base, param.name: v}) for v in param.values}
            assert len(texts) == len(param.values), (template, param.name)


def test_families_group_tools_that_serve_each_others_requests():
    families = {}
    for tool in tw.TOOLS:
        if tool.family:
            families.setdefault(tool.family, []).append(tool.name)
    assert families == {"currency": ["convert_currency", "get_exchange_rate"]}


# ---------------------------------------------------------------- texts of the world


def _world_texts():
    for tool in tw.TOOLS:
        yield tool.name, tool.description, tool.need, *tool.templates
        for param in tool.params:
            yield param.name, *(param.say(v) for v in param.values), *map(str, param.values)
    yield from tw.SMALL_TALK
    yield tw.GREETINGS + tw.INTRODUCTIONS + tw.FILLER


def test_no_text_looks_like_a_tag_or_breaks_a_call_line():
    for texts in _world_texts():
        for text in texts:
            assert "<" not in text and ">" not in text, text  # the rewards find blocks by tags
            assert "\n" not in text and "\r" not in text, text  # one call per line


def test_small_talk_and_filler_are_distinct_sentences():
    questions = [q for q, _ in tw.SMALL_TALK]
    assert len(set(questions)) == len(questions)
    assert all(reply.strip() for _, reply in tw.SMALL_TALK)
    assert len(set(tw.FILLER)) == len(tw.FILLER)
    assert all(sentence.endswith(".") for sentence in tw.FILLER)
    assert tw.INTRODUCTIONS[0] == "" and len(tw.INTRODUCTIONS) == len(tw.NAMES) + 1
