"""Tests of gd2po_jax.data.prompts: prompt rendering, the seeded epoch order and its resumption."""

import json
import pickle

import datasets
import pytest

from gd2po_jax.data.loaders import load_jsonl
from gd2po_jax.data.prompts import EpochSampler, PromptSet, build_prompt_set, padded_batches
from tests.data.test_chat import CLOCK, TOOLS_TEMPLATE, WEATHER, chat_tokenizer
from tests.fakes import EchoTokenizer


def _dataset(contents):
    return datasets.Dataset.from_dict({
        "prompt": [[{"role": "user", "content": c}] for c in contents],
        "ground_truth": [f"gt{i}" for i in range(len(contents))],
    })


def test_build_prompt_set_renders_tokenizes_and_keeps_columns():
    prompts = build_prompt_set(_dataset(["ab", "cde"]), EchoTokenizer(), max_prompt_tokens=10, where="f.jsonl")
    assert prompts.texts == ["ab>", "cde>"]
    assert prompts.token_ids[1] == [ord(c) for c in "cde>"]
    assert prompts.columns == {"prompt": [[{"role": "user", "content": c}] for c in ("ab", "cde")],
                               "ground_truth": ["gt0", "gt1"]}  # every column: reward models read the messages
    assert prompts.max_tokens == 4
    picked = prompts.select([1, 1, 0])
    assert picked.texts == ["cde>", "cde>", "ab>"] and picked.columns["ground_truth"] == ["gt1", "gt1", "gt0"]
    with pytest.raises(ValueError, match=r"f.jsonl, row 1 \(0-based\): the prompt has 4 tokens, more than "
                                         r"config.data.max_prompt_tokens=3"):
        build_prompt_set(_dataset(["ab", "cde"]), EchoTokenizer(), max_prompt_tokens=3, where="f.jsonl")


def test_left_truncation_keeps_the_last_tokens_of_a_long_prompt_and_the_whole_text(caplog):
    prompts = build_prompt_set(_dataset(["ab", "cdefg"]), EchoTokenizer(), max_prompt_tokens=4, where="f.parquet",
                               truncation="left")
    assert prompts.token_ids == [[ord(c) for c in "ab>"], [ord(c) for c in "efg>"]]  # verl's data.truncation=left
    assert prompts.texts == ["ab>", "cdefg>"] and prompts.columns["prompt"][1][0]["content"] == "cdefg"
    assert "f.parquet: 1 of 2 prompts are longer than config.data.max_prompt_tokens=4" in caplog.text
    with pytest.raises(ValueError, match=r"row 1 \(0-based\): the prompt has 6 tokens"):
        build_prompt_set(_dataset(["ab", "cdefg"]), EchoTokenizer(), max_prompt_tokens=4, where="f", truncation=None)


def test_a_data_column_may_not_take_the_name_of_the_sampled_ids():
    dataset = _dataset(["ab"]).add_column("response_ids", [[1, 2]])
    with pytest.raises(ValueError, match="f.jsonl: a data column is named 'response_ids'"):
        build_prompt_set(dataset, EchoTokenizer(), max_prompt_tokens=10, where="f.jsonl")


def _jsonl(tmp_path, records) -> datasets.Dataset:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return load_jsonl(path).dataset


def test_the_data_files_own_columns_reach_the_prompt_set(tmp_path):
    dataset = _jsonl(tmp_path, [{"prompt": "2+2?", "answer": 4}, {"prompt": "Spell 4", "answer": "four", "hint": "f"}])
    prompts = build_prompt_set(dataset, EchoTokenizer(), max_prompt_tokens=10, where="d.jsonl")
    assert prompts.columns["answer"] == [4, "four"] and prompts.columns["hint"] == [None, "f"]
    assert prompts.columns["prompt_text"] == ["2+2?", "Spell 4"] and "extra_columns" not in prompts.columns
    assert prompts.select([1, 0, 1]).columns["answer"] == ["four", 4, "four"]
    # The loaders refuse it; an extra column of a dataset built by hand is refused here.
    by_hand = _dataset(["ab"]).add_column("extra_columns", [pickle.dumps({"response_ids": [1]})])
    with pytest.raises(ValueError, match="by hand: a data column is named 'response_ids'"):
        build_prompt_set(by_hand, EchoTokenizer(), max_prompt_tokens=10, where="by hand")
    with pytest.raises(ValueError, match="by hand: a data column is named 'rollout_index', the name rollouts give "
                                         "the index of each rollout"):
        build_prompt_set(_dataset(["ab"]).add_column("rollout_index", [0]), EchoTokenizer(), max_prompt_tokens=10,
                         where="by hand")


def test_template_kwargs_and_each_rows_tools_reach_the_chat_template(tmp_path):
    dataset = _jsonl(tmp_path, [{"prompt": "U", "tools": [WEATHER, CLOCK]}, {"prompt": "U", "tools": None},
                                {"prompt": "U", "tools": json.dumps([CLOCK])}])
    prompts = build_prompt_set(dataset, chat_tokenizer(TOOLS_TEMPLATE), max_prompt_tokens=64, where="d.jsonl",
                               template_kwargs={"enable_thinking": False}, tools_column="tools")
    assert [text.split("<|im_start|>")[0] for text in prompts.texts] == [
        "TOOLS get_weather get_time\nNOTHINK\n", "NOTHINK\n", "TOOLS get_time\nNOTHINK\n"]
    plain = build_prompt_set(dataset, chat_tokenizer(TOOLS_TEMPLATE), max_prompt_tokens=64, where="d.jsonl")
    assert all(text.startswith("<|im_start|>user") for text in plain.texts)  # neither unless asked
    assert len(prompts.token_ids[0]) == len(plain.token_ids[0]) + 4  # TOOLS, two names, NOTHINK


def test_a_missing_tools_column_or_a_bad_value_names_it(tmp_path):
    dataset = _jsonl(tmp_path, [{"prompt": "U", "tools": None}, {"prompt": "U", "tools": {"name": "x"}}])
    build = dict(max_prompt_tokens=64, where="training data")
    with pytest.raises(ValueError, match=r"^training data: config.data.tools_column='tool' is not a column of the "
                                         r"data; its columns are \[.*'tools'"):
        build_prompt_set(dataset, chat_tokenizer(TOOLS_TEMPLATE), tools_column="tool", **build)
    with pytest.raises(ValueError, match=r"^training data, row 1 \(0-based\), column 'tools' "
                                         r"\(config.data.tools_column\): expected a list of tool schemas"):
        build_prompt_set(dataset, chat_tokenizer(TOOLS_TEMPLATE), tools_column="tools", **build)
    with pytest.raises(ValueError, match="config.data.chat_template_kwargs: tokenize cannot be given"):
        build_prompt_set(dataset, chat_tokenizer(TOOLS_TEMPLATE), template_kwargs={"tokenize": True}, **build)


def test_epoch_sampler_serves_full_batches_of_each_epoch_and_resumes_exactly():
    sampler = EpochSampler(size=10, seed=3)
    batches = [sampler.next_batch(4) for _ in range(5)]
    # As verl's DataLoader(drop_last=True): 2 batches per epoch, distinct items, the 2 left over
    # skipped; the third batch starts epoch 1.
    for epoch, pair in ((0, batches[0:2]), (1, batches[2:4])):
        items = pair[0] + pair[1]
        assert len(set(items)) == 8 and items == EpochSampler(size=10, seed=3)._order(epoch)[:8].tolist()
    assert sampler.state() == {"epoch": 2, "offset": 4}
    assert batches[0] != EpochSampler(size=10, seed=4).next_batch(4)  # the seed matters
    # A batch size that divides the data skips nothing: each epoch is a permutation.
    exact = EpochSampler(size=8, seed=3)
    assert sorted(exact.next_batch(4) + exact.next_batch(4)) == list(range(8))
    assert exact.state() == {"epoch": 1, "offset": 0}
    # Restoring the position of any step continues with the same batches.
    replay = EpochSampler(size=10, seed=3)
    replay.next_batch(4)
    replay.next_batch(4)
    saved = replay.state()
    resumed = EpochSampler(size=10, seed=3)
    resumed.restore(saved)
    assert [resumed.next_batch(4) for _ in range(3)] == batches[2:]
    with pytest.raises(ValueError, match="training data is empty"):
        EpochSampler(size=0, seed=0).next_batch(1)


def test_a_batch_larger_than_the_data_spans_epochs():
    sampler = EpochSampler(size=3, seed=0)
    batch = sampler.next_batch(4)
    assert batch[:3] == sampler._order(0).tolist() and batch[3] == sampler._order(1)[0]
    assert sampler.state() == {"epoch": 1, "offset": 1}


def test_padded_batches_keep_one_shape():
    assert padded_batches(5, 2) == [([0, 1], 2), ([2, 3], 2), ([4, 4], 1)]
    assert padded_batches(4, 4) == [([0, 1, 2, 3], 4)]


def test_a_data_position_is_checked_before_the_sampler_moves_there():
    """Issue 63 finding 6: an edited offset (999 on 32 rows) was accepted and the run diverged silently."""
    sampler = EpochSampler(32, seed=0)
    sampler.next_batch(8)
    assert sampler.check_state(sampler.state()) == {"epoch": 0, "offset": 8}
    for bad in ({"epoch": 0, "offset": 999}, {"epoch": 0, "offset": 32}, {"epoch": -1, "offset": 0},
                {"epoch": 0, "offset": "8"}, {"epoch": 0, "offset": True}, {"epoch": 0}, None,
                {"epoch": 0, "offset": 8, "extra": 1}):
        with pytest.raises(ValueError, match="data position"):
            sampler.restore(bad)
    assert sampler.state() == {"epoch": 0, "offset": 8}  # unmoved
    sampler.restore({"epoch": 3, "offset": 31})
    assert sampler.state() == {"epoch": 3, "offset": 31}


def test_extend_appends_another_prompt_set_and_names_mismatched_columns():
    first = PromptSet(["a"], [[1]], {"answer": ["x"]})
    first.extend(PromptSet(["b", "c"], [[2], [3, 4]], {"answer": ["y", "z"]}))
    assert first.texts == ["a", "b", "c"] and first.token_ids == [[1], [2], [3, 4]]
    assert first.columns == {"answer": ["x", "y", "z"]}
    with pytest.raises(ValueError, match=r"prompt columns \['level'\] do not match \['answer'\]"):
        first.extend(PromptSet(["d"], [[5]], {"level": [0]}))
