"""Minimal safetensors reader/writer on numpy memory maps.

Reading maps each file once and hands out zero-copy views, so a loader can slice exactly the part
of a tensor that one device needs. Writing streams tensor by tensor, so saving a model needs one
host copy of one tensor at a time. bfloat16 is supported through ``ml_dtypes``.

Format: 8-byte little-endian header length N, N bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the data.
"""

from __future__ import annotations

import json
import pathlib
import struct
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def dtype_code(dtype) -> str:
    """safetensors dtype string ("F32", "BF16", ...) of a numpy/jax dtype."""
    dtype = np.dtype(dtype)
    if dtype not in _NAMES:
        raise ValueError(f"dtype {dtype} cannot be stored in safetensors; use one of {sorted(_DTYPES)}")
    return _NAMES[dtype]


def read_header(file: pathlib.Path) -> tuple[dict, int]:
    """(header without ``__metadata__``, byte offset where the data starts), checked against the
    file: every tensor's bytes must lie inside it and match its shape and dtype.

    Raises:
      ValueError: naming the file (and the tensor), when it is truncated or not a safetensors file.
    """
    file_size = pathlib.Path(file).stat().st_size
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{file}: not a safetensors file (shorter than 8 bytes)")
        (size,) = struct.unpack("<Q", raw)
        if 8 + size > file_size:
            raise ValueError(
                f"{file}: truncated or not a safetensors file (its header claims {size} bytes, "
                f"the file has {file_size})"
            )
        try:
            header = json.loads(f.read(size))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{file}: not a safetensors file (its header is not JSON: {err})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file}: not a safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    for name, entry in header.items():
        _check_entry(file, name, entry, data_size=file_size - 8 - size)
    return header, 8 + size


def _check_entry(file: pathlib.Path, name: str, entry, data_size: int) -> None:
    """A header entry's offsets lie inside the ``data_size`` bytes after the header and span its
    shape and dtype (a dtype this reader lacks is reported when the tensor is read)."""
    try:
        begin, end = (int(x) for x in entry["data_offsets"])
        shape = tuple(int(n) for n in entry["shape"])
        code = entry["dtype"]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{file}: tensor {name!r} has a malformed header entry {entry!r}") from None
    if not 0 <= begin <= end:
        raise ValueError(f"{file}: tensor {name!r} has invalid data offsets [{begin}, {end})")
    if end > data_size:
        raise ValueError(
            f"{file} is truncated: tensor {name!r} needs data bytes [{begin}, {end}), but the file "
            f"has {data_size} bytes of data; the file is incomplete (a killed or failed copy or save)"
        )
    if code in _DTYPES and end - begin != _nbytes(shape, _DTYPES[code]):
        raise ValueError(
            f"{file}: tensor {name!r} spans {end - begin} bytes, but its shape {shape} and dtype "
            f"{code} need {_nbytes(shape, _DTYPES[code])}"
        )


class SafetensorsCheckpoint:
    """The tensors of a checkpoint directory: ``model.safetensors``, or shards listed in
    ``model.safetensors.index.json``, or (without an index) every ``*.safetensors`` file."""

    def __init__(self, directory: str | pathlib.Path):
        self.directory = pathlib.Path(directory)
        index = self.directory / INDEX_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(
                    f"{index}: not a safetensors index (a JSON object with a weight_map): {type(err).__name__}: {err}"
                ) from None
            files = sorted({self.directory / f for f in weight_map.values()})
        else:
            files = sorted(self.directory.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(
                f"no *.safetensors files in {self.directory} (PyTorch .bin checkpoints are not "
                "supported: convert with transformers' save_pretrained(safe_serialization=True))"
            )
        self._entries: dict[str, tuple[pathlib.Path, dict, int]] = {}
        for file in files:
            if not file.is_file():
                raise FileNotFoundError(f"{index} lists {file.name}, which does not exist")
            header, start = read_header(file)
            for name, entry in header.items():
                self._entries[name] = (file, entry, start)
        self._maps: dict[pathlib.Path, np.memmap] = {}

    def names(self) -> set[str]:
        return set(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name][1]["shape"])

    def file_of(self, name: str) -> pathlib.Path:
        return self._entries[name][0]

    def describe_missing(self, name: str, expected_shape: Sequence[int]) -> str:
        files = sorted({str(f.name) for f, _, _ in self._entries.values()})
        return (
            f"tensor {name!r} with shape {tuple(expected_shape)} is missing from the checkpoint "
            f"{self.directory} (files: {files})"
        )

    def get(self, name: str, expected_shape: Sequence[int]) -> np.ndarray:
        """Read-only memory-mapped view of tensor ``name``; checks its shape."""
        if name not in self._entries:
            raise KeyError(self.describe_missing(name, expected_shape))
        file, entry, start = self._entries[name]
        shape = tuple(entry["shape"])
        if shape != tuple(expected_shape):
            raise ValueError(
                f"{file}: tensor {name!r} has shape {shape}, expected {tuple(expected_shape)} from config.json"
            )
        code = entry["dtype"]
        if code not in _DTYPES:
            raise ValueError(f"{file}: tensor {name!r} has unsupported dtype {code}")
        if file not in self._maps:
            self._maps[file] = np.memmap(file, dtype=np.uint8, mode="r")
        begin, end = entry["data_offsets"]
        return self._maps[file][start + begin : start + end].view(_DTYPES[code]).reshape(shape)


# A tensor to write: (name, shape, dtype, function producing the C-contiguous numpy data).
TensorSource = tuple[str, tuple[int, ...], np.dtype, Callable[[], np.ndarray]]


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def write_file(file: pathlib.Path, tensors: Sequence[TensorSource]) -> None:
    """Writes one safetensors file, producing and writing one tensor at a time."""
    header: dict[str, Any]
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, dtype, _ in tensors:
        size = _nbytes(shape, dtype)
        header[name] = {"dtype": dtype_code(dtype), "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, dtype, produce in tensors:
            data = np.ascontiguousarray(produce(), dtype=dtype)
            if data.shape != tuple(shape):
                raise ValueError(f"{file}: tensor {name!r} produced shape {data.shape}, declared {shape}")
            f.write(data.tobytes())


def write_checkpoint(directory: pathlib.Path, tensors: Sequence[TensorSource], max_shard_bytes: int) -> list[str]:
    """``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` + index when larger than
    ``max_shard_bytes``. Returns the file names written."""
    shards: list[list[TensorSource]] = [[]]
    size = 0
    for tensor in tensors:
        nbytes = _nbytes(tensor[1], tensor[2])
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += nbytes
    if len(shards) == 1:
        write_file(directory / SINGLE_FILE, shards[0])
        return [SINGLE_FILE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for name, shard in zip(names, shards):
        write_file(directory / name, shard)
        weight_map.update({t[0]: name for t in shard})
    total = sum(_nbytes(t[1], t[2]) for t in tensors)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2))
    return names + [INDEX_FILE]
