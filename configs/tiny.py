"""The embedded default shrunk to seconds per step: the config the tests share, and a quick try.

    python train.py --config=configs/tiny.py --workdir=runs/tiny

A 64-wide, 2-layer Qwen2 with a 600-token tokenizer; short requests with one candidate tool and no
two-call requests; a 60-step warm start; 6 RL steps of 8 prompts x 4 rollouts of at most 48 tokens;
16 validation examples. Everything else is configs/default.py (fields: gd2po_jax/config/).
"""

import ml_collections

try:
    from configs import default
except ModuleNotFoundError:  # the repository's root is not on sys.path: load it by path
    from gd2po_jax.cli import sibling_config

    default = sibling_config(__file__, "default")


def get_config() -> ml_collections.ConfigDict:
    config = default.get_config()
    config.data.synthetic.update(
        num_train=64, num_validation=16, num_test=8, tokenizer_vocab_size=600, num_candidates=1,
        multi_call_fraction=0.0,  # two-call requests need 2 candidates
        min_think_words=2, max_think_words=6,
    )
    config.rewards.max_think_words = 6  # Lmax, as long as the demonstrations' think blocks
    config.model.tiny.update(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                             head_dim=16)
    config.sft.update(num_steps=60, batch_size=16, learning_rate=1e-2)
    config.train.update(prompts_per_step=8, num_steps=6, learning_rate=1e-3)
    config.rl.num_generations = 4
    # One compiled update branch, as before length buckets: the tests that run the trainer stay quick
    # (tests/rl/test_train_step.py and tests/jobs/test_train.py turn the buckets on where they test them).
    config.rl.update(micro_batch_size=0, length_bucket=0)
    config.sampling.max_new_tokens = 48
    config.eval.update(max_examples=16, batch_size=8)
    config.checkpoint.update(every_steps=2, keep=2)
    return config
