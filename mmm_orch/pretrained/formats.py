"""Pretrained checkpoints on disk, read without torch: a Hugging Face model directory
(config.json, *.safetensors with or without model.safetensors.index.json) or Meta's layout
(params.json, consolidated.NN.pth). `open_source` reads the configuration, in the terms of the
model the run builds (its checkpoint map, models/NAME/checkpoint.py), and checks the files
(shards the index names, every safetensors header against its file), so that `mmm-orch submit`
can refuse a mismatch before the queue and the trainer before it trains; read.py reads the
tensors, by the map's names and shapes.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

from mmm_orch.errors import PretrainedError, shown
from mmm_orch.models.spec import CheckpointMap, Model
from mmm_orch.paths import NotReadable, open_regular

HF_CONFIG = "config.json"
HF_INDEX = "model.safetensors.index.json"
META_PARAMS = "params.json"
META_SHARDS = "consolidated.*.pth"
# What a tokenizer needs beside the weights: Hugging Face's files and Meta's tiktoken model.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
)
# safetensors dtype names and their sizes in bytes.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U8": 1, "BOOL": 1}  # fmt: skip
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # what a weight may be stored as
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on a header
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # safetensors' name: F32, BF16, ...
    shape: tuple[int, ...]
    file: Path  # the file holding it
    start: int  # its bytes in the file: [start, end)
    end: int


@dataclass(frozen=True)
class Source:
    """A pretrained checkpoint: its kind, the model's map it is read by, what its configuration
    declares (in the model's terms, each with the configuration's own name for it), and its
    files."""

    path: Path
    kind: Literal["hf", "meta"]
    checkpoint: CheckpointMap
    declared: dict[str, tuple[str, Any]]  # our field -> (the config's name for it, its value)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)  # hf: by Hugging Face name
    shards: tuple[Path, ...] = ()  # meta: consolidated.00.pth, ...

    @property
    def config_file(self) -> str:
        return HF_CONFIG if self.kind == "hf" else META_PARAMS

    @property
    def tokenizer_files(self) -> list[Path]:
        return [self.path / name for name in TOKENIZER_FILES if (self.path / name).is_file()]


def open_source(path: str | Path, model: Model) -> Source:
    """The checkpoint at `path` (a directory, or config.json / params.json in one) of a
    `model`, its configuration read and its files checked; PretrainedError when it is not one,
    or `model` reads no checkpoint."""
    mapped = model.checkpoint
    if mapped is None:
        raise PretrainedError(f"--init-from {path}: the {model.name} model reads no checkpoint")
    where = Path(path)
    if where.name in (HF_CONFIG, META_PARAMS):
        where = where.parent
    if not where.is_dir():
        raise PretrainedError(
            f"--init-from {path}: not a directory (a Hugging Face model directory with "
            f"{HF_CONFIG}, or Meta's with {META_PARAMS} and consolidated.00.pth)"
        )
    if (where / HF_CONFIG).is_file():
        config = read_json(where / HF_CONFIG)
        declared = mapped.hf_declared(config, where / HF_CONFIG)
        return Source(where, "hf", mapped, declared, _hf_tensors(where))
    if (where / META_PARAMS).is_file():
        params = read_json(where / META_PARAMS)
        shards = tuple(sorted(where.glob(META_SHARDS)))
        if not shards:
            raise PretrainedError(f"--init-from {where}: {META_PARAMS} but no {META_SHARDS}")
        for shard in shards:
            check_regular(shard)
        declared = mapped.meta_declared(params, where / META_PARAMS)
        return Source(where, "meta", mapped, declared, shards=shards)
    raise PretrainedError(
        f"--init-from {where}: neither {HF_CONFIG} (Hugging Face) nor {META_PARAMS} (Meta) in it"
    )


def check_model(source: Source, args: Any) -> None:
    """PretrainedError naming the first field where the checkpoint and the run's model (`args`,
    the model's own) differ, and then (Hugging Face) the first tensor missing or of another
    shape."""
    mapped = source.checkpoint
    ours = mapped.our_values(args)
    for name, (theirs_name, value) in source.declared.items():
        if not _same(value, ours[name]):
            raise PretrainedError(
                f"--init-from {source.path}: {source.config_file} {theirs_name} is "
                f"{mapped.show(value)}, the run's model {name} is {mapped.show(ours[name])} "
                "(--config, --tiny, --n-layers and --vocab-size choose the model)"
            )
    if source.kind != "hf":
        return  # a .pth says its shapes only once unpickled: read.py checks them
    for ours_name, shape in mapped.shapes(args).items():
        name = mapped.hf_name(ours_name)
        found = source.tensors.get(name)
        if found is None:
            raise PretrainedError(f"--init-from {source.path}: no tensor {name} in its files")
        if found.shape != shape:
            raise PretrainedError(
                f"--init-from {source.path}: {name} has shape {list(found.shape)}, the run's "
                f"model {list(shape)}"
            )
        if found.dtype not in FLOAT_DTYPES:
            raise PretrainedError(
                f"--init-from {source.path}: {name} holds {found.dtype}; the trainer reads "
                f"floating-point weights ({', '.join(FLOAT_DTYPES)})"
            )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b)
    return bool(a == b)


def read_json(file: Path) -> dict[str, Any]:
    """A JSON object of at most MAX_CONFIG_BYTES; PretrainedError naming the file otherwise."""
    with _opened(file) as handle:
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise PretrainedError(f"{file}: larger than {MAX_CONFIG_BYTES >> 20} MiB")
    try:
        value = json.loads(data)
    except RecursionError:
        raise PretrainedError(f"{file}: not JSON of a configuration (nested too deep)") from None
    except ValueError as exc:  # not JSON, or a number of over 4,300 digits
        raise PretrainedError(f"{file}: not JSON ({str(exc)[:200]})") from None
    if not isinstance(value, dict):
        raise PretrainedError(f"{file}: holds {type(value).__name__}, not a JSON object")
    return value


# --- safetensors ----------------------------------------------------------------------------


def _hf_tensors(where: Path) -> dict[str, TensorInfo]:
    """Every tensor of the directory's safetensors files, by name: the index's files (each
    named shard there, each tensor in the shard the index says), or the files themselves."""
    index = where / HF_INDEX
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise PretrainedError(f"{index}: no weight_map of tensor names to files")
        for name in weight_map.values():
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise PretrainedError(f"{index}: {shown(name)} is not a file name in {where}")
        files = sorted(set(weight_map.values()))
        for name in files:
            if not (where / name).is_file():
                raise PretrainedError(
                    f"--init-from {where}: shard {name}, named in {HF_INDEX}, is missing"
                )
        headers = {name: read_header(where / name) for name in files}
        found = {}
        for tensor, name in weight_map.items():
            if tensor not in headers[name]:
                raise PretrainedError(
                    f"{where / name}: no tensor {tensor}, which {HF_INDEX} puts in it"
                )
            found[tensor] = headers[name][tensor]
        return found
    found = {}
    for file in sorted(where.glob("*.safetensors")):
        found.update(read_header(file))
    if not found:
        raise PretrainedError(f"--init-from {where}: {HF_CONFIG} but no *.safetensors files")
    return found


def check_regular(file: Path) -> None:
    """PretrainedError unless `file` (a link followed: a Hub cache links its blobs) is a regular
    file that can be read: a FIFO in a checkpoint would block its reader forever."""
    with _opened(file):
        pass


def _opened(file: Path) -> BinaryIO:
    """`file` opened to read, without waiting on a FIFO; PretrainedError, one line, when it is
    no regular file or cannot be opened."""
    try:
        return os.fdopen(open_regular(file), "rb")
    except NotReadable as exc:
        raise PretrainedError(str(exc)) from None
    except OSError as exc:
        raise PretrainedError(f"{file}: cannot read it: {exc.strerror}") from None


def read_header(file: Path) -> dict[str, TensorInfo]:
    """A safetensors file's tensors, its header checked against the file: every tensor's bytes
    inside the file, as many as its dtype and shape take, none overlapping another's."""
    opened = _opened(file)
    try:
        size = os.fstat(opened.fileno()).st_size
        with opened as handle:
            head = handle.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < length <= min(MAX_HEADER_BYTES, size - 8):
                raise PretrainedError(
                    f"{file}: not a safetensors file (a header of {length} bytes in a file of "
                    f"{size}: truncated?)"
                )
            text = handle.read(length)
    except OSError as exc:
        raise PretrainedError(f"{file}: cannot read it: {exc.strerror}") from None
    try:
        header = json.loads(text)
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        raise PretrainedError(f"{file}: its safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise PretrainedError(f"{file}: its safetensors header is not a JSON object")
    data_start, data_size = 8 + length, size - 8 - length
    found: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        found[name] = _tensor(file, name, entry, data_start, data_size)
    spans = sorted((info.start, info.end, name) for name, info in found.items())
    for (_, end, before), (start, _, after) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise PretrainedError(f"{file}: the header puts {after} inside {before}'s bytes")
    return found


def _tensor(file: Path, name: str, entry: Any, data_start: int, data_size: int) -> TensorInfo:
    try:
        dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPE_BYTES or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise TypeError
        if not (isinstance(start, int) and isinstance(end, int)):
            raise TypeError
    except (KeyError, TypeError, ValueError):
        raise PretrainedError(f"{file}: the header's entry for {name} is not a tensor's") from None
    if not 0 <= start <= end <= data_size:
        raise PretrainedError(
            f"{file}: the header puts {name}'s bytes at {start}-{end}, past the "
            f"{data_size} bytes of data in the file (truncated?)"
        )
    wanted = math.prod(shape) * DTYPE_BYTES[dtype]
    if end - start != wanted:
        raise PretrainedError(
            f"{file}: the header gives {name} ({dtype} {list(shape)}, {wanted} bytes) "
            f"{end - start} bytes"
        )
    return TensorInfo(dtype, tuple(shape), file, data_start + start, data_start + end)
