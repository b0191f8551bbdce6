"""gd2po-jax: multi-reward RL (GRPO, GDPO, GD2PO) for language models in JAX/Flax."""

import logging

from gd2po_jax.runtime.host_memory import retain_freed_memory

__version__ = "0.1.0"

# Before JAX starts its backend: XLA's buffers then reuse freed memory instead of page-faulting
# fresh memory on every run (gd2po_jax/runtime/host_memory.py; GD2PO_JAX_MALLOC=system turns it off).
HOST_MALLOC_TUNED = retain_freed_memory()

# Without torch (a test-only dependency), importing transformers logs "PyTorch was not found. Models
# won't be available ...": true and beside the point here, where transformers serves tokenizers,
# configs and chat templates. That one record is dropped; the logger's others pass.
logging.getLogger("transformers").addFilter(lambda record: not record.getMessage().startswith("PyTorch was not found."))
