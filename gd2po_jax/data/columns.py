"""The column names of the data: those of the loaded row schema (`gd2po_jax.data.schema.FEATURES`),
the JSONL alias of ``prompt``, and those rollouts add for reward functions.

A plain module of strings, importing nothing, so that every layer can name a column without
importing the layer that fills it (the rewards read `RESPONSE_IDS` from here, the data refuses it
from here).
"""

PROMPT = "prompt"
"""The chat messages before the answer: a list of {"role": str, "content": str}."""

GROUND_TRUTH = "ground_truth"
"""What the reward scores against (str or None)."""

TARGET = "target"
"""The assistant text to imitate in supervised warm starts (str or None)."""

LEVEL = "level"
"""The API-Bank difficulty level, or a JSONL row's own (int or None)."""

SOURCE = "source"
"""Where a row comes from ("rlla", "toolrl_sft", "api_bank", "jsonl", ...)."""

ROW = "row"
"""A row's 0-based index in its file."""

PROMPT_TEXT = "prompt_text"
"""The column of the prompt as the data gave it when it was one string (else None)."""

EXTRA_COLUMNS = "extra_columns"
"""The column of a row's other columns, pickled (`gd2po_jax.data.schema.decode_extra_columns`)."""

PROMPT_ALIAS = "messages"
"""The JSONL name of ``prompt`` (not an extra column)."""

RESPONSE_IDS = "response_ids"
"""The column `gd2po_jax.rl.rollout.collect_rollouts` (and greedy evaluation) adds for each rollout: the
policy's sampled token ids of the response, EOS included, padding not (a list of ints). A dataset
column of this name is refused (`gd2po_jax.data.prompts.build_prompt_set`)."""

ROLLOUT_INDEX = "rollout_index"
"""The column `gd2po_jax.rl.rollout.collect_rollouts` adds for each rollout: its 0-based index in the
step (prompt-major: prompt i's rollouts are i*G .. i*G+G-1), so that what a function reports per
rollout (TRL's ``log_extra``) lands on the right one. A dataset column of this name is refused."""

RESERVED_COLUMNS = (ROW, PROMPT_TEXT, EXTRA_COLUMNS, RESPONSE_IDS, ROLLOUT_INDEX)
"""Record keys that are refused (`gd2po_jax.data.schema.DataFormatError`, "rename it"): each would be
silently shadowed, by a `FEATURES` column the loader sets, or by a column rollouts give reward
functions (`RESPONSE_IDS`, `ROLLOUT_INDEX`)."""

TASK_COLUMNS = (GROUND_TRUTH, TARGET, LEVEL, SOURCE)
"""Schema columns a JSONL row may also give as a column of its own. A task reads some of them (a
built-in family's ground truth, the warm start's target): those are typed, with an error naming what
reads them; any other keeps the row's value, of any type, and reaches reward functions as it is. One
the data does not give does not reach them at all (`gd2po_jax.data.schema.dataset_columns`)."""
