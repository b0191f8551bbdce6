"""The RL core: advantages (GRPO, GDPO, GD2PO's filters: `advantages`), the clipped policy loss
(`losses`), the one jitted update (`train_step`), rollouts from prompts to a batch on device
(`rollout`), verl's minibatches and token-budget micro-batches (`micro_batches`), and the saved
rollouts of a step (`rollout_log`). The loop that runs them is a job (`gd2po_jax.jobs.train`).

May import: errors, config, runtime, models, data, rewards, training, tasks.
"""
