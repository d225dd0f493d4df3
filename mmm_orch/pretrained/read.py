"""Pretrained weights into a parallelized model, each rank reading only the part of each tensor
its shards hold (a 70B start never holds the whole model on one rank): from safetensors files
by their checked offsets through a memory map, from Meta's consolidated.NN.pth through
torch.load(mmap=True, weights_only=True), which unpickles nothing but tensors.

Hugging Face stores q and k rows of each head in rotate-half order; the trainer's RoPE pairs
neighbouring rows, as Meta's checkpoints do, so those rows are put back per head on the way in
(and out again in export.py).
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from mmm_orch.errors import PretrainedError
from mmm_orch.pretrained.formats import DTYPE_BYTES, Source, TensorInfo, check_regular

TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                "BF16": torch.bfloat16}  # fmt: skip
# Wrappers that put a segment into a parameter's name (activation checkpointing, compile).
WRAPPER_SEGMENTS = {"_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module"}

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes) of a part of a tensor


class Reader(Protocol):
    def read(self, name: str, box: Box) -> torch.Tensor:
        """The part `box` of the trainer's parameter `name`, in the trainer's layout."""
        ...


def open_reader(source: Source, args: Any) -> Reader:
    """A reader of `source` for a model of `args` (formats.check_model passed); PretrainedError
    for a .pth that is not a dictionary of tensors of the model's names and shapes."""
    if source.kind == "hf":
        return HFReader(source, args)
    return MetaReader(source, args)


def load_weights(model: nn.Module, reader: Reader) -> int:
    """Every parameter of `model` (plain, or a DTensor of any FSDP/TP layout) filled with this
    rank's part of the pretrained tensor; the number of values read."""
    values = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if isinstance(param, DTensor):
                chunk = param.__create_chunk_list__()[0]  # a DTensor's one local shard
                box = (tuple(chunk.offsets), tuple(chunk.sizes))
                local = param.to_local()
            else:
                box, local = ((0,) * param.dim(), tuple(param.shape)), param.data
            if local.numel():
                part = reader.read(canonical(name), box)
                local.copy_(part.reshape(local.shape))
                values += part.numel()
    return values


def canonical(name: str) -> str:
    """A parameter's name without the segments wrappers add."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


class HFReader:
    def __init__(self, source: Source, args: Any):
        self.source, self.args = source, args
        self.maps: dict[Path, np.memmap] = {}

    def read(self, name: str, box: Box) -> torch.Tensor:
        mapped = self.source.checkpoint
        heads = mapped.rotated_heads(name, self.args)
        info = self.source.tensors[mapped.hf_name(name)]
        if not heads:
            return self._slice(info, box)
        # Whole heads covering the rows asked for, put back in pair order, then the rows.
        (row, *rest), (rows, *sizes) = box
        head = info.shape[0] // heads
        first, last = row // head, math.ceil((row + rows) / head)
        whole = self._slice(info, ((first * head, *rest), ((last - first) * head, *sizes)))
        paired = whole.view(last - first, 2, head // 2, -1).transpose(1, 2).reshape(whole.shape)
        start = row - first * head
        return paired[start : start + rows]

    def _slice(self, info: TensorInfo, box: Box) -> torch.Tensor:
        """The box's values, read through a map of the file (only their pages are touched)."""
        if info.file not in self.maps:
            self.maps[info.file] = np.memmap(info.file, dtype=np.uint8, mode="r")
        width = DTYPE_BYTES[info.dtype]
        raw = self.maps[info.file][info.start : info.end]
        if not info.shape:
            return _typed(np.array(raw), info.dtype, ())
        raw = raw.reshape(*info.shape[:-1], info.shape[-1] * width)
        offsets, sizes = box
        index = tuple(slice(o, o + s) for o, s in zip(offsets[:-1], sizes[:-1], strict=True)) + (
            slice(offsets[-1] * width, (offsets[-1] + sizes[-1]) * width),
        )
        return _typed(np.array(raw[index]), info.dtype, sizes)  # a copy: the map is read-only


def _typed(data: np.ndarray, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The bytes as the dtype's values (formats.check_model admits floating-point ones only)."""
    return torch.from_numpy(data).view(TORCH_DTYPES[dtype]).reshape(shape)


class MetaReader:
    """Meta's consolidated.NN.pth: one file per model-parallel rank, each holding its slice of
    the split tensors (the model's meta_split) and a copy of the rest."""

    def __init__(self, source: Source, args: Any):
        self.meta_split = source.checkpoint.meta_split
        self.parts = [_load_pth(file) for file in source.shards]
        for name, shape in source.checkpoint.shapes(args).items():
            found = self._shape(name, source)
            if found != shape:
                raise PretrainedError(
                    f"--init-from {source.path}: {name} has shape {list(found)} across "
                    f"{len(self.parts)} consolidated files, the run's model {list(shape)}"
                )

    def _shape(self, name: str, source: Source) -> tuple[int, ...]:
        for part, file in zip(self.parts, source.shards, strict=True):
            if name not in part:
                raise PretrainedError(f"{file}: no tensor {name}")
        first = tuple(self.parts[0][name].shape)
        split = self.meta_split(name)
        if split is None or len(self.parts) == 1:
            return first
        total = sum(part[name].shape[split] for part in self.parts)
        return (*first[:split], total, *first[split + 1 :])

    def read(self, name: str, box: Box) -> torch.Tensor:
        offsets, sizes = box
        split = self.meta_split(name)
        if split is None or len(self.parts) == 1:
            return self.parts[0][name][_index(offsets, sizes)].clone()
        pieces, base = [], 0  # the files' slices along `split` that the box covers
        for part in self.parts:
            tensor = part[name]
            width = tensor.shape[split]
            low, high = max(offsets[split], base), min(offsets[split] + sizes[split], base + width)
            if low < high:
                local = list(offsets)
                local[split], part_sizes = low - base, list(sizes)
                part_sizes[split] = high - low
                pieces.append(tensor[_index(tuple(local), tuple(part_sizes))])
            base += width
        return torch.cat(pieces, dim=split)


def _index(offsets: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))


def _load_pth(file: Path) -> dict[str, torch.Tensor]:
    """A consolidated file's tensors, mapped rather than read; PretrainedError for anything but
    a dictionary of tensors (weights_only refuses to unpickle other objects)."""
    check_regular(file)  # torch.load would wait forever on a FIFO
    try:
        loaded = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PretrainedError(f"{file}: not a checkpoint of tensors ({reason[:200]})") from None
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
    ):
        raise PretrainedError(
            f"{file}: holds {type(loaded).__name__}, not a dictionary of tensors by name"
        )
    return loaded
