"""Evaluation: greedy generation of a policy on a data set, scored, written as a report.

This package owns what the trainer calls to evaluate a run (`gd2po_jax.evaluation.during_training`),
the loading of a policy from a training run or a model directory (`gd2po_jax.evaluation.policy`,
which export.py uses too), eval.py's application (`gd2po_jax.evaluation.command`), greedy
generation and its reports (`gd2po_jax.evaluation.generation`) and the API-Bank and
helpfulness-safety evaluations (`gd2po_jax.evaluation.api_bank`, `gd2po_jax.evaluation.safe_alignment`).
What depends on the run's task is asked of the task (`gd2po_jax.tasks.task_of` and the `Task` hooks).

May import: errors, config, runtime, models, data, rewards, training, tasks, rl.
"""

from gd2po_jax.evaluation.api_bank import (
    ApiBankReport,
    ApiBankScore,
    aggregate_api_bank,
    api_bank_report,
    api_bank_scorer,
    score_api_bank,
)

__all__ = [
    "ApiBankReport",
    "ApiBankScore",
    "aggregate_api_bank",
    "api_bank_report",
    "api_bank_scorer",
    "score_api_bank",
]
