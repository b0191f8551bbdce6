"""One process of tests/runtime/test_distributed.py's check of the helpers across processes.

    python -m tests.runtime.multihost_worker --port=P --process_id=I --out=DIR

Joins the other process (`gd2po_jax.runtime.distributed.initialize`; 4 CPU devices each, from
JAX_NUM_CPU_DEVICES), runs each helper of `gd2po_jax.runtime.distributed` on small arrays over the 8
devices of both (mesh fsdp=8), exports a tiny policy whose parameters are split over the 8 devices
to ``DIR/exported`` (`export_split_policy`), scores conversations with a tiny reward model
sharded over the 8 devices (`score_with_a_reward_model`), and writes what it saw to
``DIR/helpers.p<I>.json`` for the test to check.
Then process 0 fails on purpose (``SystemExit``), while process 1 waits at a barrier that process 0
never reaches: process 1's watchdog must stop it with process 0's error. Tiny programs only.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax
import numpy as np

from gd2po_jax.config import DistributedConfig
from gd2po_jax.runtime import distributed

NUM_ROWS = 16


def rows_data() -> np.ndarray:
    """[16, 3] int32: the batch whose rows the processes share out."""
    return np.arange(NUM_ROWS * 3, dtype=np.int32).reshape(NUM_ROWS, 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--process_id", type=int, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    distributed.initialize(DistributedConfig(coordinator_address=f"localhost:{args.port}", num_processes=2,
                                             process_id=args.process_id, heartbeat_timeout_s=10))
    with distributed.stop_all_on_error():
        seen = helpers()
        seen["reward_model_scores"] = score_with_a_reward_model()
        export_split_policy(args.out / "exported")
        (args.out / f"helpers.p{args.process_id}.json").write_text(json.dumps(seen))
        distributed.barrier("helpers done")
        if args.process_id == 0:
            raise SystemExit("multihost_worker: process 0 fails on purpose")
        distributed.barrier("never reached: process 0 has failed")


def helpers() -> dict:
    from gd2po_jax.runtime.sharding import make_mesh

    index = jax.process_index()
    mesh = make_mesh(data=1, fsdp=8)
    data = rows_data()
    built = []

    def build(rows):
        built.append(rows.tolist())
        return data[rows], data[rows] % 2 == 0  # a pytree: int and bool rows

    ids, even = distributed.batch_rows(build, NUM_ROWS, mesh)
    doubled = jax.jit(lambda x: x * 2, out_shardings=distributed.row_sharding(mesh, NUM_ROWS))(ids)
    rows, own = distributed.addressable_rows(doubled)
    every, every_even = distributed.gather_rows(rows, (own, np.asarray(distributed.addressable_rows(even)[1])),
                                                NUM_ROWS)
    (few,) = distributed.batch_rows(lambda r: (data[:4][r],), 4, mesh)  # 4 rows on 8 devices: replicated
    replicated = distributed.replicated(np.float32([0.5, np.nan]), mesh)
    return {
        "devices": [jax.process_count(), jax.local_device_count(), jax.device_count()],
        "built": built,
        "whole": distributed.host_value(ids).tolist(),
        "even": distributed.host_value(even).tolist(),
        "rows": rows.tolist(), "own": own.tolist(),
        "gathered": every.tolist(), "gathered_even": every_even.tolist(),
        "few_rows": distributed.process_rows(distributed.row_sharding(mesh, 4), 4).tolist(),
        "few": distributed.host_value(few).tolist(),
        "replicated": [str(v) for v in distributed.host_value(replicated)],
        "texts": distributed.gather_texts("é" * 3000 if index else None, limit=15),  # cut in a character
        "primary_decides": distributed.primary_decides(index == 0),
        "any_process": [distributed.any_process(index == 1), distributed.any_process(False)],
        "is_primary": distributed.is_primary(),
    }


def reward_model_inputs() -> tuple[list, list[str]]:
    """16 conversations: the first Alpaca prompts' messages (tests/fixture_data.py) and short replies."""
    from tests.fakes import alpaca_prompts

    return list(alpaca_prompts()[:NUM_ROWS]), [f"Reply number {i}, short." for i in range(NUM_ROWS)]


def reward_model_scores(mesh) -> list[float]:
    """The scores of `reward_model_inputs` by the tiny align-anything-layout reward model of
    tests/fakes.py, its parameters sharded over ``mesh`` (the reward-model reward kind)."""
    from gd2po_jax.rewards import build_reward_function
    from tests.fakes import tiny_score_model_dir

    messages, replies = reward_model_inputs()
    spec = {"path": str(tiny_score_model_dir("amo")), "dtype": "float32", "batch_size": 8}
    reward = build_reward_function({"kind": "reward_model", "names": ["useful"], "reward_models": {"useful": spec},
                                    "mesh": mesh})
    return np.asarray(reward([""] * NUM_ROWS, replies, {"prompt": messages}))[:, 0].tolist()


def score_with_a_reward_model() -> list[float]:
    """`reward_model_scores` over the 8 devices of both processes (fsdp=8: each process holds half of
    every split parameter), every process passing the same rows, as `collect_rollouts` does for
    reward models (`scores_on_devices`)."""
    from gd2po_jax.runtime.sharding import make_mesh

    return reward_model_scores(make_mesh(data=1, fsdp=8))


def tiny_policy():
    """The tiny Decoder the worker exports (the same on every process: seeded)."""
    from flax import nnx

    from gd2po_jax.models import Decoder
    from tests.fakes import tiny_model_config

    return Decoder(tiny_model_config(tie_word_embeddings=True), rngs=nnx.Rngs(0))


def export_split_policy(out_dir: pathlib.Path) -> None:
    """`save_pretrained` of `tiny_policy` to ``out_dir/unsplit`` as it is (on one device of each
    process), then to ``out_dir/split`` with its parameters on their fsdp=8 shardings: each process
    holds half of every split parameter."""
    from flax import nnx

    from gd2po_jax.models import save_pretrained
    from gd2po_jax.runtime.sharding import make_mesh, variable_sharding

    mesh = make_mesh(data=1, fsdp=8)
    model = tiny_policy()
    save_pretrained(model, out_dir / "unsplit")
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Param):
            node.set_value(jax.device_put(np.asarray(node[...]), variable_sharding(node, mesh)))
    assert not all(x.is_fully_addressable for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    save_pretrained(model, out_dir / "split")
    distributed.barrier("exported")


if __name__ == "__main__":
    main()
