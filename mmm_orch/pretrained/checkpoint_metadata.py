"""A distributed checkpoint's `.metadata` read without running anything of it.

torch.distributed.checkpoint (DCP) keeps a checkpoint's index, its Metadata, as a pickle, and
its own reader unpickles it whole: a `.metadata` that unpickles to `os.system(...)` runs the
command. Checkpoints are shared (a project directory, a colleague's run, a download), so every
path that reads one (export, a resume, a rerun --resume) reads it here instead, with an
unpickler that admits only the classes DCP's Metadata is made of (torch 2.13's
torch/distributed/checkpoint/metadata.py and filesystem.py), and then checks what it got: the
index's shard files plain names in the checkpoint's directory, regular files that hold the
bytes the index gives them (a truncated shard is refused here, not deep inside torch).

Importing this needs no torch; reading a metadata file imports the classes it names.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
from pathlib import Path
from typing import Any

from mmm_orch.errors import one_line
from mmm_orch.injob import runfiles
from mmm_orch.injob.runfiles import RunFileError

METADATA_FILE = ".metadata"
# A checkpoint's index grows with its tensors x the ranks that saved them: far below this.
MAX_METADATA_BYTES = 1 << 30

_DCP = "torch.distributed.checkpoint.metadata"
_FILESYSTEM = "torch.distributed.checkpoint.filesystem"
# Every global a checkpoint's metadata pickle names (besides torch's dtypes, admitted below).
_ADMITTED = frozenset(
    {
        (_DCP, "Metadata"),
        (_DCP, "TensorStorageMetadata"),
        (_DCP, "BytesStorageMetadata"),
        (_DCP, "ChunkStorageMetadata"),
        (_DCP, "TensorProperties"),
        (_DCP, "MetadataIndex"),
        (_DCP, "StorageMeta"),
        (_DCP, "_MEM_FORMAT_ENCODING"),
        (_FILESYSTEM, "_StorageInfo"),
        (_FILESYSTEM, "_StoragePrefix"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # a layout by its name (torch.strided)
        ("pathlib", "PosixPath"),  # StorageMeta's checkpoint_id
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
    }
)


class CheckpointMetadataError(RunFileError):
    """A checkpoint's metadata that is not DCP's, or names shards that are not there whole."""


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only the admitted classes; any other global refuses the whole file before
    anything of it is called."""

    def __init__(self, data: bytes, path: Path):
        super().__init__(io.BytesIO(data))
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ADMITTED:
            return getattr(importlib.import_module(module), name)
        if module == "torch":
            import torch

            found = getattr(torch, name, None)
            if isinstance(found, torch.dtype):
                return found
        named = one_line(f"{module}.{name}")  # the file's words: escaped, cut short
        raise CheckpointMetadataError(
            f"{self.path}: not a checkpoint's metadata: it names {named[:200]}, which a "
            "checkpoint never holds (refused unread: nothing of it ran)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointMetadataError(f"{self.path}: not a checkpoint's metadata (a persistent id)")


def read(checkpoint: str | os.PathLike) -> Any:
    """The Metadata of the DCP checkpoint in the directory `checkpoint`, its shard files checked;
    CheckpointMetadataError (one line naming the file) for anything else."""
    directory = Path(checkpoint)
    path = directory / METADATA_FILE
    try:
        data = runfiles.read_small(path, MAX_METADATA_BYTES)
    except OSError as exc:
        raise CheckpointMetadataError(f"{path}: cannot read it: {exc.strerror}") from None
    if data is None:
        raise CheckpointMetadataError(f"{path}: missing: not a complete checkpoint")
    try:
        metadata = _MetadataUnpickler(data, path).load()
    except CheckpointMetadataError:
        raise
    except Exception as exc:  # whatever the admitted classes raise on bytes that are not theirs
        reason = str(exc).splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise CheckpointMetadataError(
            f"{path}: not a checkpoint's metadata, or a truncated one ({reason})"
        ) from None
    _check(metadata, directory, path)
    return metadata


def _check(metadata: Any, directory: Path, path: Path) -> None:
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    def refuse(what: str) -> CheckpointMetadataError:
        return CheckpointMetadataError(f"{path}: not a checkpoint's metadata: {what}")

    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise refuse(f"it holds {type(metadata).__name__}")
    for key, saved in metadata.state_dict_metadata.items():
        if not isinstance(key, str) or not isinstance(
            saved, (TensorStorageMetadata, BytesStorageMetadata)
        ):
            raise refuse(f"its entry {key!r:.80} is {type(saved).__name__}")
    planned = metadata.planner_data
    if planned is not None and not (
        isinstance(planned, dict)
        and all(
            isinstance(route, tuple) and all(isinstance(part, (str, int)) for part in route)
            for route in planned.values()
        )
    ):
        raise refuse("its planner data are not the state's paths")
    stored = metadata.storage_data
    if not isinstance(stored, dict):
        raise refuse(f"its storage data are {type(stored).__name__}")
    sizes: dict[str, int] = {}
    for index, where in stored.items():
        if not isinstance(index, MetadataIndex) or not isinstance(where, _StorageInfo):
            raise refuse(f"its storage data hold {type(where).__name__}")
        name = where.relative_path
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
            raise refuse(f"a shard {name!r:.80} that is not a file name in {directory}")
        if name not in sizes:
            sizes[name] = _shard_size(directory / name)
        offset, length = where.offset, where.length
        if not (
            isinstance(offset, int) and isinstance(length, int) and offset >= 0 and length >= 0
        ):
            raise refuse(f"{index.fqn!r:.80} at {offset!r:.40}+{length!r:.40} in {name}")
        if offset + length > sizes[name]:
            raise CheckpointMetadataError(
                f"{directory / name}: {sizes[name]} bytes, but {index.fqn!r:.80} is saved at "
                f"bytes {offset}-{offset + length} of it (truncated?)"
            )


def _shard_size(file: Path) -> int:
    found = runfiles.kind(file)
    if found != "a regular file":
        raise CheckpointMetadataError(f"{file}: a shard of the checkpoint is {found}")
    return file.stat().st_size
