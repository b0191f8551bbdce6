"""Build a tiny random Qwen2 (and a tokenizer trained on the example's data) to try the example on a
CPU without downloading a model: ``python make_tiny_model.py tiny_model``. A real instruct model works
the same way: ``--config.model.path=Qwen/Qwen2.5-0.5B-Instruct`` (docs/own_task.md).
"""

import json
import pathlib
import sys

try:
    import gd2po_jax  # noqa: F401  (installed: pip install .)
except ModuleNotFoundError:  # run from a checkout's examples/own_task/, as its README says: the checkout's package
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from gd2po_jax.config import TinyModelConfig  # noqa: E402
from gd2po_jax.tasks.base import build_tiny_model  # noqa: E402

SHAPE = TinyModelConfig(vocab_size=512, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4,
                        num_kv_heads=4, head_dim=32, seed=0)
"""The embedded default's model shape (configs/default.py), with a smaller vocabulary."""


def corpus(directory: pathlib.Path) -> list[str]:
    """The texts of the example's data files: what the tokenizer is trained on."""
    texts = []
    for name in ("prompts.jsonl", "validation.jsonl"):
        for line in (directory / name).read_text().splitlines():
            row = json.loads(line)
            texts += [row["prompt"], row["target"], row["answer"]]
    return texts + [str(d) for d in range(10)]


def main(out_dir: str) -> None:
    here = pathlib.Path(__file__).resolve().parent
    path = build_tiny_model(pathlib.Path(out_dir), corpus(here), SHAPE, SHAPE.vocab_size)
    print(f"tiny model: {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny_model")
