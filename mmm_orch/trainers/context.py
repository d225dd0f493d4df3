"""Context parallel: each sequence split over the cp ranks of a group, attention by gathering
keys and values, Llama 3's own method (Dubey et al. 2024, section 3.3.2): under grouped-query
attention K and V are a fraction of Q's size (8 KV heads to 32 query heads), so one all-gather
of them costs less than a ring's 2 x cp rotations, and any attention kernel computes the rest,
on any device. torch's `context_parallel` (a ring) takes CUDA's fused kernels only.

The sequence is cut into 2 x cp chunks; rank r holds chunks r and 2cp - 1 - r, so that every
rank has the same share of the causal mask's work (the first chunks attend to few keys, the
last to many)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel
from torch.nn.attention.bias import causal_lower_right


@dataclass(frozen=True)
class ContextShard:
    """This rank's part of every sequence: its rank in the cp group of `size` ranks."""

    group: dist.ProcessGroup
    rank: int
    size: int

    def masks(self, part_len: int) -> None:
        """Make the causal masks of a sequence part of `part_len` tokens before the step (under
        fake tensors, trainers/verify.py, a mask cannot be made: it is a tensor subclass)."""
        length = part_len // 2
        for chunk in self.chunk_indices():
            causal_mask(length, (chunk + 1) * length)

    def chunk_indices(self) -> tuple[int, int]:
        """The two chunks (of 2 x size) this rank holds, in their order along the sequence."""
        return self.rank, 2 * self.size - 1 - self.rank

    def split(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of a tensor whose dim 1 is the whole sequence."""
        chunks = full.chunk(2 * self.size, dim=1)
        return torch.cat([chunks[i] for i in self.chunk_indices()], dim=1)

    def positions(self, seq_len: int, device: torch.device) -> torch.Tensor:
        """The positions in the whole sequence of this rank's `seq_len / size` tokens."""
        return self.split(torch.arange(seq_len * self.size, device=device).unsqueeze(0))[0]

    def whole(self, part: torch.Tensor) -> torch.Tensor:
        """The whole sequence from every rank's part (dim 1), in order; gradients go back to each
        rank's part."""
        parts = _Gather.apply(part, self.group, self.size)
        chunks: list[torch.Tensor | None] = [None] * (2 * self.size)
        for rank, held in enumerate(parts):
            first, second = held.chunk(2, dim=1)
            chunks[rank], chunks[2 * self.size - 1 - rank] = first, second
        return torch.cat(chunks, dim=1)  # type: ignore[arg-type]

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernels, enable_gqa: bool
    ) -> torch.Tensor:
        """Causal attention of this rank's queries (batch, heads, seq / cp, head_dim) over the
        whole sequence's keys and values, gathered: each of its two chunks attends to the keys
        up to its own end, the causal mask aligned to the lower right."""
        # Keys and values side by side in one gather: one collective a layer each way, not two.
        both = self.whole(torch.cat([k.transpose(1, 2), v.transpose(1, 2)], dim=-1))
        keys, values = both.transpose(1, 2).chunk(2, dim=-1)
        length = q.shape[2] // 2
        out = []
        for half, chunk in zip(q.split(length, dim=2), self.chunk_indices(), strict=True):
            end = (chunk + 1) * length
            with sdpa_kernel(kernels, set_priority=True):
                out.append(
                    F.scaled_dot_product_attention(
                        half,
                        keys[:, :, :end],
                        values[:, :, :end],
                        attn_mask=causal_mask(length, end),
                        enable_gqa=enable_gqa,
                    )
                )
        return torch.cat(out, dim=2)


@functools.cache
def causal_mask(length: int, end: int):
    """The causal mask of `length` queries ending at key `end`, aligned to the lower right: made
    once per shape, not once a layer."""
    return causal_lower_right(length, end)


def sequence_part(
    context: ContextShard | None, inputs: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's inputs and labels as this rank feeds them: its part of each sequence under
    context parallel, the whole sequences without."""
    if context is None:
        return inputs, labels
    return context.split(inputs), context.split(labels)


class _Gather(torch.autograd.Function):
    """All-gather of each rank's part into one tensor (a gather into a list of tensors makes a
    flat copy of them all inside the collective, on NCCL as on gloo: twice the memory, and
    none of it seen by --verify's tracker); in backward, each rank's part of the summed
    gradients (an all-reduce rather than a reduce-scatter: gloo has none, and K and V are
    small)."""

    @staticmethod
    def forward(ctx, part: torch.Tensor, group: dist.ProcessGroup, size: int):
        ctx.group, ctx.rank = group, dist.get_rank(group)
        gathered = part.new_empty((size * part.shape[0], *part.shape[1:]))
        dist.all_gather_into_tensor(gathered, part.contiguous(), group=group)
        return gathered.chunk(size)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        summed = torch.stack([g.contiguous() for g in grads])
        dist.all_reduce(summed, group=ctx.group)
        return summed[ctx.rank], None, None
