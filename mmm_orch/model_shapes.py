"""The Llama 3 shapes the trainer builds and the planner sizes (planning/memory.py): plain data,
no torch, so `mmm-orch render` can say whether a plan fits the device before it is queued."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    max_seq_len: int
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def ffn_dim(self) -> int:
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)

    @property
    def block_params(self) -> int:
        kv = self.n_kv_heads * self.head_dim
        return (
            2 * self.dim * self.dim
            + 2 * self.dim * kv  # wq, wo; wk, wv
            + 3 * self.dim * self.ffn_dim
            + 2 * self.dim
        )  # w1, w2, w3; two norms

    @property
    def params(self) -> int:
        """Every parameter: embedding, blocks, final norm, output."""
        return self.n_layers * self.block_params + 2 * self.vocab_size * self.dim + self.dim


def micro_batches(global_batch: int, batch_size: int, dp: int) -> int | None:
    """The micro-batches a step accumulates on each data-parallel rank to make `global_batch`
    samples (0: one a rank), or None where batch_size x dp does not divide it: the trainer's
    rule (runtime/data.py), which the plan checks before the queue (planning/memory.py)."""
    per_forward = batch_size * dp
    return None if global_batch % per_forward else global_batch // per_forward or 1


DEFAULT_LOSS_CHUNK = 1024  # tokens of a sequence whose logits exist at once (trainers/loss.py)


@dataclass(frozen=True)
class Preset:
    model: LlamaArgs
    batch_size: int
    seq_len: int
    lr: float
    ac: str


# The torchtitan Llama 3 configurations (saforem2/mmm train_configs; Meta's model cards).
PRESETS = {
    "debug": Preset(
        LlamaArgs(
            dim=256, n_layers=8, n_heads=16, n_kv_heads=16, vocab_size=2048, max_seq_len=2048
        ),
        batch_size=8,
        seq_len=2048,
        lr=8e-4,
        ac="none",
    ),
    "8b": Preset(
        LlamaArgs(
            dim=4096,
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            vocab_size=128256,
            max_seq_len=8192,
            multiple_of=1024,
            ffn_dim_multiplier=1.3,
        ),
        batch_size=1,
        seq_len=8192,
        lr=3e-4,
        ac="every_other",
    ),
    "70b": Preset(
        LlamaArgs(
            dim=8192,
            n_layers=80,
            n_heads=64,
            n_kv_heads=8,
            vocab_size=128256,
            max_seq_len=8192,
            multiple_of=4096,
            ffn_dim_multiplier=1.3,
        ),
        batch_size=1,
        seq_len=8192,
        lr=1.5e-4,
        ac="full",
    ),
    "405b": Preset(
        LlamaArgs(
            dim=16384,
            n_layers=126,
            n_heads=128,
            n_kv_heads=8,
            vocab_size=128256,
            max_seq_len=8192,
            multiple_of=4096,
            ffn_dim_multiplier=1.2,
        ),
        batch_size=2,
        seq_len=8192,
        lr=8e-5,
        ac="full",
    ),
}
TINY = Preset(
    LlamaArgs(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, max_seq_len=64, multiple_of=32
    ),
    batch_size=4,
    seq_len=64,
    lr=3e-3,
    ac="none",
)
