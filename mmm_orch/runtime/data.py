"""Training data: learnable synthetic sets (a fixed pattern per sample, not noise), a memory-mapped
pre-tokenized token file, and MNIST IDX files.

Every sample is a pure function of its global index, and each data-parallel rank reads its own
contiguous slice of the global batch for a step. So data differs across dp ranks, is identical
inside a TP group, a resumed run continues exactly where it stopped, and a run on one process
with the global batch sees the very same samples as a run on many.
"""

from __future__ import annotations

import gzip
import mmap
import warnings
import struct
from pathlib import Path

import torch


def batch_indices(step: int, dp_rank: int, batch_size: int, dp_size: int) -> torch.Tensor:
    """Global sample indices of `dp_rank`'s share of step `step` (0-based)."""
    start = step * batch_size * dp_size + dp_rank * batch_size
    return torch.arange(start, start + batch_size)


class SyntheticTokens:
    """Sequence i is an arithmetic progression mod vocab: start and stride depend on i, so the next
    token is predictable from the context and the loss falls quickly."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mixed = indices * 2654435761 + self.seed * 97  # Knuth's multiplicative hash
        start = mixed % self.vocab_size
        stride = 1 + (mixed // self.vocab_size) % 7
        positions = torch.arange(self.seq_len + 1)
        tokens = (start[:, None] + stride[:, None] * positions[None, :]) % self.vocab_size
        return tokens[:, :-1], tokens[:, 1:]


class TokenFile:
    """One stream of pre-tokenized uint16/uint32 tokens; sample i is window i (wrapping around)."""

    def __init__(self, path: str, dtype: str, seq_len: int):
        self._file = open(path, "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        torch_dtype = {"uint16": torch.uint16, "uint32": torch.uint32}[dtype]
        with warnings.catch_warnings():
            # The map is read-only and the tensor is only read: no copy of the file is needed.
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            self.tokens = torch.frombuffer(self._map, dtype=torch_dtype)
        self.seq_len = seq_len
        self.windows = (self.tokens.numel() - 1) // seq_len
        if self.windows < 1:
            raise ValueError(f"{path}: {self.tokens.numel()} tokens, fewer than one sequence of "
                             f"{seq_len + 1}")

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        starts = (indices % self.windows) * self.seq_len
        rows = torch.stack([self.tokens[s:s + self.seq_len + 1].to(torch.long) for s in starts.tolist()])
        return rows[:, :-1], rows[:, 1:]


class SyntheticImages:
    """Class c is a fixed random prototype image plus fresh noise per sample: learnable."""

    def __init__(self, shape: tuple[int, ...], num_classes: int, seed: int, noise: float = 0.5):
        gen = torch.Generator().manual_seed(seed)
        self.prototypes = torch.randn(num_classes, *shape, generator=gen)
        self.num_classes, self.seed, self.noise = num_classes, seed, noise

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        labels = (indices * 2654435761 + self.seed) % self.num_classes
        images = []
        for i in indices.tolist():
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
            images.append(torch.randn(self.prototypes.shape[1:], generator=gen))
        return self.prototypes[labels] + self.noise * torch.stack(images), labels


class TensorSet:
    """Samples held in memory (e.g. MNIST read from IDX files); sample i wraps around."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        indices = indices % len(self.labels)
        return self.images[indices], self.labels[indices]


def read_idx(path: Path) -> torch.Tensor:
    """An IDX file (MNIST's format: magic 0x0000 08 NDIM, big-endian sizes, uint8 data)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {data[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = bytearray(data[4 + 4 * ndim:])
    expected = 1
    for d in dims:
        expected *= d
    if len(body) != expected:
        raise ValueError(f"{path}: {len(body)} bytes of data, expected {expected} for {dims}")
    return torch.frombuffer(body, dtype=torch.uint8).reshape(dims)


def mnist(data_dir: str, split: str) -> TensorSet:
    """MNIST from `data_dir` (train-images-idx3-ubyte[.gz] etc.), normalised like torchvision."""
    prefix = "train" if split == "train" else "t10k"
    root = Path(data_dir)

    def find(kind: str) -> Path:
        for name in (f"{prefix}-{kind}", f"{prefix}-{kind}.gz"):
            if (root / name).exists():
                return root / name
        raise FileNotFoundError(f"{root / (prefix + '-' + kind)}[.gz] not found")

    images = read_idx(find("images-idx3-ubyte")).float().div(255).sub(0.1307).div(0.3081)
    labels = read_idx(find("labels-idx1-ubyte")).long()
    return TensorSet(images.unsqueeze(1), labels)
