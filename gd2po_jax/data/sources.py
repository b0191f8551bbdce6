"""Where a split's rows come from: ``data.train``, ``data.validation``, ``data.test`` and ``sft.data``.

`load_source` takes, in this order:

  a file                   a verl parquet, ToolRL SFT JSON, API-Bank JSON or JSONL file
                           (`gd2po_jax.data.loaders.load_data`)
  an API-Bank directory    ``level-{1,2,3}-api_processed.json`` (`gd2po_jax.data.loaders.load_api_bank`)
  a ``save_to_disk`` folder  ``datasets.load_from_disk``; a DatasetDict folder needs a split:
                           ``DIR:split``
  a directory or a glob    of ``*.parquet`` / ``*.json`` / ``*.jsonl`` files: each file loaded as a
                           file above, in sorted order, concatenated (a row error names its file)
  a Hub id                 ``org/name`` or ``org/name:split`` (default split ``train``), optionally
                           ``org/name@revision:split``: the data set repository's snapshot
                           (`gd2po_jax.runtime.hub.snapshot`, so HF_HOME, HF_HUB_OFFLINE and tokens
                           apply), read with ``datasets.load_dataset``

Rows of a `datasets.Dataset` (the last three) are converted by the loader of their format, told
from their columns (`gd2po_jax.data.loaders.load_records`), their other columns kept as extra
columns as a file's are; their errors name the folder, glob or id and the 0-based row.
"""

from __future__ import annotations

import glob
import pathlib
import re

import datasets

from gd2po_jax.data.loaders import DataFormatError, LoadResult, OnError, load_data, load_records
from gd2po_jax.runtime.hub import HubId, snapshot

DATA_FILE_SUFFIXES = (".parquet", ".json", ".jsonl")
"""The files a directory or glob of data files is made of."""

_SAVED_DATASET_FILES = ("dataset_info.json", "state.json", "dataset_dict.json")
_SPLIT = re.compile(r"^(?P<source>.+?):(?P<split>[A-Za-z0-9_.-]+)$")


def _split_suffix(source: str) -> tuple[str, str | None]:
    """(``source`` without a trailing ``:split``, the split or None). A ``:`` belongs to the path
    when the whole text exists on disk."""
    match = _SPLIT.match(source)
    if match is None or pathlib.Path(source).exists():
        return source, None
    return match["source"], match["split"]


def _is_saved_dataset(directory: pathlib.Path) -> bool:
    return any((directory / name).is_file() for name in _SAVED_DATASET_FILES)


def _is_api_bank_dir(directory: pathlib.Path) -> bool:
    return any(directory.glob("level-*-api_processed.json"))


def _select_split(name: str, loaded, split: str | None) -> datasets.Dataset:
    """The `datasets.Dataset` of ``split`` in ``loaded`` (a Dataset, or a DatasetDict that needs one)."""
    if isinstance(loaded, datasets.DatasetDict):
        if split is None:
            raise DataFormatError(name, None, None, f"holds the splits {sorted(loaded)}: name one as {name}:SPLIT")
        if split not in loaded:
            raise DataFormatError(name, None, None, f"has no split {split!r}; it has {sorted(loaded)}")
        return loaded[split]
    if split is not None:
        raise DataFormatError(name, None, None, f"is one data set without splits: drop ':{split}'")
    return loaded


def _load_files(name: str, files: list[pathlib.Path], kind: str, on_error: OnError, **options) -> LoadResult:
    """The files' rows concatenated in order (each file's ``row`` its index in that file)."""
    if not files:
        suffixes = ", ".join("*" + suffix for suffix in DATA_FILE_SUFFIXES)
        raise DataFormatError(name, None, None, f"holds no data files ({suffixes})")
    results = [load_data(file, kind=kind, on_error=on_error, **options) for file in files]
    dataset = datasets.concatenate_datasets([result.dataset for result in results])
    return LoadResult(dataset, tuple(error for result in results for error in result.skipped))


def load_source(
    source: str, *, kind: str = "auto", on_error: OnError = "raise", what: str = "data source", **options
) -> LoadResult:
    """The rows of ``source`` (any form of the module docstring) in the `FEATURES` schema.

    ``options`` go to the loader (e.g. ``require_ground_truth=False``); ``what`` names the source
    in errors (e.g. ``"config.data.train"``).

    Raises:
      FileNotFoundError: ``source`` is none of the forms (naming it and the forms), or a Hub id that
        cannot be had (naming it and the command that fetches it).
      DataFormatError: a malformed row or file, naming the file (or folder, glob, id) and the row.
    """
    path = pathlib.Path(source)
    if path.is_file() or (path.is_dir() and _is_api_bank_dir(path)):
        return load_data(path, kind=kind, on_error=on_error, **options)
    if path.is_dir() and not _is_saved_dataset(path):
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in DATA_FILE_SUFFIXES)
        return _load_files(source, files, kind, on_error, **options)
    if glob.has_magic(source):
        files = sorted(pathlib.Path(p) for p in glob.glob(source) if pathlib.Path(p).is_file())
        return _load_files(source, files, kind, on_error, **options)
    location, split = _split_suffix(source)
    if pathlib.Path(location).is_dir() and _is_saved_dataset(pathlib.Path(location)):
        records = _select_split(source, datasets.load_from_disk(location), split)
        return load_records(source, records, kind=kind, on_error=on_error, **options)
    looks_like_a_file = pathlib.Path(location).suffix.lower() in DATA_FILE_SUFFIXES
    hub_id = None if pathlib.Path(location).exists() or looks_like_a_file else HubId.parse(location)
    if hub_id is None:
        raise FileNotFoundError(
            f"{what}: {source!r} does not exist; give a data file, a directory or glob of data files, a datasets "
            "save_to_disk folder (DIR or DIR:split) or a Hugging Face Hub data set id (org/name or org/name:split)"
        )
    local = snapshot(hub_id, repo_type="dataset", what=what)
    records = datasets.load_dataset(str(local), split=split or "train")
    return load_records(source, records, kind=kind, on_error=on_error, **options)
