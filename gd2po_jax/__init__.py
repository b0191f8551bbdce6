"""gd2po-jax: multi-reward RL (GRPO, GDPO, GD2PO) for language models in JAX/Flax."""

from gd2po_jax.host_memory import retain_freed_memory

__version__ = "0.1.0"

# Before JAX starts its backend: XLA's buffers then reuse freed memory instead of page-faulting
# fresh memory on every run (gd2po_jax/host_memory.py; GD2PO_JAX_MALLOC=system turns it off).
HOST_MALLOC_TUNED = retain_freed_memory()
