"""Two rewards that pull apart, in TRL's reward-function form: ``fn(completions, **kwargs) -> list``.

``digits`` wants the number the prompt asks for, read from the data's own ``answer`` column (TRL passes
every column as a keyword argument); ``brevity`` wants short replies. A reply that writes the number
inside a long sentence scores on one and loses on the other: their group-normalised advantages
disagree in sign, the conflict GD2PO filters (docs/own_task.md). Both run unchanged under TRL's
GRPOTrainer.
"""

import re


def brevity(completions, **kwargs):
    """1 for an empty reply, falling linearly to 0 at 12 words."""
    return [max(0.0, 1.0 - len(_text(c).split()) / 12) for c in completions]


def digits(completions, answer, **kwargs):
    """The share of the answer's digits that the reply's first number has in the right places (a
    number of the wrong length loses the missing places); None (abstain) for a row without an answer."""
    scores = []
    for completion, wanted in zip(completions, answer):
        if wanted is None:
            scores.append(None)
            continue
        found = re.search(r"\d+", _text(completion))
        got = found.group(0) if found else ""
        wanted = str(wanted)
        hits = sum(a == b for a, b in zip(got, wanted))
        scores.append(hits / max(len(wanted), len(got)))
    return scores


def _text(completion):
    """The text of a completion: a string, or TRL's conversational form [{"role": "assistant", "content": ...}]."""
    return completion if isinstance(completion, str) else completion[-1]["content"]
