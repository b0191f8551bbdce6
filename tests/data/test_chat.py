"""gd2po_jax/data/chat.py: prompts and SFT examples rendered through a chat template."""

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gd2po_jax.data import (
    column_tools,
    load_toolrl_sft,
    load_verl_parquet,
    parse_tools,
    render_prompt,
    render_prompts,
    render_sft_example,
)
from gd2po_jax.data.chat import check_template_kwargs
from tests.fakes import data_files
from tests.fixture_data import SYSTEM_PREFIX

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


TOOLS_TEMPLATE = (
    "{% if tools %}TOOLS{% for t in tools %} {{ t['function']['name'] }}{% endfor %}{{ '\\n' }}{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}NOTHINK\n{% endif %}" + CHAT_TEMPLATE
)
"""`CHAT_TEMPLATE` after a line naming the tools it is given and NOTHINK for enable_thinking=False."""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def chat_tokenizer(template: str = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """A word-level tokenizer (chat markers, roles, the words of `TOOLS_TEMPLATE`) with ``template``."""
    words = ["<|im_start|>", "<|im_end|>", "user", "assistant", "system", "TOOLS", "NOTHINK", "get_weather", "get_time"]
    vocab = {"[UNK]": 0} | {word: i + 1 for i, word in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<|im_end|>")
    tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


def test_render_prompt_opens_the_assistant_turn(tokenizer):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    want = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt(messages, tokenizer) == want


def test_render_prompts_of_a_loaded_dataset(tokenizer):
    ds = load_verl_parquet(data_files() / "rlla_4k" / "test.parquet").dataset.select(range(3))
    texts = render_prompts(ds["prompt"], tokenizer)
    assert len(texts) == 3
    for text, messages in zip(texts, ds["prompt"], strict=True):
        assert text.startswith(f"<|im_start|>system\n{SYSTEM_PREFIX}")
        assert messages[1]["content"] in text and text.endswith("<|im_start|>assistant\n")


def test_render_sft_example_splits_prompt_and_completion(tokenizer):
    row = load_toolrl_sft(data_files() / "rlla_4k" / "rlla_sft.json").dataset[0]
    prompt, completion = render_sft_example(row["prompt"], row["target"], tokenizer)
    assert prompt == render_prompt(row["prompt"], tokenizer)
    assert completion == row["target"] + "<|im_end|>\n"


def test_render_errors(tokenizer):
    bare = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, unk_token="[UNK]")
    with pytest.raises(ValueError, match="no chat_template"):
        render_prompt([{"role": "user", "content": "x"}], bare)
    rewriting = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer, unk_token="[UNK]"
    )
    rewriting.chat_template = (
        "{% if messages[-1]['role'] == 'assistant' %}REWRITTEN{% endif %}"
        "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    )
    with pytest.raises(ValueError, match="cannot be separated"):
        render_sft_example([{"role": "user", "content": "x"}], "y", rewriting)


def test_template_kwargs_and_tools_reach_the_template():
    tok = chat_tokenizer(TOOLS_TEMPLATE)
    messages = [{"role": "user", "content": "U"}]
    assert render_prompt(messages, tok) == "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    texts = render_prompts([messages, messages], tok, row_tools=[[WEATHER, CLOCK], None],
                           enable_thinking=False)
    assert texts[0].startswith("TOOLS get_weather get_time\nNOTHINK\n<|im_start|>user")
    assert texts[1].startswith("NOTHINK\n<|im_start|>user")  # a row without tools
    prompt, completion = render_sft_example(messages, "A", tok, tools=[WEATHER], enable_thinking=False)
    assert prompt.startswith("TOOLS get_weather\nNOTHINK\n") and completion == "A<|im_end|>\n"
    assert render_prompts([messages], tok, tools=[CLOCK]) == [render_prompt(messages, tok, tools=[CLOCK])]  # all
    with pytest.raises(ValueError, match="1 tool lists for 2 prompts"):
        render_prompts([messages, messages], tok, row_tools=[None])
    with pytest.raises(ValueError, match=r"for all prompts \(tools=\) and for each one \(row_tools=\)"):
        render_prompts([messages], tok, row_tools=[None], tools=[CLOCK])


def test_tools_of_a_column_parse_json_text_and_name_a_bad_row():
    assert parse_tools(None) is None
    assert parse_tools(json.dumps([WEATHER])) == parse_tools([WEATHER]) == [WEATHER]
    columns = {"prompt": [[], [], []], "tools": [[WEATHER], None, json.dumps([CLOCK])]}
    assert column_tools(columns, "tools", "f.jsonl") == [[WEATHER], None, [CLOCK]]
    with pytest.raises(ValueError, match=r"^f.jsonl: config.data.tools_column='tool' is not a column of the data; "
                                         r"its columns are \['prompt', 'tools'\]"):
        column_tools(columns, "tool", "f.jsonl")
    for bad, problem in [("[{", "not valid JSON"), ({"name": "x"}, "expected a list of tool schemas"),
                         (["get_weather"], "tool 0 is not a JSON-schema dict")]:
        with pytest.raises(ValueError, match=rf"^f.jsonl, row 1 \(0-based\), column 'tools' "
                                             rf"\(config.data.tools_column\): {problem}"):
            column_tools({"tools": [None, bad]}, "tools", "f.jsonl")


def test_template_arguments_the_renderer_sets_are_refused():
    assert check_template_kwargs({"enable_thinking": False}) == {"enable_thinking": False}
    with pytest.raises(ValueError, match=r"config.data.chat_template_kwargs: add_generation_prompt, tokenize cannot"):
        check_template_kwargs({"tokenize": True, "add_generation_prompt": False})
    with pytest.raises(ValueError, match="gives tools, and so does config.data.tools_column='tools'"):
        check_template_kwargs({"tools": [WEATHER]}, tools_column="tools")
