"""Tokenized text for the trainers: the directory `python -m mmm_orch.trainers.tokenize` writes,
defined here once (its writer and its readers use these names), and the reader.

A dataset directory holds, per split (train, val), shards of token ids (one flat array each,
uint16 or uint32, documents one after the other, each between BOS and EOS where the tokenizer
has them) and manifest.json, written last: the tokenizer, its vocabulary size, the largest id,
every shard's token and document count and its SHA-256.

Reading: a split is one stream of tokens (its shards in order) cut into windows of seq_len + 1
tokens (inputs and labels shifted by one; a window spans document boundaries, as in packed
pre-training). Sample g of a run (its global index: the g-th sample the run trains on) is window
perm_e[g mod N] of epoch e = g div N, perm_e a permutation of the N windows drawn from the seed
and e. So every window is seen once per epoch across all ranks, and a run resumed from sample g
on any number of ranks continues with exactly the samples that come next.
"""

from __future__ import annotations

import json
import mmap
import os
import warnings
from pathlib import Path
from typing import Any

import torch

FORMAT = "mmm-orch-tokens/1"
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
DTYPES = {"uint16": torch.uint16, "uint32": torch.uint32}


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


def dtype_for(vocab_size: int) -> str:
    """The narrowest id type that holds every id of the vocabulary."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


class DatasetError(ValueError):
    """A dataset that cannot be trained on as it is; the message says what and how to fix it."""


def read_manifest(path: str | Path) -> dict[str, Any]:
    root = Path(path)
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        raise DatasetError(f"{root}: no {MANIFEST}: not a tokenized dataset (make one with "
                           "`python -m mmm_orch.trainers.tokenize`), or its tokenizing did not "
                           "finish") from None
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{root / MANIFEST}: unreadable: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise DatasetError(f"{root / MANIFEST}: format {manifest.get('format')!r}, expected "
                           f"{FORMAT!r}")
    return manifest


class _Stream:
    """Memory-mapped shards read as one stream of token ids."""

    def __init__(self, files: list[Path], dtype: str):
        self.parts: list[torch.Tensor] = []
        self._keep = []
        width = DTYPES[dtype].itemsize
        for file in files:
            try:
                handle = open(file, "rb")
            except OSError as exc:
                raise DatasetError(f"{file}: cannot read: {exc.strerror}") from None
            size = os.fstat(handle.fileno()).st_size
            if size == 0 or size % width:
                handle.close()
                raise DatasetError(f"{file}: {size} bytes, not a whole number of {dtype} ids "
                                   "(is --token-dtype right? was it cut short?)")
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            self._keep.append((handle, mapped))
            with warnings.catch_warnings():
                # Read-only map, only ever read: no copy of the file is needed.
                warnings.filterwarnings("ignore", message="The given buffer is not writable")
                self.parts.append(torch.frombuffer(mapped, dtype=DTYPES[dtype]))
        self.starts = [0]
        for part in self.parts:
            self.starts.append(self.starts[-1] + part.numel())
        self.size = self.starts[-1]

    def span(self, start: int, length: int) -> torch.Tensor:
        """Tokens [start, start + length) as int64, across shard boundaries."""
        pieces, position, left = [], start, length
        index = next(i for i in range(len(self.parts)) if self.starts[i + 1] > position)
        while left:
            offset = position - self.starts[index]
            piece = self.parts[index][offset:offset + left]
            pieces.append(piece.to(torch.long))
            position, left, index = position + piece.numel(), left - piece.numel(), index + 1
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def max_id(self) -> int:
        """The largest id, read in chunks (unsigned types have no max of their own in torch)."""
        chunk = 1 << 24
        return max((int(part[i:i + chunk].to(torch.int64).max())
                    for part in self.parts for i in range(0, part.numel(), chunk)), default=-1)


class TokenDataset:
    """One split of a tokenized dataset directory, or one flat token file (no manifest: its id
    type given, its largest id found by reading it once). `shuffle=False` reads windows in order
    (the validation split)."""

    def __init__(self, path: str | Path, seq_len: int, vocab_size: int, *, split: str = "train",
                 seed: int = 0, shuffle: bool = True, dtype: str = "uint32"):
        root = Path(path)
        if root.is_dir():
            manifest = read_manifest(root)
            if split not in manifest["splits"]:
                raise DatasetError(f"{root}: no {split} split (it has "
                                   f"{', '.join(manifest['splits']) or 'none'})")
            shards = manifest["splits"][split]["shards"]
            dtype = manifest["dtype"]
            self.stream = _Stream([root / s["file"] for s in shards], dtype)
            for shard, part in zip(shards, self.stream.parts):
                if part.numel() != shard["tokens"]:
                    raise DatasetError(f"{root / shard['file']}: {part.numel()} tokens, the "
                                       f"manifest says {shard['tokens']}: tokenize again")
            tokenizer_vocab = manifest["tokenizer"]["vocab_size"]
            largest = manifest["max_token_id"]
            if tokenizer_vocab > vocab_size:
                raise DatasetError(
                    f"{root}: its tokenizer has {tokenizer_vocab} ids, the model's vocabulary "
                    f"{vocab_size}: set the trainer's vocab_size to at least {tokenizer_vocab} "
                    "(--set vocab_size=N), or tokenize with the model's tokenizer")
        elif root.is_file():
            self.stream = _Stream([root], dtype)
            largest = self.stream.max_id()
        else:
            raise DatasetError(f"{root}: no such dataset directory or token file")
        if largest >= vocab_size:
            raise DatasetError(f"{root}: token id {largest} is outside the model's vocabulary "
                               f"of {vocab_size} ids (0-{vocab_size - 1})")
        self.seq_len, self.seed, self.shuffle = seq_len, seed, shuffle
        self.windows = (self.stream.size - 1) // seq_len
        if self.windows < 1:
            raise DatasetError(f"{root}: {split} has {self.stream.size} tokens, fewer than one "
                               f"sample of {seq_len + 1}")
        self._orders: dict[int, torch.Tensor] = {}

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            if len(self._orders) > 1:
                self._orders.pop(min(self._orders))
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._orders[epoch] = torch.randperm(self.windows, generator=generator)
        return self._orders[epoch]

    def window_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """The window each global sample index reads (in its epoch's order)."""
        if not self.shuffle:
            return indices % self.windows
        return torch.stack([self._order(int(i) // self.windows)[int(i) % self.windows]
                            for i in indices]) if len(indices) else indices

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack([self.stream.span(int(w) * self.seq_len, self.seq_len + 1)
                            for w in self.window_ids(indices)])
        return rows[:, :-1], rows[:, 1:]


class SampleLog:
    """What a data-parallel rank trained on, a line a step: {"step", "samples", "windows"} in
    <run>/samples/dp-<rank>.jsonl (appended across resumes): to check, by sample, that a run
    sees every window once per epoch however often it stopped and on how many ranks."""

    def __init__(self, run_dir: Path, dp_rank: int, resumed_from: int = 0):
        directory = run_dir / "samples"
        directory.mkdir(exist_ok=True)
        path = directory / f"dp-{dp_rank}.jsonl"
        if resumed_from and path.exists():  # steps after the checkpoint run again: once each
            kept = [line for line in path.read_text().splitlines()
                    if json.loads(line)["step"] <= resumed_from]
            path.write_text("".join(line + "\n" for line in kept))
        self.file = open(path, "a")

    @classmethod
    def where(cls, wanted: bool, run_dir: Path, batches, resumed_from: int) -> SampleLog | None:
        """A log for this data-parallel rank when `wanted` (one rank of each TP group)."""
        return cls(run_dir, batches.dp_rank, resumed_from) if wanted else None

    def add(self, step: int, indices: torch.Tensor, data) -> None:
        windows = data.window_ids(indices) if hasattr(data, "window_ids") else indices
        line = {"step": step, "samples": indices.tolist(), "windows": windows.tolist()}
        self.file.write(json.dumps(line) + "\n")
        self.file.flush()
