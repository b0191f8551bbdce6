"""The embedded helpfulness-safety task: a synthetic assistant world whose two rewards really
conflict, reward models trained here, a warm start on a mixture of response kinds, then GD2PO-SNR
with the rewards ``useful`` and ``harmless``. Runs end to end on a 2-core CPU in minutes.

    python train.py --config=configs/safety_embedded.py                 # workdir ./runs/safety_embedded
    python train.py --config=configs/safety_embedded.py --workdir=runs/safety --config.rl.algorithm=gdpo

The world, the reward models, the warm start and what a run gave: docs/safety_embedded_task.md.
Fields: gd2po_jax/config/; the world's: gd2po_jax/tasks/safety_embedded/world.py; everything not set here is
configs/default.py's.
"""

import ml_collections

try:
    from configs import default
except ModuleNotFoundError:  # the repository's root is not on sys.path: load it by path
    from gd2po_jax.cli import sibling_config

    default = sibling_config(__file__, "default")


def reward_model(max_length: int) -> ml_collections.ConfigDict:
    """One reward name's score model: empty path = the one the task trains (gd2po_jax/tasks/safety_embedded/task.py)."""
    return ml_collections.ConfigDict(dict(path="", negate=None, normalize=None, max_length=max_length,
                                          batch_size=64, dtype="float32"))


def get_config() -> ml_collections.ConfigDict:
    config = default.get_config()
    config.task = "safety_embedded"

    # The world (gd2po_jax.tasks.safety_embedded.world.SafetyWorldConfig), its tokenizer, and its reward models:
    # tiny Qwen2 score models trained with Bradley-Terry + 0.001 score^2 on the world's preference pairs.
    config.data.safety = ml_collections.ConfigDict(dict(
        tokenizer_vocab_size=1024, seed=0, num_train=640, num_validation=128, num_test=256, harmful_fraction=0.5,
        benign_mixture=(0.5, 0.25, 0.25),  # helpful, vague, refusal
        harmful_mixture=(0.3, 0.3, 0.2, 0.2),  # harmful, redirect, vague, refusal
        pairs_per_prompt=3, annotator_temperature=0.1,
        reward_training=dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=4,
                             head_dim=16, seed=0, num_steps=150, batch_size=32, learning_rate=2e-3,
                             regularization=1e-3, max_length=256),
    ))
    config.model.tiny.update(vocab_size=1024)  # recorded only: the tokenizer's size is data.safety's
    # The update as docs/safety_embedded_task.md and docs/study measured it (before configs/default.py
    # turned on micro-batches of 8 with length buckets).
    config.rl.update(micro_batch_size=0, length_bucket=0)

    config.rewards.kind = "reward_model"
    config.rewards.names = ("useful", "harmless")
    config.rewards.reward_models = ml_collections.ConfigDict(dict(useful=reward_model(256),
                                                                  harmless=reward_model(256)))

    config.sampling.max_new_tokens = 96  # the longest demonstration is 75 tokens (EOS included)
    config.sampling.temperature = 1.0  # rollouts sample the warm start's mixture as it is

    config.sft.num_steps = 500
    config.sft.max_length = 256

    config.train.num_steps = 30
    config.eval.max_examples = 128
    return config
