"""Training data: learnable synthetic sets (a fixed pattern per sample, not noise) and MNIST IDX
files (tokenized text: runtime/dataset.py); which samples each rank reads at each step.

Every sample is a pure function of its global index, and each data-parallel rank reads its own
contiguous slice of the global batch for a step. So data differs across dp ranks, is identical
inside a TP group, a resumed run continues exactly where it stopped, and a run on one process
with the global batch sees the very same samples as a run on many.
"""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from mmm_orch.models.layout import micro_batches


def batch_indices(step: int, dp_rank: int, batch_size: int, dp_size: int) -> torch.Tensor:
    """Global sample indices of `dp_rank`'s share of step `step` (0-based), one forward a step."""
    return micro_batch_indices(step * batch_size * dp_size, 0, dp_rank, batch_size, dp_size)


def micro_batch_indices(
    consumed: int, micro: int, dp_rank: int, batch_size: int, dp_size: int
) -> torch.Tensor:
    """Global sample indices of `dp_rank`'s micro-batch `micro` of the step that begins after
    `consumed` samples. A step covers samples [consumed, consumed + global batch) whatever the
    split into ranks and micro-batches, so the same global batch on 1 node or on 8 trains on the
    same samples, and a run resumed on another node count continues where it stopped."""
    start = consumed + (micro * dp_size + dp_rank) * batch_size
    return torch.arange(start, start + batch_size)


@dataclass(frozen=True)
class GlobalBatch:
    """A step's samples, [consumed, consumed + size): `accumulation` micro-batches of
    `batch_size` samples on each of `dp` data-parallel ranks."""

    batch_size: int
    dp: int
    dp_rank: int
    accumulation: int

    @classmethod
    def of(cls, global_batch: int, batch_size: int, dp: int, dp_rank: int) -> GlobalBatch:
        """`global_batch` samples a step (0: one micro-batch a rank); ValueError when the ranks
        cannot split it evenly."""
        accumulation = micro_batches(global_batch, batch_size, dp)
        if accumulation is None:
            raise ValueError(
                f"--global-batch {global_batch} is not a multiple of batch_size "
                f"{batch_size} x {dp} data-parallel ranks = {batch_size * dp}"
            )
        return cls(batch_size, dp, dp_rank, accumulation)

    @property
    def size(self) -> int:
        return self.batch_size * self.dp * self.accumulation

    def describe(self) -> dict[str, int]:
        """For the run's config record: the same on every rank."""
        return {"global_batch": self.size, "accumulation": self.accumulation}

    def micro(self, consumed: int, micro: int) -> torch.Tensor:
        """This rank's sample indices in micro-batch `micro` of the step after `consumed`."""
        return micro_batch_indices(consumed, micro, self.dp_rank, self.batch_size, self.dp)


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
    zero, dtype, ndim = struct.unpack(">HBB", data[:4].ljust(4, b"\xff"))
    if zero != 0 or dtype != 0x08 or len(data) < 4 + 4 * ndim:
        raise ValueError(
            f"{path}: not an unsigned-byte IDX file (magic {data[:4].hex()}, {len(data)} bytes)"
        )
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = bytearray(data[4 + 4 * ndim :])
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
            if (root / name).is_file():  # a regular file: a FIFO would block the read
                return root / name
        raise FileNotFoundError(f"{root / (prefix + '-' + kind)}[.gz]: no such regular file")

    images = read_idx(find("images-idx3-ubyte")).float().div(255).sub(0.1307).div(0.3081)
    labels = read_idx(find("labels-idx1-ubyte")).long()
    return TensorSet(images.unsqueeze(1), labels)
