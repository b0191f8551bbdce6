"""gd2po-jax: multi-reward RL (GRPO, GDPO, GD2PO) for language models in JAX/Flax."""

__version__ = "0.1.0"
