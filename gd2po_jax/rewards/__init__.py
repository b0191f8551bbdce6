"""Reward functions: the batch interface and registry (`base`), the ToolRL tool-calling rewards,
reward models as rewards (`reward_model`), and the host-side scoring of rollouts (`scoring`).

May import: errors, config, runtime, models, data.
"""

from gd2po_jax.rewards.base import (
    RESPONSE_IDS,
    CombinedReward,
    RewardFunction,
    RewardOutputError,
    build_reward_function,
    check_reward_output,
    register_reward_kind,
    reward_kinds,
    reward_step_metrics,
)
from gd2po_jax.rewards.reward_model import RewardModelReward
from gd2po_jax.rewards.tool_calling import SETTINGS as TOOL_CALLING_SETTINGS
from gd2po_jax.rewards.tool_calling import (
    ToolCallingReward,
    ToolCallScore,
    is_correct,
    score_tool_call,
)

__all__ = [
    "RESPONSE_IDS",
    "CombinedReward",
    "RewardFunction",
    "RewardModelReward",
    "RewardOutputError",
    "TOOL_CALLING_SETTINGS",
    "ToolCallScore",
    "ToolCallingReward",
    "build_reward_function",
    "check_reward_output",
    "is_correct",
    "register_reward_kind",
    "reward_kinds",
    "reward_step_metrics",
    "score_tool_call",
]
