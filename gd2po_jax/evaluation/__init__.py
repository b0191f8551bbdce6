"""Evaluation metrics (host-side Python over generated text)."""

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
