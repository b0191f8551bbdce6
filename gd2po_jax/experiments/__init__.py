"""Experiments over many runs: sweeps (grids of train.py runs and their evaluations: `sweeps`) and
their reports (tables, paired tests, plots: `sweep_report`).

May import: errors, config, runtime, models, data, rewards, training, tasks, rl, sft, evaluation.
"""
