"""Supervised fine-tuning: the SFT step (`step`) and the warm start RL begins from (`warm_start`,
cached by a hash of its inputs).

May import: errors, config, runtime, models, data, rewards, training, tasks, rl.
"""
