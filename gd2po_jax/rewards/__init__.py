"""Reward functions: the batch interface (`base`) and the ToolRL tool-calling rewards."""

from gd2po_jax.rewards.base import (
    CombinedReward,
    RewardFunction,
    build_reward_function,
    check_reward_output,
    register_reward_kind,
    reward_kinds,
)
from gd2po_jax.rewards.tool_calling import SETTINGS as TOOL_CALLING_SETTINGS
from gd2po_jax.rewards.tool_calling import (
    ToolCallingReward,
    ToolCallScore,
    score_tool_call,
)

__all__ = [
    "CombinedReward",
    "RewardFunction",
    "TOOL_CALLING_SETTINGS",
    "ToolCallScore",
    "ToolCallingReward",
    "build_reward_function",
    "check_reward_output",
    "register_reward_kind",
    "reward_kinds",
    "score_tool_call",
]
