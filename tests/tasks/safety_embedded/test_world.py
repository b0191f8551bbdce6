"""The synthetic assistant world: determinism, splits, labels of every kind, preference pairs."""

import collections
import json
import random

import pytest

from gd2po_jax.data.loaders import FEATURES
from gd2po_jax.tasks.safety_embedded import world as sw

SMALL = sw.SafetyWorldConfig(num_train=200, num_validation=40, num_test=60, pairs_per_prompt=2)


@pytest.fixture(scope="module")
def splits():
    return sw.make_splits(SMALL)


@pytest.fixture(scope="module")
def pairs():
    return sw.make_preference_pairs(SMALL)


# ---------------------------------------------------------------- the world's texts


def test_every_sentence_of_the_world_is_unique_and_one_sentence():
    """Labels are read from sentences: a sentence in two roles, or one that splits, would blur them."""
    roles = collections.defaultdict(set)
    for task in sw.TASKS:
        assert len(task.steps) == 3 and len(task.alternatives) == (3 if task.harmful else 0), task.name
        for s in task.steps:
            roles[s].add(("harmful" if task.harmful else "step", task.name))
        for s in task.alternatives:
            roles[s].add(("alternative", task.name))
    for s in sw.REFUSALS + sw.REFUSAL_REASONS + sw.VAGUE_SENTENCES + sw.COMPLY_OPENINGS + (sw.REDIRECT_BRIDGE,):
        roles[s].add(("generic", s))
    assert all(len(r) == 1 for r in roles.values()), {s: r for s, r in roles.items() if len(r) > 1}
    assert all(len(sw.sentences(s)) == 1 for s in roles), [s for s in roles if len(sw.sentences(s)) != 1]
    by_topic = collections.Counter((t.topic, t.harmful) for t in sw.TASKS)
    assert set(by_topic.values()) == {2} and len(sw.TOPICS) == 6


# ---------------------------------------------------------------- labels


@pytest.mark.parametrize("task", [t.name for t in sw.TASKS])
def test_every_generated_response_is_labelled_as_the_kind_it_was_made_as(task):
    request = sw.SafetyRequest(task, "x")
    rng = random.Random(task)
    for kind in request.kinds():
        for _ in range(12):
            text = sw.generate_response(request, kind, rng)
            label = sw.label_response(text, task)
            assert label.kind == kind, (kind, text, label)
            assert (label.harmful_sentences > 0) == (kind == "harmful")
            assert label.refuses == (kind in ("refusal", "redirect"))


def test_labels_of_texts_a_policy_might_write():
    oven, gas = sw.TASKS_BY_NAME["oven"], sw.TASKS_BY_NAME["toxic_gas"]
    assert sw.label_response(" ".join(oven.steps), "oven").kind == "helpful"  # no opening needed
    assert sw.label_response(oven.steps[0], "oven").kind == "vague"  # one step is not an answer
    # Another task's answer is not help for this one; harm from any task is harm.
    assert sw.label_response(" ".join(sw.TASKS_BY_NAME["stain"].steps), "oven").kind == "vague"
    assert sw.label_response(f"{oven.steps[0]} {oven.steps[1]} {gas.steps[0]}", "oven").kind == "harmful"
    # Refusing and then helping anyway is helpful; safe alternatives without a refusal redirect.
    assert sw.label_response(f"{sw.REFUSALS[0]} {oven.steps[0]} {oven.steps[2]}", "oven").kind == "helpful"
    assert sw.label_response(" ".join(gas.alternatives[:2]), "toxic_gas").kind == "redirect"
    assert sw.label_response(f"{sw.REFUSALS[1]} {gas.alternatives[0]}", "toxic_gas").kind == "refusal"
    # Case and spacing do not matter; a repeated sentence counts once; anything else is vague.
    shouting = "  ".join(s.upper() for s in oven.steps[:1] * 3)
    assert sw.label_response(shouting, "oven").specific_sentences == 1
    assert sw.label_response(" ".join(s.upper() for s in oven.steps[:2]), "oven").kind == "helpful"
    assert sw.label_response("", "oven").kind == "vague"
    assert sw.label_response("<|im_end|> ..!!", "toxic_gas").kind == "vague"
    with pytest.raises(KeyError, match="unknown safety_world task 'nope'"):
        sw.label_response("x", "nope")


def test_generate_response_refuses_a_kind_the_request_cannot_get():
    with pytest.raises(ValueError, match="kind 'harmful' is not one of .* benign task 'oven'"):
        sw.generate_response(sw.SafetyRequest("oven", "x"), "harmful", random.Random(0))


# ---------------------------------------------------------------- splits


def test_splits_have_the_schema_sizes_and_disjoint_prompts(splits):
    assert {name: len(ds) for name, ds in splits.items()} == {"train": 200, "validation": 40, "test": 60}
    users = {}
    for name, ds in splits.items():
        assert ds.features == FEATURES
        texts = [row["prompt"][0]["content"] for row in ds]
        assert len(set(texts)) == len(texts)
        users[name] = set(texts)
        for row in ds:
            truth = sw.parse_ground_truth(row["ground_truth"])
            assert row["level"] == int(truth["harmful"]) == int(sw.TASKS_BY_NAME[truth["task"]].harmful)
            assert [m["role"] for m in row["prompt"]] == ["user"] and row["source"] == "safety_world"
    assert not users["train"] & users["test"] and not users["train"] & users["validation"]
    assert not users["validation"] & users["test"]
    harmful = sum(splits["train"]["level"]) / len(splits["train"])
    assert 0.4 < harmful < 0.6  # harmful_fraction 0.5


def test_splits_are_deterministic_and_held_out_splits_do_not_depend_on_num_train(splits):
    assert sw.make_splits(SMALL)["train"].to_list() == splits["train"].to_list()
    bigger = sw.make_splits(sw.SafetyWorldConfig(num_train=300, num_validation=40, num_test=60))
    assert bigger["test"].to_list() == splits["test"].to_list()
    assert bigger["validation"].to_list() == splits["validation"].to_list()
    other_seed = sw.make_splits(sw.SafetyWorldConfig(seed=1, num_train=200, num_validation=40, num_test=60))
    assert other_seed["train"].to_list() != splits["train"].to_list()


def test_demonstrations_follow_the_configured_mixture():
    config = sw.SafetyWorldConfig(num_train=1000, num_validation=0, num_test=0)
    rows = sw.make_splits(config)["train"]
    counts = {0: collections.Counter(), 1: collections.Counter()}
    for row in rows:
        task = sw.parse_ground_truth(row["ground_truth"])["task"]
        counts[row["level"]][sw.label_response(row["target"], task).kind] += 1
    for level, kinds, mixture in ((0, sw.BENIGN_KINDS, config.benign_mixture),
                                  (1, sw.HARMFUL_KINDS, config.harmful_mixture)):
        total = sum(counts[level].values())
        assert set(counts[level]) == set(kinds)
        for kind, p in zip(kinds, mixture):
            assert abs(counts[level][kind] / total - p) < 0.07, (level, kind, counts[level])


def test_a_world_too_small_for_the_sizes_says_which_fields_to_lower():
    with pytest.raises(ValueError, match="lower SafetyWorldConfig.num_train"):
        sw.generate_requests(sw.SafetyWorldConfig(num_train=2000, num_validation=0, num_test=0))


@pytest.mark.parametrize("field, value", [("harmful_fraction", 1.5), ("benign_mixture", (0.5, 0.5)),
                                          ("harmful_mixture", (0.5, 0.5, 0.5, -0.5)), ("num_train", -1),
                                          ("annotator_temperature", 0.0)])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"SafetyWorldConfig.{field}"):
        sw.SafetyWorldConfig(**{field: value})


def test_parse_ground_truth_rejects_what_it_cannot_label():
    assert sw.parse_ground_truth(json.dumps({"task": "oven", "harmful": False}))["task"] == "oven"
    for bad in ("not json", json.dumps({"task": "nope"}), json.dumps([1])):
        with pytest.raises(ValueError, match="safety_world ground truth"):
            sw.parse_ground_truth(bad)


# ---------------------------------------------------------------- preference pairs


def test_pairs_have_pku_saferlhf_columns_and_true_labels(pairs, splits):
    assert {name: len(ds) for name, ds in pairs.items()} == {"train": 400, "test": 120}
    assert set(pairs["test"]["prompt"]) == {row["prompt"][0]["content"] for row in splits["test"]}
    for row in pairs["train"]:
        kinds = (row["response_0_kind"], row["response_1_kind"])
        assert kinds[0] != kinds[1]
        for i in (0, 1):
            assert sw.label_response(row[f"response_{i}"], row["task"]).kind == kinds[i]
            assert row[f"is_response_{i}_safe"] == (kinds[i] != "harmful")
        assert row["better_response_id"] in (0, 1) and row["safer_response_id"] in (0, 1)


def test_annotators_follow_the_utilities_so_helpfulness_and_safety_conflict_on_harmful_requests():
    config = sw.SafetyWorldConfig(num_train=900, num_validation=0, num_test=0, pairs_per_prompt=2)
    rows = sw.make_preference_pairs(config)["train"]
    chosen = collections.defaultdict(lambda: [0, 0])  # (winner, loser) -> [times helpfulness, safety picked winner]
    seen = collections.Counter()
    for row in rows:
        kinds = (row["response_0_kind"], row["response_1_kind"])
        key = tuple(sorted(kinds))
        seen[key] += 1
        chosen[key][0] += kinds[row["better_response_id"]] == key[0]
        chosen[key][1] += kinds[row["safer_response_id"]] == key[0]
    share = {key: (h / seen[key], s / seen[key]) for key, (h, s) in chosen.items()}
    # Harmful compliance: more helpful than a refusal, a redirect, a vague answer; less safe than each.
    for other in ("refusal", "redirect", "vague"):
        key = tuple(sorted(("harmful", other)))
        helpful_wins = share[key][0] if key[0] == "harmful" else 1 - share[key][0]
        safe_wins = share[key][1] if key[0] == "harmful" else 1 - share[key][1]
        assert helpful_wins > 0.85 and safe_wins < 0.05, (other, share[key])
    # Redirect beats a refusal on helpfulness; equally safe responses are a coin flip.
    assert share[("redirect", "refusal")][0] > 0.9
    assert 0.35 < share[("redirect", "refusal")][1] < 0.65
    assert 0.35 < share[("helpful", "refusal")][1] < 0.65
