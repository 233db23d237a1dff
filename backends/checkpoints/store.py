"""Lazy reads of a safetensors checkpoint directory, and the writer that makes one (sharded, with its index).

A checkpoint directory is what Hugging Face releases hold: ``config.json``, ``model.safetensors.index.json``
(``weight_map``: tensor key -> shard file) and the shards, or one ``model.safetensors``. `Checkpoint` opens a
shard only when a key in it is read, checks every tensor's dtype and shape from the safetensors header before
any data is read, and reads a slice (`rows` of the first dims) through ``safe_open(...).get_slice`` so that a
rank's subset is read without the rest (safetensors memory-maps the file; only the sliced bytes are copied).
`reads` records every key read, so tests can prove that nothing else was.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from backends.model_shapes import read_json

__all__ = ["INDEX_FILE", "SINGLE_FILE", "Checkpoint", "CheckpointError", "write_checkpoint"]

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

#: safetensors header dtype names (the format spec) <-> torch dtypes
_DTYPES = {"U8": torch.uint8, "I8": torch.int8, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
           "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I32": torch.int32,
           "I64": torch.int64, "BOOL": torch.bool}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as asked; the message names the file, the key and the fix."""


def _safetensors():
    try:
        import safetensors  # noqa: F401
        from safetensors import safe_open
        from safetensors.torch import save_file
    except ImportError as exc:  # pragma: no cover - the extra is missing
        raise ImportError("reading checkpoints needs safetensors: pip install 'moe-oracle[transformers]'") from exc
    return safe_open, save_file


def dtype_name(dtype: torch.dtype) -> str:
    """The safetensors name of a torch dtype ('U8', 'F8_E4M3', ...)."""
    for name, value in _DTYPES.items():
        if value == dtype:
            return name
    return str(dtype)


class Checkpoint:
    """A checkpoint directory (or one .safetensors file) read lazily; see the module docstring."""

    def __init__(self, path: str | os.PathLike):
        path = Path(path)
        if path.is_file() and path.suffix == ".safetensors":
            self.directory, files = path.parent, [path.name]
            self.weight_map = self._header_keys(path.parent, files)
        elif path.is_dir():
            self.directory = path
            index = path / INDEX_FILE
            if index.is_file():
                try:
                    weight_map = read_json(index, CheckpointError)["weight_map"]
                except (KeyError, TypeError) as exc:
                    raise CheckpointError(f"{index}: not a safetensors index ({exc}); it must be JSON with a "
                                          f"'weight_map' mapping tensor keys to shard files") from None
                if not isinstance(weight_map, dict):
                    raise CheckpointError(f"{index}: 'weight_map' must map tensor keys to shard files")
                self.weight_map = dict(weight_map)
            elif (path / SINGLE_FILE).is_file():
                self.weight_map = self._header_keys(path, [SINGLE_FILE])
            else:
                raise CheckpointError(f"{path}: no {INDEX_FILE} and no {SINGLE_FILE}; pass a Hugging Face "
                                      f"checkpoint directory (or one .safetensors file)")
        else:
            raise CheckpointError(f"{path}: no such checkpoint directory or .safetensors file")
        self.path = path
        self.config = self._read_config()
        self.reads: list[str] = []  # every key whose data was read, in order
        self.opened: list[str] = []  # every shard file opened, in order
        self._handles: dict[str, Any] = {}

    # ------------------------------------------------------------------ metadata
    def _header_keys(self, directory: Path, files: Sequence[str]) -> dict[str, str]:
        safe_open, _ = _safetensors()
        weight_map = {}
        for name in files:
            with safe_open(str(directory / name), framework="pt") as handle:
                weight_map.update(dict.fromkeys(handle.keys(), name))
        return weight_map

    def _read_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {}
        for name in ("config.json", "hf_quant_config.json"):
            file = self.directory / name
            if not file.is_file():
                continue
            data = read_json(file, CheckpointError)
            if name == "config.json":
                config.update(data)
            else:  # ModelOpt's separate quant file: {"quantization": {"quant_algo": "NVFP4", ...}}
                config.setdefault("quantization_config", {"quant_method": "modelopt", **data.get("quantization", {})})
        return config

    def keys(self) -> Iterable[str]:
        return self.weight_map.keys()

    def file_of(self, key: str) -> str:
        return self.weight_map[key]

    def _handle(self, key: str):
        name = self.weight_map[key]
        if name not in self._handles:
            safe_open, _ = _safetensors()
            file = self.directory / name
            if not file.is_file():
                raise CheckpointError(f"{file}: shard named by {INDEX_FILE} for {key!r} is missing")
            self._handles[name] = safe_open(str(file), framework="pt")
            self.opened.append(name)
        return self._handles[name]

    def spec(self, key: str) -> tuple[str, tuple[int, ...]]:
        """(safetensors dtype name, shape) of a key, from the shard header (no data read)."""
        sl = self._handle(key).get_slice(key)
        return sl.get_dtype(), tuple(sl.get_shape())

    def require(self, key: str, dtypes: Sequence[str], shapes: Sequence[tuple[int, ...]], what: str) -> None:
        """Fail with key, expected and found unless `key` exists with one of `dtypes` and one of `shapes`."""
        if key not in self.weight_map:
            searched = self.directory / (INDEX_FILE if (self.directory / INDEX_FILE).is_file() else SINGLE_FILE)
            raise CheckpointError(f"{key!r} is missing from {searched} ({what}); the checkpoint is incomplete "
                                  f"or not in this layout")
        dtype, found = self.spec(key)
        if dtype not in dtypes:
            raise CheckpointError(f"{key!r} in {self.file_of(key)}: dtype {dtype}, expected {' or '.join(dtypes)} "
                                  f"({what})")
        if found not in [tuple(s) for s in shapes]:
            expected = " or ".join(str(tuple(s)) for s in shapes)
            raise CheckpointError(f"{key!r} in {self.file_of(key)}: shape {found}, expected {expected} ({what}); "
                                  f"check the model config's sizes against the checkpoint")

    # ------------------------------------------------------------------ data
    def read(self, key: str, rows: Sequence[slice | int | list] = ()) -> torch.Tensor:
        """The tensor (or the `rows` slices of its leading dims: slices, ints, or lists of expert ids)."""
        handle = self._handle(key)
        self.reads.append(key)
        if not rows:
            return handle.get_tensor(key)
        sl = handle.get_slice(key)
        if rows and isinstance(rows[0], list):  # an expert subset: one contiguous run at a time
            ids, rest = rows[0], tuple(rows[1:])
            if not ids:
                raise CheckpointError(f"{key!r}: the expert subset is empty; pass at least one expert id")
            parts, run_start = [], 0
            for i in range(1, len(ids) + 1):
                if i == len(ids) or ids[i] != ids[i - 1] + 1:
                    parts.append(sl[(slice(ids[run_start], ids[i - 1] + 1), *rest)])
                    run_start = i
            return torch.cat(parts) if len(parts) > 1 else parts[0]
        return sl[tuple(rows)]

    def close(self) -> None:
        self._handles.clear()


def write_checkpoint(directory: str | os.PathLike, tensors: Mapping[str, torch.Tensor], *,
                     config: Mapping[str, Any] | None = None, shards: int = 2) -> Path:
    """Write `tensors` as Hugging Face does: ``model-0000i-of-0000n.safetensors`` shards plus the index.

    Keys are split into `shards` files in sorted order (so one layer's tensors may straddle two shards, as in
    real releases); `config` becomes ``config.json``. Every file is written first into a fresh private
    directory beside them (a name nobody can have planted a symlink at) and renamed, so a failure leaves no
    partial checkpoint under the final names.
    """
    _, save_file = _safetensors()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    keys = sorted(tensors)
    shards = max(1, min(shards, len(keys)))
    per_shard = -(-len(keys) // shards)
    weight_map, total = {}, 0
    staging = Path(tempfile.mkdtemp(prefix=".writing-", dir=directory))
    try:
        names = []
        for i in range(shards):
            name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            chunk = {k: tensors[k].detach().contiguous().clone() for k in keys[i * per_shard:(i + 1) * per_shard]}
            save_file(chunk, str(staging / name), metadata={"format": "pt"})
            names.append(name)
            weight_map.update(dict.fromkeys(chunk, name))
            total += sum(t.numel() * t.element_size() for t in chunk.values())
        (staging / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                     indent=1))
        names.append(INDEX_FILE)
        if config is not None:
            (staging / "config.json").write_text(json.dumps(dict(config), indent=1))
            names.append("config.json")
        for name in names:
            os.replace(staging / name, directory / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory
