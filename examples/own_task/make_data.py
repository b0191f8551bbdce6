"""Write prompts.jsonl and validation.jsonl, the example's data (deterministic; committed as written).

Each row asks for a 4-digit number and carries it in its own ``answer`` column; ``target`` is a reply
for the supervised warm start, terse or wordy, and wrong in a few digits one time in four, so that RL
has something to fix on both rewards.

    python make_data.py
"""

import json
import pathlib
import random

TEMPLATES = ("Write the number {n}.", "Please give me the number {n}.", "Reply with {n} in digits.",
             "What number comes after {m}?")
REPLIES = ("{n}", "{n}.", "It is {n}.", "The number you asked for is {n}, as requested.",
           "Sure! Here it is: {n}. Let me know if you need anything else.")


def row(rng: random.Random) -> dict:
    n = rng.randrange(1000, 9999)
    template = rng.choice(TEMPLATES)
    reply_number = n if rng.random() > 0.25 else n + rng.choice((-10, 1, 100))
    return {"prompt": template.format(n=n, m=n - 1), "answer": str(n),
            "target": rng.choice(REPLIES).format(n=reply_number), "source": "own_task"}


def main() -> None:
    rng = random.Random(0)
    here = pathlib.Path(__file__).parent
    for name, count in (("prompts.jsonl", 512), ("validation.jsonl", 64)):
        lines = [json.dumps(row(rng)) for _ in range(count)]
        (here / name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
