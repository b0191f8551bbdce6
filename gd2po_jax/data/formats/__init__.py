"""The data file formats the loaders read, one module each, every one into the row schema of
`gd2po_jax.data.schema` (local files only; nothing is downloaded):

  verl RL parquet        `prompt` (chat messages), `reward_model.ground_truth`, `data_source`
                         -> `verl_parquet.load_verl_parquet` (prompt-only files allowed with
                         `require_ground_truth=False`); every column is read
  ToolRL SFT JSON        a JSON list of {"instruction", "input", "output"} -> `toolrl_sft.load_toolrl_sft`;
                         prompt = [system: instruction, user: input], target = output
  API-Bank JSON          a JSON list of {"system", "user", "answer", ...}; `answer` is a list of
                         {"name", "parameters"} dicts, one such dict, or a Python-literal string of
                         either (parsed with `ast.literal_eval`) -> `api_bank.load_api_bank_file`,
                         `api_bank.load_api_bank` (a directory of level-{1,2,3}-api_processed.json)
  JSONL                  one JSON object per line -> `jsonl.load_jsonl`, with fields
                           "prompt": str (one user message) or a list of {"role", "content"}
                           "messages": alias of "prompt" (give exactly one of the two)
                           "ground_truth": str (optional), "target": str (optional),
                           "level": int (optional), "source": str (optional, default "jsonl")
                         other fields are extra columns; blank lines are skipped.

Each module has its file loader(s) and the row converter ``<format>_row(record, index)`` that
`gd2po_jax.data.loaders.load_records` also applies to the records of a `datasets.Dataset`. Which
format a file or a dataset is in is decided in `gd2po_jax.data.loaders`.
"""
