"""The jobs a user runs, whole: `train` (warm start -> evaluation -> the RL loop -> evaluation ->
export, resumable), on top of the RL core, the warm start and the evaluation.

May import: errors, config, runtime, models, data, rewards, training, tasks, rl, sft, evaluation.
"""
