"""The Llama 3 shapes the trainer builds and the planner sizes (planning/memory.py): plain data,
no torch, so `mmm-orch render` can say whether a plan fits the device before it is queued."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's RoPE frequency scaling (Meta's `apply_scaling`; Hugging Face's rope_type
    "llama3"): wavelengths longer than original_context / low_freq_factor are stretched by
    `factor`, those shorter than original_context / high_freq_factor kept, the band between
    blended. It changes the logits at every position, not only past the original context."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192


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
    rope_scaling: RopeScaling | None = None  # Llama 3.1's; None: Llama 3's plain RoPE

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


# Pipeline schedules (trainers/pipeline.py), and the stages each pipeline rank holds under them:
# a looped schedule puts two on each, stage r and r + pp.
PIPELINE_SCHEDULES = {"1f1b": 1, "gpipe": 1, "interleaved_1f1b": 2}


def stage_layers(n_layers: int, stages: int) -> list[list[int]]:
    """The layers of each of `stages` pipeline stages, in order, as many on each; ValueError
    when they do not divide."""
    if n_layers % stages:
        raise ValueError(
            f"{n_layers} layers do not split into {stages} pipeline stages of as many each"
        )
    per = n_layers // stages
    return [list(range(s * per, (s + 1) * per)) for s in range(stages)]


def pipeline_fault(
    n_layers: int, pp: int, schedule: str, microbatches: int, batch: int, dp: int
) -> tuple[str, int, str] | None:
    """What makes a pipeline impossible, as (option, value, what it may be), or None: layers
    that do not split into its stages, fewer micro-batches a step (of `batch` samples on each of
    `dp` ranks) than stages, or for a looped schedule micro-batches not a multiple of pp. The
    trainer's rule (trainers/llama3.py), which the plan checks before the queue."""
    if pp == 1:
        return None
    virtual = PIPELINE_SCHEDULES[schedule]
    if n_layers % (pp * virtual):
        return (
            "pp",
            pp,
            f"a divisor of the model's {n_layers} layers into {pp * virtual} stages of as many "
            f"each ({schedule}: {virtual} a rank)",
        )
    per_forward = batch * dp
    if microbatches < pp:
        return (
            "global_batch",
            microbatches * per_forward,
            f"at least pp {pp} micro-batches of batch_size {batch} on each of {dp} "
            f"data-parallel ranks: {pp * per_forward} or more",
        )
    if virtual > 1 and microbatches % pp:
        return (
            "global_batch",
            microbatches * per_forward,
            f"micro-batches a multiple of pp {pp} ({schedule}): a multiple of {pp * per_forward}",
        )
    return None


def context_fault(seq_len: int, cp: int) -> tuple[str, int, str] | None:
    """What makes a context-parallel split impossible, as pipeline_fault says it: a sequence
    that does not cut into 2 x cp equal chunks (trainers/context.py)."""
    if cp > 1 and seq_len % (2 * cp):
        return (
            "cp",
            cp,
            f"a divisor of half the sequence length {seq_len} (each sequence is cut into 2 x cp "
            "equal chunks)",
        )
    return None


DEFAULT_LOSS_CHUNK = 1024  # tokens of a sequence whose logits exist at once (trainers/loss.py)


@dataclass(frozen=True)
class Preset:
    model: LlamaArgs
    batch_size: int
    seq_len: int
    lr: float
    ac: str


# The torchtitan Llama 3 configurations (saforem2/mmm train_configs; Meta's model cards).
PRESETS: dict[str, Preset] = {
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
# Llama 3.1: the same shapes, RoPE scaled to a 128K context (Meta's llama-models, model args
# use_scaled_rope; the Hugging Face configs' rope_scaling and max_position_embeddings 131072).
# Training keeps 8192-token samples unless --seq-len says more; the context is what the model
# can be asked to read.
LLAMA_3_1_CONTEXT = 131072
for _size in ("8b", "70b", "405b"):
    _base = PRESETS[_size]
    PRESETS[f"3.1-{_size}"] = dataclasses.replace(
        _base,
        model=dataclasses.replace(
            _base.model, rope_scaling=RopeScaling(), max_seq_len=LLAMA_3_1_CONTEXT
        ),
    )
TINY = Preset(
    LlamaArgs(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, max_seq_len=64, multiple_of=32
    ),
    batch_size=4,
    seq_len=64,
    lr=3e-3,
    ac="none",
)


def run_model(
    config: str, tiny: bool, n_layers: int | None, vocab_size: int | None, seq_len: int | None
) -> tuple[Preset, LlamaArgs]:
    """The preset a run starts from and the model it builds: `tiny` is the tiny shape with the
    config's RoPE (`--config 3.1-8b --tiny`: a tiny Llama 3.1), and the context grows to the
    run's sequence length where that is longer."""
    preset = PRESETS[config]
    if tiny:
        preset = dataclasses.replace(
            TINY, model=dataclasses.replace(TINY.model, rope_scaling=preset.model.rope_scaling)
        )
    model = dataclasses.replace(
        preset.model,
        n_layers=n_layers or preset.model.n_layers,
        vocab_size=vocab_size or preset.model.vocab_size,
        max_seq_len=max(seq_len or preset.seq_len, preset.model.max_seq_len),
    )
    return preset, model
