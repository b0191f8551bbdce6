"""gd2po_jax.rewards.reward_model: what a reward model reads (the re-rendering, the fast path that
gives the same tokens, align-anything's plain format for a tokenizer without a chat template, only
the policy's eos_token removed), fixed-shape batches in length buckets, truncation (cut on the right
and counted, or an error), offload, and the errors that name the reward model's path and the rollout.

Tiny models built here (tests/fakes.py): a policy tokenizer with ChatML, a reward-model tokenizer
with another vocabulary and a plain-text template, random 2-layer score models.
"""

import logging
import shutil

import jax
import numpy as np
import pytest

from gd2po_jax.data.tokenization import load_tokenizer
from gd2po_jax.models import load_score_model, score_fn
from gd2po_jax.rewards.base import RESPONSE_IDS, RewardOutputError, build_reward_function, reward_step_metrics
from gd2po_jax.rewards.reward_model import (
    RewardModelInputError,
    RewardModelReward,
    length_buckets,
    plain_format,
    plan_batches,
    score_batch_jit,
    template_closing,
)
from gd2po_jax.rewards.scoring import score_batch
from gd2po_jax.runtime.sharding import make_mesh
from tests.fakes import alpaca_prompts, safety_tokenizer_dir, tiny_safety_policy, tiny_score_model_dir

NUM = 12  # rollouts per test batch
MAX_LENGTH = 256


@pytest.fixture(scope="module")
def setting():
    """The policy tokenizer, 12 Alpaca prompts (3 x G=4 rollouts), sampled-like token ids and the mesh."""
    policy = load_tokenizer(tiny_safety_policy())
    messages = [m for m in alpaca_prompts()[:3] for _ in range(4)]
    prompts = [policy.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
    rng = np.random.default_rng(0)
    special = [policy.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|endoftext|>")]
    responses = []
    for i in range(NUM):  # what a random policy samples: any token, special ones too, EOS last (or cut)
        ids = rng.integers(3, len(policy), size=int(rng.integers(1, 40))).tolist()
        if i % 3 == 0:
            ids[len(ids) // 2] = special[i % 2]
        responses.append(ids + ([policy.eos_token_id] if i % 4 else []))
    return {"policy": policy, "messages": messages, "prompts": prompts, "ids": responses,
            "mesh": make_mesh(data=-1, fsdp=1)}


DIR_OPTIONS = ("seed", "nan_token")  # of tiny_score_model_dir; the others are the reward model's


def reward(setting, models: dict, **options) -> RewardModelReward:
    """The reward_model reward of ``models`` (name -> (layout, template, options: `DIR_OPTIONS` make the
    model, the others are `RewardModel`'s, e.g. truncation)), float32, on the mesh."""
    specs = {name: {"path": str(tiny_score_model_dir(layout, template,
                                                     **{k: v for k, v in extra.items() if k in DIR_OPTIONS})),
                    "max_length": MAX_LENGTH, "batch_size": 8, "dtype": "float32",
                    **{k: v for k, v in extra.items() if k not in DIR_OPTIONS}}
             for name, (layout, template, extra) in models.items()}
    policy = setting["policy"]
    return build_reward_function({"kind": "reward_model", "names": tuple(models), "reward_models": specs,
                                  "policy_tokenizer": policy, "policy_eos_ids": [policy.eos_token_id],
                                  "mesh": setting["mesh"], **options})


def columns(setting, ids=None) -> dict:
    return {"prompt": setting["messages"], RESPONSE_IDS: setting["ids"] if ids is None else ids,
            "row": [i // 4 for i in range(NUM)]}


def direct_scores(path, token_lists) -> np.ndarray:
    """Scores of the token lists by the score model itself, in one right-padded batch."""
    width = max(map(len, token_lists))
    ids = np.zeros((len(token_lists), width), np.int32)
    mask = np.zeros((len(token_lists), width), bool)
    for i, tokens in enumerate(token_lists):
        ids[i, :len(tokens)], mask[i, :len(tokens)] = tokens, True
    return np.asarray(score_fn(load_score_model(path, "float32"), ids, mask))


def test_a_response_is_re_rendered_with_the_reward_models_own_template(setting):
    fn = reward(setting, {"harmless": ("sequence_classification", "plain", {})})
    rm = load_tokenizer(tiny_score_model_dir("sequence_classification", "plain"))
    assert fn.fast == {"harmless": False}
    encoded = fn.encode(setting["prompts"], ["unused"] * NUM, columns(setting))["harmless"]
    for i, ids in enumerate(setting["ids"]):
        # The policy's decoding, special tokens kept, the EOS string removed; then the reward model's
        # template and tokenizer, exactly as it tokenizes the rendered conversation.
        text = setting["policy"].decode(ids, skip_special_tokens=False).replace("<|im_end|>", "")
        conversation = [*setting["messages"][i], {"role": "assistant", "content": text}]
        expected = rm.apply_chat_template(conversation, tokenize=True)["input_ids"]
        assert "### ASSISTANT:\n" + text in rm.decode(expected) and "<|im_end|>" not in rm.decode(expected)
        assert encoded.token_ids[i] == expected[:MAX_LENGTH]
        assert encoded.truncated[i] == (len(expected) > MAX_LENGTH)
    assert any("<|im_start|>" in rm.decode(t) for t in encoded.token_ids)  # special tokens reach the model
    # What the reward returns is the score model's own score of those tokens, whatever the batching.
    values = fn(setting["prompts"], ["unused"] * NUM, columns(setting))
    np.testing.assert_allclose(values[:, 0], direct_scores(fn.models["harmless"].path, encoded.token_ids),
                               rtol=1e-5, atol=1e-6)


def test_the_fast_path_gives_the_slow_paths_tokens_and_scores(setting):
    fn = reward(setting, {"useful": ("amo", "chatml", {})})
    assert fn.fast == {"useful": True} and template_closing(setting["policy"]) == "<|im_end|>\n"
    model, texts = fn.models["useful"], fn.response_texts([""] * NUM, columns(setting))
    fast = model.encode(setting["prompts"], texts, None, fast=True)
    slow = model.encode(setting["prompts"], texts, setting["messages"], fast=False)
    assert fast.token_ids == slow.token_ids and (fast.truncated == slow.truncated).all()
    np.testing.assert_array_equal(model.scores(fast.token_ids), model.scores(slow.token_ids))


def test_templates_that_rewrite_replies_get_the_slow_path():
    tokenizer = load_tokenizer(safety_tokenizer_dir("chatml"))
    tokenizer.chat_template = tokenizer.chat_template.replace("message['content']", "message['content'] | trim")
    assert template_closing(tokenizer) is None  # "\n two\nlines \n" is rendered trimmed


def test_length_buckets_and_fixed_shape_batches():
    assert length_buckets(2048) == (128, 256, 512, 1024, 2048)
    assert length_buckets(100, min_length=64) == (64, 100) and length_buckets(128) == (128,)
    batches = plan_batches([70, 3, 64, 65, 100, 9], batch_size=4, buckets=(64, 128))
    assert [(b.length, b.rows, b.num_real) for b in batches] == [(64, (1, 2, 5, 1), 3), (128, (0, 3, 4, 0), 3)]
    with pytest.raises(ValueError, match="conversation 0 has 129 tokens"):
        plan_batches([129], 4, (64, 128))


def test_buckets_bound_the_compiled_programs_and_truncation_is_counted(setting):
    fn = reward(setting, {"useful": ("amo", "chatml", {})})
    long_ids = [ids[:-1] * 12 + ids[-1:] for ids in setting["ids"]]  # many over MAX_LENGTH
    calls = (setting["ids"], long_ids, setting["ids"][::-1], long_ids[:5] + setting["ids"][5:])
    for ids in calls:
        fn(setting["prompts"], [""] * NUM, columns(setting, ids))
    metrics = reward_step_metrics(fn)  # the 4 calls since the reward was built
    model = fn.models["useful"]
    assert model.buckets == (128, 256) and model.batch_shapes == {(8, 128), (8, 256)}  # one program per bucket
    compiled = score_batch_jit._cache_size()
    fn(setting["prompts"], [""] * NUM, columns(setting, long_ids[::-1]))
    assert score_batch_jit._cache_size() == compiled  # and no more, for the whole run
    cut = [fn.encode(setting["prompts"], [""] * NUM, columns(setting, ids))["useful"] for ids in calls]
    assert all(len(t) <= MAX_LENGTH for e in cut for t in e.token_ids)
    assert 0 < cut[1].truncated.mean() < 1 and not cut[0].truncated.any()
    assert metrics["reward_truncated/useful"] == pytest.approx(np.mean([e.truncated for e in cut]))
    assert metrics["time/reward_model/useful"] > 0
    reward_step_metrics(fn)
    assert reward_step_metrics(fn) == {"reward_truncated/useful": 0.0, "time/reward_model/useful": 0.0}


def test_offloaded_reward_models_wait_on_the_host_and_score_the_same(setting):
    models = {"useful": ("amo", "chatml", {}), "harmless": ("beaver", "plain", {})}  # beaver: a head bias
    on_device = reward(setting, models)
    offloaded = reward(setting, models, offload=True)
    expected = on_device(setting["prompts"], [""] * NUM, columns(setting))
    for _ in range(2):
        np.testing.assert_array_equal(offloaded(setting["prompts"], [""] * NUM, columns(setting)), expected)
        for model in offloaded.models.values():
            assert not model.on_device()
            assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(model._host_state))
    assert all(model.on_device() for model in on_device.models.values())
    # Sharded over the run's mesh like the policy.
    leaves = jax.tree.leaves(on_device.models["useful"]._state)
    assert {x.sharding.mesh for x in leaves} == {setting["mesh"]}


def test_a_nan_score_stops_scoring_naming_the_model_and_the_rollout(setting):
    policy = setting["policy"]
    nan_token = policy.convert_tokens_to_ids("<|im_start|>")  # the plain template writes none itself
    fn = reward(setting, {"useful": ("amo", "chatml", {}),
                                      "harmless": ("amo", "plain", {"seed": 1, "nan_token": nan_token})})
    ids = [list(x) for x in setting["ids"]]
    ids = [[t for t in x if t != nan_token] for x in ids]
    ids[9] = ids[9][:2] + [nan_token] + ids[9][2:]
    path = fn.models["harmless"].path
    for workers in (1, 2):  # the second chunk starts at rollout 6: the error names the step's rollout
        with pytest.raises(RewardOutputError, match=rf"reward 'harmless', rollout 9: reward model {path} scored nan"):
            score_batch(fn, setting["prompts"], [""] * NUM, columns(setting, ids), num_workers=workers)
    assert np.isfinite(fn(setting["prompts"], [""] * NUM, columns(setting, ids[:9] + ids[10:11] * 3))).all()


LONG_PROMPT = [{"role": "user", "content": " ".join(["word"] * 400)}]  # over MAX_LENGTH with any template


def test_truncation_right_scores_a_cut_conversation_even_a_prompt_that_fills_it(setting, caplog):
    """The official worker's ``truncation="right"``: whatever is over max_length is cut and scored;
    a prompt that alone fills it is no error (its rollouts all score alike), counted and warned once."""
    fn = reward(setting, {"harmless": ("amo", "plain", {"truncation": "right"})})
    assert fn.check_columns({"prompt": [setting["messages"][0], LONG_PROMPT]}) == []
    cols = {"prompt": [LONG_PROMPT] * NUM, RESPONSE_IDS: setting["ids"], "row": [7] * NUM}
    with caplog.at_level(logging.WARNING, logger="gd2po_jax.rewards.reward_model"):
        values = fn(setting["prompts"], [""] * NUM, cols)
        fn(setting["prompts"], [""] * NUM, cols)
    assert np.isfinite(values).all() and np.ptp(values) == 0  # only the cut prompt is scored
    encoded = fn.encode(setting["prompts"], [""] * NUM, cols)["harmless"]
    assert encoded.truncated.all() and {len(t) for t in encoded.token_ids} == {MAX_LENGTH}
    assert (encoded.lengths > MAX_LENGTH).all()
    assert reward_step_metrics(fn)["reward_truncated/harmless"] == 1.0
    warnings = [r.getMessage() for r in caplog.records if "prompt alone fills" in r.getMessage()]
    assert len(warnings) == 1 and "12 conversation(s)" in warnings[0] and "max_length=256" in warnings[0]


def test_truncation_error_stops_at_an_over_long_conversation_naming_the_row(setting):
    fn = reward(setting, {"harmless": ("amo", "plain", {"truncation": "error"})})
    problems = fn.check_columns({"prompt": [setting["messages"][0], LONG_PROMPT]})  # found when data is loaded
    assert [(row, column) for row, column, _ in problems] == [(1, "prompt")]
    assert "with reward model 'harmless'" in problems[0][2] and "max_length=256" in problems[0][2]
    cols = {"prompt": [LONG_PROMPT] * NUM, RESPONSE_IDS: setting["ids"], "row": [7] * NUM}
    with pytest.raises(RewardModelInputError, match=r"rollout 0: the conversation renders to \d+ tokens with reward "
                                                    r"model 'harmless' .*max_length=256 .*\(data row 7, 0-based\)"):
        fn(setting["prompts"], [""] * NUM, cols)
    # A short prompt whose response runs over: also an error, naming that rollout.
    long_ids = [list(ids) for ids in setting["ids"]]
    long_ids[5] = [long_ids[5][0]] * 400
    with pytest.raises(RewardModelInputError, match=r"rollout 5: the conversation renders to"):
        fn(setting["prompts"], [""] * NUM, columns(setting, long_ids))
    assert np.isfinite(fn(setting["prompts"], [""] * NUM, columns(setting))).all()  # all fit: scored


def test_only_the_policys_eos_token_is_removed_from_a_response(setting):
    """The official ``response.replace(src_tokenizer.eos_token, "")``: another EOS id's text stays."""
    policy = setting["policy"]
    other_eos = policy.convert_tokens_to_ids("<|endoftext|>")
    fn = reward(setting, {"useful": ("amo", "chatml", {})}, policy_eos_ids=[other_eos, policy.eos_token_id])
    ids = [policy.encode("Sure.")[:1] + [other_eos, policy.eos_token_id]]
    (text,) = fn.response_texts([""], {RESPONSE_IDS: ids})
    assert text == policy.decode(ids[0][:1]) + "<|endoftext|>"


def test_plain_format_is_align_anythings_default_format():
    """align_anything/configs/format_model.py, ModelFormatter.default_format, character for character."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q?"},
                {"role": "assistant", "content": [{"type": "text", "text": "A."}, {"type": "image"}]}]
    assert plain_format(messages) == "SYSTEM: Be brief.\nUSER: Q?\nASSISTANT: A.\n"
    assert plain_format(messages[:2], add_generation_prompt=True) == "SYSTEM: Be brief.\nUSER: Q?\nASSISTANT: "


def test_names_must_match_the_reward_models(setting):
    path = str(tiny_score_model_dir("amo"))
    with pytest.raises(ValueError, match=r"one reward model per name of \('useful', 'harmless'\); got models for "
                                         r"\['useful'\]"):
        RewardModelReward(("useful", "harmless"), {"useful": {"path": path}})


def without_chat_template(source, target):
    """A copy of the score-model directory ``source`` whose tokenizer has no chat template."""
    shutil.copytree(source, target)
    (target / "chat_template.jinja").unlink()
    return target


def test_a_tokenizer_without_chat_template_renders_align_anythings_plain_format(setting, tmp_path):
    path = without_chat_template(tiny_score_model_dir("amo", "plain"), tmp_path / "no_template")
    fn = RewardModelReward(("useful",), {"useful": {"path": str(path), "max_length": MAX_LENGTH, "batch_size": 4,
                                                    "dtype": "float32"}},
                           policy_tokenizer=setting["policy"], policy_eos_ids=[setting["policy"].eos_token_id])
    model = fn.models["useful"]
    assert model.tokenizer.chat_template is None and not fn.fast["useful"]
    encoded = fn.encode(setting["prompts"], [""] * NUM, columns(setting))["useful"]
    for i, text in enumerate(fn.response_texts([""] * NUM, columns(setting))):
        expected = plain_format([*setting["messages"][i], {"role": "assistant", "content": text}])
        assert expected.startswith("USER: ") and expected.endswith(f"ASSISTANT: {text}\n")
        assert encoded.token_ids[i] == model.tokenizer(expected, add_special_tokens=False)["input_ids"][:MAX_LENGTH]
    assert model.prompt_lengths(setting["messages"][:1]) == [
        len(model.tokenizer(plain_format(setting["messages"][0], True), add_special_tokens=False)["input_ids"])]
    assert np.isfinite(fn(setting["prompts"], [""] * NUM, columns(setting))).all()


def test_unusable_reward_model_directories_are_named(setting, tmp_path):
    good = tiny_score_model_dir("amo")
    with pytest.raises(ValueError, match=rf"reward model 'useful' \({tmp_path}/missing\): no such directory"):
        RewardModelReward(("useful",), {"useful": {"path": str(tmp_path / "missing")}})
    with pytest.raises(ValueError, match=r"'useful' .*: truncation='left' is not 'right' or 'error'"):
        RewardModelReward(("useful",), {"useful": {"path": str(good), "truncation": "left"}})
    no_template = without_chat_template(good, tmp_path / "no_template")
    (no_template / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=rf"reward model 'useful' \({no_template}\): .*safetensors"):
        RewardModelReward(("useful",), {"useful": {"path": str(no_template)}})
    with pytest.raises(ValueError, match=r"batch_size=4 must be a positive multiple of the 8 data-parallel devices"):
        RewardModelReward(("useful",), {"useful": {"path": str(good), "batch_size": 4}}, mesh=setting["mesh"])


def test_a_reward_model_with_a_peft_adapter_scores_with_it_merged(tmp_path):
    """rewards.reward_models.<name>.adapter: the PEFT adapter trained on the score model is loaded
    on it (merged: the parameters of load_score_model(path, adapter=...))."""
    import torch
    from flax import nnx
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    path = tiny_score_model_dir("sequence_classification")
    lora = LoraConfig(task_type="SEQ_CLS", r=2, lora_alpha=4, target_modules=["q_proj", "up_proj"])
    peft_model = get_peft_model(AutoModelForSequenceClassification.from_pretrained(path), lora)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.add_(0.5)
    peft_model.save_pretrained(tmp_path / "adapter")
    reward = RewardModelReward(("useful",), {"useful": {"path": str(path), "adapter": str(tmp_path / "adapter"),
                                                        "dtype": "float32", "batch_size": 8}})
    got = jax.tree.leaves(reward.models["useful"]._state)
    want = jax.tree.leaves(nnx.state(load_score_model(path, "float32", adapter=tmp_path / "adapter")))
    plain = jax.tree.leaves(nnx.state(load_score_model(path, "float32")))
    assert len(got) == len(want) == len(plain)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert any(np.abs(np.asarray(g) - np.asarray(p)).max() > 1e-3 for g, p in zip(got, plain))
