"""How long one step's reward scoring takes with three reward functions that each sleep ``--sleep_s``
per call (a remote judge, an API): two plain TRL-form functions and an async one, over ``--rollouts``
rollouts, with ``rewards.num_workers`` = 1 and 3. Prints one JSON object per setting (the median of
``--repeats`` steps).

    python -m bench.reward_concurrency --sleep_s=0.2

Run at an older commit (the same file copied there) to compare with the scorer of that commit.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import textwrap
import time

FUNCTIONS = textwrap.dedent("""
    import asyncio, time

    SLEEP_S = {sleep_s}

    def first(completions, **kwargs):
        time.sleep(SLEEP_S)
        return [1.0] * len(completions)

    def second(completions, **kwargs):
        time.sleep(SLEEP_S)
        return [2.0] * len(completions)

    async def third(completions, **kwargs):
        await asyncio.sleep(SLEEP_S)
        return [3.0] * len(completions)
""")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sleep_s", type=float, default=0.2)
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    from gd2po_jax.config import FunctionEntry
    from gd2po_jax.rewards.base import CombinedReward
    from gd2po_jax.rewards.scoring import score_batch
    from gd2po_jax.rewards.user_functions import load_function

    directory = pathlib.Path(tempfile.mkdtemp())
    (directory / "sleepers.py").write_text(FUNCTIONS.format(sleep_s=args.sleep_s))
    reward = CombinedReward(
        tuple(
            load_function(FunctionEntry.parse(f"{directory / 'sleepers.py'}:{name}", i))
            for i, name in enumerate(("first", "second", "third"))
        )
    )
    n = args.rollouts
    columns = {"prompt_text": ["p"] * n, "row": list(range(n))}
    for workers in (1, 3):
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            scores = score_batch(reward, ["p"] * n, ["x"] * n, columns, num_workers=workers, timeout_s=600)
            seconds.append(time.perf_counter() - start)
        assert scores.rewards.shape == (n, 3)
        print(json.dumps({"bench": "reward_concurrency", "functions": 3, "sleep_s_per_call": args.sleep_s,
                          "rollouts": n, "num_workers": workers, "step_scoring_s": round(statistics.median(seconds), 3),
                          "python": sys.version.split()[0]}))


if __name__ == "__main__":
    main()
