"""Llama 3's torch module, a decoder: RMSNorm, rotary embeddings, grouped-query attention,
SwiGLU. The trainer's alone (trainers/llama3.py): the registry and MODEL never import it, so
planning stays free of torch.

Attention reshapes with -1 heads, so the same code runs on a full model and on a tensor-parallel
shard (which holds n_heads / tp heads). Weights are initialised by init_weights(), so a model
built on the meta device can be materialised after it has been parallelised.
"""

from __future__ import annotations

import math
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from mmm_orch.models.init import draw_whole
from mmm_orch.models.llama3.args import LlamaArgs, RopeScaling

# Fused kernels first, cuDNN's before FlashAttention-2's, as torchtitan orders them: on Hopper
# cuDNN's is the faster (benchmarks/README.md). Grouped-query heads are shared inside the kernel
# (enable_gqa) rather than copied. A backend the device lacks (cuDNN on ROCm and
# XPU) is passed over; the CPU has its own kernels.
ATTENTION_KERNELS = [
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]


def rope_frequencies(
    head_dim: int, seq_len: int, theta: float, scaling: RopeScaling | None = None
) -> torch.Tensor:
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    if scaling is not None:
        freqs = scaled_frequencies(freqs, scaling)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), freqs)
    return torch.polar(torch.ones_like(angles), angles)  # complex64, (seq, head_dim / 2)


def scaled_frequencies(freqs: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Meta's apply_scaling (Llama 3.1): long wavelengths divided by the factor, short ones
    kept, the band between blended linearly in context / wavelength."""
    wavelengths = 2 * math.pi / freqs
    long = scaling.original_context / scaling.low_freq_factor
    short = scaling.original_context / scaling.high_freq_factor
    blend = (scaling.original_context / wavelengths - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - blend) * freqs / scaling.factor + blend * freqs
    return torch.where(
        wavelengths < short,
        freqs,
        torch.where(wavelengths > long, freqs / scaling.factor, blended),
    )


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x: (batch, seq, heads, head_dim)."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    rotated = pairs * freqs[: x.shape[1]].view(1, x.shape[1], 1, -1)
    return torch.view_as_real(rotated).flatten(3).type_as(x)


class SequenceShard(Protocol):
    """This rank's part of each sequence under context parallel (trainers/context.py's
    ContextShard, which trainers/parallelize.py puts on each attention)."""

    def positions(self, seq_len: int, device: torch.device) -> torch.Tensor: ...

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernels, enable_gqa: bool
    ) -> torch.Tensor: ...


class Attention(nn.Module):
    context: SequenceShard | None = None  # context parallel: this rank's part of each sequence

    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.head_dim = args.head_dim
        self.repeats = args.n_heads // args.n_kv_heads
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, -1, self.head_dim)
        k = self.wk(x).view(batch, seq, -1, self.head_dim)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        if self.context is not None:  # this rank's tokens sit at their places in the sequence
            freqs = freqs[self.context.positions(seq, x.device)]
        q, k = apply_rope(q, freqs), apply_rope(k, freqs)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.context is not None:
            out = self.context.attention(q, k, v, ATTENTION_KERNELS, self.repeats > 1)
        else:
            with sdpa_kernel(ATTENTION_KERNELS, set_priority=True):
                out = F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, enable_gqa=self.repeats > 1
                )
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.w2 = nn.Linear(args.ffn_dim, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, args.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # SwiGLU


class Block(nn.Module):
    def __init__(self, args: LlamaArgs, layer: int):
        super().__init__()
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = FeedForward(args)
        self.init_std = 0.02 / (2 * (layer + 1)) ** 0.5  # depth-scaled, as torchtitan does

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The whole model, or a part of it (`part`: some of its blocks, the embedding only where the
    part starts the model, the final norm and output only where it ends it), its parameters
    named as in the whole model, so that a checkpoint of the parts is one of the model."""

    tok_embeddings: nn.Embedding | None
    norm: nn.RMSNorm | None
    output: nn.Linear | None

    def __init__(self, args: LlamaArgs, seq_len: int | None = None):
        """`seq_len`: the longest sequence the run feeds it (the RoPE table's length; the
        context, args.max_seq_len, if not given)."""
        super().__init__()
        self.args = args
        self.rope_len = seq_len or args.max_seq_len
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): Block(args, i) for i in range(args.n_layers)})
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # Not a buffer: module.to(dtype) would make the complex table real (keeping only its
        # cosines, with a warning); it follows the model's device in forward instead.
        self.freqs = self.rope_table(torch.get_default_device())

    def part(self, layers: list[int], first: bool, last: bool) -> Transformer:
        """A part sharing this model's modules: blocks `layers`, the embedding if `first`, the
        final norm and output if `last` (a pipeline stage, or all of a rank's stages)."""
        part = Transformer.__new__(Transformer)
        nn.Module.__init__(part)
        part.args, part.rope_len, part.freqs = self.args, self.rope_len, self.freqs
        part.tok_embeddings = self.tok_embeddings if first else None
        part.layers = nn.ModuleDict({str(i): self.layers[str(i)] for i in layers})
        part.norm = self.norm if last else None
        part.output = self.output if last else None
        return part

    def rope_table(self, device: torch.device) -> torch.Tensor:
        args = self.args
        with torch.device(device):
            return rope_frequencies(
                args.head_dim, self.rope_len, args.rope_theta, args.rope_scaling
            )

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Every parameter drawn whole from its own generator (mmm_orch/models/init.py): the
        same weights on any mesh."""
        self.freqs = self.rope_table(next(self.parameters()).device)

        def normal(std: float, bound: float | None = None):
            if bound is None:
                return lambda t, g: nn.init.trunc_normal_(t, std=std, generator=g)
            return lambda t, g: nn.init.trunc_normal_(t, std=std, a=-bound, b=bound, generator=g)

        def ones(t: torch.Tensor, _: torch.Generator) -> None:
            nn.init.ones_(t)

        if self.tok_embeddings is not None:
            draw_whole(
                self.tok_embeddings.weight,
                seed,
                "tok_embeddings.weight",
                lambda t, g: nn.init.normal_(t, std=1.0, generator=g),
            )
        for index, layer in self.layers.items():
            block = cast(Block, layer)  # or a wrapper (checkpoint, compile): its attributes pass
            prefix = f"layers.{index}."
            draw_whole(block.attention_norm.weight, seed, prefix + "attention_norm.weight", ones)
            draw_whole(block.ffn_norm.weight, seed, prefix + "ffn_norm.weight", ones)
            for name, std in (
                ("attention.wq", 0.02),
                ("attention.wk", 0.02),
                ("attention.wv", 0.02),
                ("feed_forward.w1", 0.02),
                ("attention.wo", block.init_std),
                ("feed_forward.w2", block.init_std),
                ("feed_forward.w3", block.init_std),
            ):
                module, linear = name.split(".")
                draw_whole(
                    getattr(getattr(block, module), linear).weight,
                    seed,
                    f"{prefix}{name}.weight",
                    normal(std),
                )
        if self.norm is not None:
            draw_whole(self.norm.weight, seed, "norm.weight", ones)
        if self.output is not None:
            draw_whole(
                self.output.weight,
                seed,
                "output.weight",
                normal(self.args.dim**-0.5, 3 / self.args.dim**0.5),
            )

    def forward(self, tokens: torch.Tensor, hidden_only: bool = False) -> torch.Tensor:
        """The logits; with `hidden_only`, the final norm's output, which trainers/loss.py turns
        into logits a chunk of the sequence at a time (through FSDP's forward all the same). A
        part takes what the part before it gave (hidden states, where it has no embedding) and
        gives its last block's output where it ends before the norm."""
        h = tokens if self.tok_embeddings is None else self.tok_embeddings(tokens)
        if self.freqs.device != h.device:  # built on the meta device, or the model moved
            self.freqs = self.rope_table(h.device)
        for block in self.layers.values():
            h = block(h, self.freqs)
        if self.norm is None or self.output is None:
            return h
        h = self.norm(h)
        return h if hidden_only else self.output(h)

    def count_params(self) -> tuple[int, int]:
        """(all parameters, embedding parameters), counted on the full (unsharded) shapes."""
        assert self.tok_embeddings is not None, "the whole model's count, not a part's"
        total = sum(p.numel() for p in self.parameters())
        return total, self.tok_embeddings.weight.numel()
