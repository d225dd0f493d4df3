"""Llama 3's shapes, its parameter count and its presets: what the trainer builds
(trainers/llama3.py, the torch module in model.py) and the planner sizes (memory.py beside).
Plain data, no torch, so `mmm-orch render` can say whether a plan fits the device before it is
queued."""

from __future__ import annotations

import dataclasses
import math

from mmm_orch.dataclass_code import dataclass
from mmm_orch.errors import UnknownName
from mmm_orch.models.spec import Preset


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
    """A Llama 3 model's shape (Meta's ModelArgs): the torch module (model.py) is built from it,
    the memory rule (memory.py) sizes it, and the trainer saves it beside each checkpoint."""

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


DEFAULT_PRESET = "debug"


def run_model(
    config: str | None,
    tiny: bool,
    n_layers: int | None,
    vocab_size: int | None,
    seq_len: int | None,
) -> tuple[Preset, LlamaArgs]:
    """The preset a run starts from (`config`, the debug one if None) and the model it builds:
    `tiny` is the tiny shape with the config's RoPE (`--config 3.1-8b --tiny`: a tiny Llama
    3.1), and the context grows to the run's sequence length where that is longer."""
    config = config or DEFAULT_PRESET
    if config not in PRESETS:
        raise UnknownName("config", config, "one of " + ", ".join(PRESETS))
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
