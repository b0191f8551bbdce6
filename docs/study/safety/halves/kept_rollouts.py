"""Which rollouts the two SNR halves keep, and which way each half pushes them (the Table 6 check).

    PYTHONPATH=. python docs/study/safety/halves/kept_rollouts.py --sweep_dir=runs/study/safety_halves \
        --scratch_dir=/tmp/kept_rollouts > docs/study/safety/halves/kept_rollouts.md

Samples the sweep's warm start on the first 128 train prompts x 4 rollouts (the run config of
``runs/gdpo/seed0``, ``collect_rollouts`` with ``PRNGKey(0)``, as docs/safety_embedded_task.md's
conflict table), scores them with the sweep's reward models, labels every rollout with the world's
ground truth, and computes the advantages of GDPO and of the two halves on that one batch. It
prints, per request type and label: how many rollouts there are, their mean reward-model scores,
the share in conflict, their mean conflict score c (docs/algorithm.md#snr-halves), how many each
half keeps and the sum of the advantages each method gives them (the dropped rollouts' are 0): the
net push of the step's update on that kind of response, in units of the method's whitened
advantage (positive: more of it).
A step-0 picture only: the RL runs sample other prompts with other keys, from a moving policy.
"""

from __future__ import annotations

import collections
import pathlib

import jax
import numpy as np
from absl import app, flags

from gd2po_jax.rl.advantages import compute_advantages
from gd2po_jax.models.logprobs import merge_model
from gd2po_jax.rl.rollout import RolloutSettings, collect_rollouts
from gd2po_jax.tasks.setup import build_setup
from gd2po_jax.jobs.train import load_policy
from gd2po_jax.runtime import run_dir
from gd2po_jax.sft.warm_start import warm_start_dir
from gd2po_jax.tasks.safety_embedded.world import label_response, parse_ground_truth

flags.DEFINE_string("sweep_dir", None, "The sweep directory (its runs/gdpo/seed0 and warm start).", required=True)
flags.DEFINE_string("scratch_dir", None, "An empty directory for the run setup's files.", required=True)
flags.DEFINE_integer("num_prompts", 128, "The first N train prompts.")
FLAGS = flags.FLAGS

METHODS = ("gdpo", "low_conflict_half", "high_conflict_half")
KINDS = {False: ("helpful", "vague", "refusal", "harmful", "redirect"),
         True: ("harmful", "redirect", "vague", "refusal", "helpful")}


def main(argv):
    del argv
    run = pathlib.Path(FLAGS.sweep_dir) / "runs" / "gdpo" / "seed0"
    config = run_dir.load_run_config(run)
    setup = build_setup(config, pathlib.Path(FLAGS.scratch_dir))
    graphdef, params = load_policy(config, setup, warm_start_dir(config, run))
    policy = merge_model(graphdef, params, config.model.dtype)
    prompts = setup.train.select(range(FLAGS.num_prompts))
    group = config.rl.num_generations
    settings = RolloutSettings.of_run(config, eos_token_ids=setup.eos_ids, pad_token_id=setup.pad_id,
                                      prompt_length=setup.prompt_length)
    rollouts = collect_rollouts(policy, prompts, setup.tokenizer, setup.reward_fn, settings, rng=jax.random.PRNGKey(0))
    lengths = np.asarray(rollouts.batch.response_mask.sum(-1)).reshape(-1, group)
    outs = {m: compute_advantages(rollouts.rewards, lengths, m) for m in METHODS}
    truths = [parse_ground_truth(t) for t in prompts.columns["ground_truth"]]
    harmful = np.repeat([t["harmful"] for t in truths], group)
    labels = [label_response(text, truths[r // group]["task"]).kind for r, text in enumerate(rollouts.responses)]
    conflict = np.asarray(outs["gdpo"].conflict).reshape(-1)
    snr = np.abs(np.asarray(outs["gdpo"].snr).reshape(-1))
    summed = np.asarray(outs["gdpo"].reward_advantages).sum(-1).reshape(-1)  # S, before the batch step
    keep = {m: np.asarray(outs[m].keep).reshape(-1) for m in METHODS}
    adv = {m: np.asarray(outs[m].advantages).reshape(-1) for m in METHODS}
    rewards = np.asarray(rollouts.rewards).reshape(-1, rollouts.rewards.shape[-1])

    print(f"# Which rollouts the SNR halves keep ({FLAGS.num_prompts} train prompts x {group} rollouts of the "
          "warm start)\n")
    print("Output of `docs/study/safety/halves/kept_rollouts.py` (see its docstring). `useful` and `harmless` are "
          "the reward models' mean scores of the row's rollouts; `kept` counts the rollouts each half keeps; "
          "`sum A` is the sum of the advantages each method gives them (0 for dropped ones).\n")
    print("| request | label | rollouts | useful | harmless | conflict | mean c | kept low | kept high "
          "| sum A gdpo | sum A low | sum A high |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for is_harmful in (False, True):
        for kind in KINDS[is_harmful]:
            rows = (harmful == is_harmful) & (np.asarray(labels) == kind)
            if not rows.any():
                continue
            score = np.where(conflict[rows], snr[rows], 1.0)
            print(f"| {'harmful' if is_harmful else 'benign'} | {kind} | {rows.sum()} | "
                  f"{rewards[rows, 0].mean():.2f} | {rewards[rows, 1].mean():.2f} | {conflict[rows].mean():.2f} | "
                  f"{score.mean():.2f} | {keep['low_conflict_half'][rows].sum()} | "
                  f"{keep['high_conflict_half'][rows].sum()} | "
                  + " | ".join(f"{adv[m][rows].sum():+.1f}" for m in METHODS) + " |")
    print()
    counts = collections.Counter(zip(harmful.tolist(), labels))
    print(f"Rollouts: {len(labels)} ({sum(v for (h, _), v in counts.items() if not h)} benign, "
          f"{sum(v for (h, _), v in counts.items() if h)} harmful); in conflict: {conflict.mean():.2f}.\n")
    print("| method | kept | mean \\|S\\| of kept rollouts (before the batch step) | mean c of kept rollouts |")
    print("|---|---|---|---|")
    score = np.where(conflict, snr, 1.0)
    for m in METHODS:
        print(f"| {m} | {keep[m].sum()} | {np.abs(summed[keep[m]]).mean():.3f} | {score[keep[m]].mean():.3f} |")


if __name__ == "__main__":
    app.run(main)
