"""DCP's reader of a checkpoint directory whose `.metadata` is read by checkpoint_metadata
(only the classes of a checkpoint's index unpickled, its shards checked whole), never by torch's
own unpickler: export and the runtime's resume read checkpoints through it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from mmm_orch.pretrained import checkpoint_metadata


class CheckedReader(dcp.FileSystemReader):
    """torch's FileSystemReader but for its metadata: checked, read once."""

    def __init__(self, path: str | Path):
        super().__init__(str(path))
        self.checked_dir = Path(path)
        self._metadata: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._metadata is None:
            self._metadata = checkpoint_metadata.read(self.checked_dir)
        if self._metadata.storage_meta is None:  # as DCP's own reader
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata
