"""Tokenized text for the trainers: the directory `python -m mmm_orch.trainers.tokenize` writes,
defined here once (its writer and its readers use these names), and the reader.

A dataset directory holds, per split (train, val), shards of token ids (one flat array each,
uint16 or uint32, documents one after the other, each between BOS and EOS where the tokenizer
has them) and manifest.json, written last: the tokenizer, its vocabulary size, the largest id,
every shard's token and document count and its SHA-256. The reader checks the manifest's fields
and, when it opens a shard, every id in it against the model's vocabulary.

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
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmm_orch.paths import NotReadable, open_regular

FORMAT = "mmm-orch-tokens/1"
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
DTYPES = {"uint16": torch.uint16, "uint32": torch.uint32}
SHARD_FILE = re.compile(r"(train|val)-\d{5,}\.bin")
# Two shards a rank, ~250 bytes each: a bigger manifest is not one (and would be read whole).
MAX_MANIFEST_BYTES = 64 << 20


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


def replacement_dirs(root: Path) -> tuple[Path, Path]:
    """(new, old): where tokenize builds a dataset before it replaces `root` with it, and where it
    moves the dataset it replaces for that moment; siblings of `root`, so each move is a rename."""
    return root.parent / f".{root.name}.tokenize-new", root.parent / f".{root.name}.tokenize-old"


def dtype_for(vocab_size: int) -> str:
    """The narrowest id type that holds every id of the vocabulary."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


class DatasetError(ValueError):
    """A dataset that cannot be trained on as it is; the message says what and how to fix it."""


def _open_regular(path: Path) -> int:
    """paths.open_regular, refusing what is no regular file (a FIFO would block) as the
    dataset's error."""
    try:
        return open_regular(path)
    except NotReadable:
        raise DatasetError(f"{path}: not a regular file") from None


def read_manifest(path: str | Path) -> dict[str, Any]:
    root = Path(path)
    file = root / MANIFEST
    try:
        fd = _open_regular(file)
    except FileNotFoundError:
        raise DatasetError(
            f"{root}: no {MANIFEST}: not a tokenized dataset (make one with "
            "`python -m mmm_orch.trainers.tokenize`), or its tokenizing did not "
            "finish"
        ) from None
    except OSError as exc:
        raise DatasetError(f"{file}: unreadable: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise DatasetError(f"{file}: more than {MAX_MANIFEST_BYTES} bytes, not a manifest")
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise DatasetError(f"{file}: unreadable: {type(exc).__name__}: {exc}") from None
    return _checked(manifest, file)


_MISSING = object()


def _bad(file: Path, field: str, value: Any, allowed: str) -> DatasetError:
    shown = "missing" if value is _MISSING else f"{value!r}"[:60]
    return DatasetError(f"{file}: {field} is {shown}: {allowed} expected (tokenize again)")


def _whole(value: Any, file: Path, field: str, least: int) -> None:
    if type(value) is not int or value < least:  # not bool, float or a number as a string
        raise _bad(file, field, value, f"a whole number from {least}")


def _checked(manifest: Any, file: Path) -> dict[str, Any]:
    """The manifest, refused naming the first field the readers use that is missing or of the
    wrong type (a damaged or hand-edited manifest, caught here, not as a KeyError later)."""
    if not isinstance(manifest, dict):
        raise DatasetError(
            f"{file}: the manifest is a {type(manifest).__name__}: a JSON object "
            "expected (tokenize again)"
        )
    if manifest.get("format") != FORMAT:
        raise DatasetError(f"{file}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    if manifest.get("dtype", _MISSING) not in DTYPES:
        raise _bad(file, "dtype", manifest.get("dtype", _MISSING), " or ".join(DTYPES))
    tokenizer = manifest.get("tokenizer", _MISSING)
    if not isinstance(tokenizer, dict):
        raise _bad(file, "tokenizer", tokenizer, "a JSON object")
    _whole(tokenizer.get("vocab_size", _MISSING), file, "tokenizer.vocab_size", 1)
    _whole(manifest.get("max_token_id", _MISSING), file, "max_token_id", 0)
    splits = manifest.get("splits", _MISSING)
    if not isinstance(splits, dict):
        raise _bad(file, "splits", splits, "a JSON object of splits")
    for name, split in splits.items():
        if not isinstance(split, dict):
            raise _bad(file, f"splits.{name}", split, "a JSON object")
        shards = split.get("shards", _MISSING)
        if not isinstance(shards, list):
            raise _bad(file, f"splits.{name}.shards", shards, "a list of shards")
        for index, shard in enumerate(shards):
            where = f"splits.{name}.shards[{index}]"
            if not isinstance(shard, dict):
                raise _bad(file, where, shard, "a JSON object")
            name_given = shard.get("file", _MISSING)
            if not isinstance(name_given, str) or not SHARD_FILE.fullmatch(name_given):
                raise _bad(file, f"{where}.file", name_given, "a shard's name (train-00000.bin)")
            _whole(shard.get("tokens", _MISSING), file, f"{where}.tokens", 1)
    return manifest


class _Stream:
    """Memory-mapped shards read as one stream of token ids."""

    def __init__(self, files: list[Path], dtype: str):
        self.files, self.dtype = files, dtype
        self.parts: list[torch.Tensor] = []
        self.maps: list[mmap.mmap] = []
        width = DTYPES[dtype].itemsize
        for file in files:
            try:
                fd = _open_regular(file)
            except OSError as exc:
                raise DatasetError(f"{file}: cannot read: {exc.strerror}") from None
            size = os.fstat(fd).st_size
            if size == 0 or size % width:
                os.close(fd)
                raise DatasetError(
                    f"{file}: {size} bytes, not a whole number of {dtype} ids "
                    "(is --token-dtype right? was it cut short?)"
                )
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            os.close(fd)  # the map holds the file
            self.maps.append(mapped)
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
            piece = self.parts[index][offset : offset + left]
            pieces.append(piece.to(torch.long))
            position, left, index = position + piece.numel(), left - piece.numel(), index + 1
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def largest_ids(self) -> list[int]:
        """Each shard's largest id. Cost: one sequential read of every shard (numpy's max over the
        map, no copy; torch has no max for unsigned types): ~0.5 s a GB from the page cache
        (measured on a loaded 2-core host), or the disk's read time."""
        return [int(np.frombuffer(mapped, dtype=self.dtype).max()) for mapped in self.maps]


class TokenDataset:
    """One split of a tokenized dataset directory, or one flat token file (no manifest: its id
    type given, its largest id found by reading it once). `shuffle=False` reads windows in order
    (the validation split)."""

    def __init__(
        self,
        path: str | Path,
        seq_len: int,
        vocab_size: int,
        *,
        split: str = "train",
        seed: int = 0,
        shuffle: bool = True,
        dtype: str = "uint32",
    ):
        root = Path(path)
        stated = None  # the manifest's largest id: one past it means a damaged dataset
        if root.is_dir():
            manifest = read_manifest(root)
            if split not in manifest["splits"]:
                raise DatasetError(
                    f"{root}: no {split} split (it has {', '.join(manifest['splits']) or 'none'})"
                )
            tokenizer_vocab = manifest["tokenizer"]["vocab_size"]
            if tokenizer_vocab > vocab_size:
                raise DatasetError(
                    f"{root}: its tokenizer has {tokenizer_vocab} ids, the model's vocabulary "
                    f"{vocab_size}: set the trainer's vocab_size to at least {tokenizer_vocab} "
                    "(--set vocab_size=N), or tokenize with the model's tokenizer"
                )
            shards = manifest["splits"][split]["shards"]
            dtype = manifest["dtype"]
            self.stream = _Stream([root / s["file"] for s in shards], dtype)
            for shard, part in zip(shards, self.stream.parts, strict=True):
                if part.numel() != shard["tokens"]:
                    raise DatasetError(
                        f"{root / shard['file']}: {part.numel()} tokens, the "
                        f"manifest says {shard['tokens']}: tokenize again"
                    )
            stated = manifest["max_token_id"]
        elif root.is_file():
            self.stream = _Stream([root], dtype)
        elif os.path.lexists(root):
            raise DatasetError(f"{root}: not a dataset directory or a regular token file")
        else:
            _, aside = replacement_dirs(root)
            stopped = (
                f" (a tokenize replacing it was stopped: the old dataset is in {aside}, "
                "and running tokenize again restores it)"
                if aside.is_dir()
                else ""
            )
            raise DatasetError(f"{root}: no such dataset directory or token file{stopped}")
        # An id past the embedding would fail inside a step (an IndexError, or a device
        # assert). A dataset says its largest id: checked here, at no cost; each batch is
        # checked against it as it is read (a max over the batch), since a dataset of hundreds of
        # GB read whole by every rank at every start would cost minutes. A flat file says
        # nothing: it is read once here (~0.5 s a GB from the page cache).
        if stated is None:
            stated = max(self.stream.largest_ids())
        if stated >= vocab_size:
            raise DatasetError(
                f"{root}: token id {stated} is outside the model's vocabulary of "
                f"{vocab_size} ids (0-{vocab_size - 1})"
            )
        self.root, self.stated, self.vocab_size = root, stated, vocab_size
        self.seq_len, self.seed, self.shuffle = seq_len, seed, shuffle
        self.windows = (self.stream.size - 1) // seq_len
        if self.windows < 1:
            raise DatasetError(
                f"{root}: {split} has {self.stream.size} tokens, fewer than one "
                f"sample of {seq_len + 1}"
            )
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
        return (
            torch.stack(
                [self._order(int(i) // self.windows)[int(i) % self.windows] for i in indices]
            )
            if len(indices)
            else indices
        )

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack(
            [
                self.stream.span(int(w) * self.seq_len, self.seq_len + 1)
                for w in self.window_ids(indices)
            ]
        )
        if rows.numel() and (largest := int(rows.max())) > self.stated:
            raise DatasetError(
                f"{self.root}: token id {largest} is past the largest its manifest "
                f"says ({self.stated}; the model's vocabulary has "
                f"{self.vocab_size} ids): the dataset is damaged, tokenize again"
            )
        return rows[:, :-1], rows[:, 1:]


class SampleLog:
    """What a data-parallel rank trained on, a line a step: {"step", "samples", "windows"} in
    <run>/samples/dp-<rank>.jsonl (appended across resumes): to check, by sample, that a run
    sees every window once per epoch however often it stopped and on how many ranks."""

    def __init__(self, run_dir: Path, dp_rank: int, resumed_from: int = 0, dp: int = 1):
        directory = run_dir / "samples"
        directory.mkdir(exist_ok=True)
        path = directory / f"dp-{dp_rank}.jsonl"
        if resumed_from:  # steps after the checkpoint run again: once each
            _trim(path, resumed_from)
            if dp_rank == 0:  # and the logs of ranks a run on more of them had
                for stale in directory.glob("dp-*.jsonl"):
                    rank = stale.stem.removeprefix("dp-")
                    if rank.isascii() and rank.isdigit() and int(rank) >= dp:
                        _trim(stale, resumed_from)
        self.file = open(path, "a")  # noqa: SIM115 - appended to for the whole run

    @classmethod
    def where(cls, wanted: bool, run_dir: Path, batches, resumed_from: int) -> SampleLog | None:
        """A log for this data-parallel rank when `wanted` (one rank of each TP group)."""
        return cls(run_dir, batches.dp_rank, resumed_from, batches.dp) if wanted else None

    def add(self, step: int, indices: torch.Tensor, data) -> None:
        windows = data.window_ids(indices) if hasattr(data, "window_ids") else indices
        line = {"step": step, "samples": indices.tolist(), "windows": windows.tolist()}
        self.file.write(json.dumps(line) + "\n")
        self.file.flush()


def _trim(path: Path, step: int) -> None:
    """A sample log without its lines after `step`."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in kept))
