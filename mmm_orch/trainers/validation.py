"""Validation loss of a language model on held-out samples, the same ones at every evaluation."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from mmm_orch.runtime.data import GlobalBatch, micro_batch_indices
from mmm_orch.trainers.context import ContextShard, sequence_part
from mmm_orch.trainers.loss import loss_context, token_losses
from mmm_orch.trainers.pipeline import IGNORED, Pipeline

SYNTHETIC_HELD_OUT = 10**12  # synthetic samples from this global index on are never trained on


class Offset:
    """Samples of `data` from `first` on: sample i is data's sample first + i."""

    def __init__(self, data, first: int):
        self.data, self.first = data, first

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.batch(indices + self.first)


@torch.no_grad()
def validation_loss(
    model: torch.nn.Module,
    data,
    samples: int,
    batch_size: int,
    dp_mesh,
    summed: dist.ProcessGroup,
    tp: int,
    loss_chunk: int,
    device: torch.device,
    context: ContextShard | None = None,
) -> float:
    """Mean loss per token over held-out samples 0 .. samples - 1 of `data`, split over the
    data-parallel ranks in micro-batches (every rank of a TP group, and of a sequence's
    context-parallel group, on the same ones), the totals summed over `summed` (dp, x cp): the
    same samples, so the same number, on any layout. Every rank runs the same number of forwards
    (FSDP gathers parameters in each); a slot past the last sample counts with weight 0."""
    samples = min(samples, getattr(data, "windows", samples))  # a small split: each once
    model.eval()
    totals = torch.zeros(2, device=device)  # loss summed over tokens, tokens
    dp, per_forward = dp_mesh.size(), batch_size * dp_mesh.size()
    for micro in range(math.ceil(samples / per_forward)):
        indices = micro_batch_indices(0, micro, dp_mesh.get_local_rank(), batch_size, dp)
        kept = (indices < samples).to(device)
        inputs, labels = sequence_part(
            context, *data.batch(torch.where(indices < samples, indices, 0))
        )
        with loss_context(tp):
            per_token = token_losses(
                model, inputs.to(device), labels.to(device), loss_chunk, tp, "none"
            )
        totals[0] += (per_token.sum(1) * kept).sum()
        totals[1] += kept.sum() * labels.shape[1]
    dist.all_reduce(totals, group=summed)
    model.train()
    return (totals[0] / totals[1]).item()


@torch.no_grad()
def pipeline_validation_loss(
    staged: Pipeline,
    data,
    samples: int,
    batches: GlobalBatch,
    summed: dist.ProcessGroup,
    tp: int,
    device: torch.device,
    context: ContextShard | None = None,
) -> float:
    """validation_loss through a pipeline: the same held-out samples in the same micro-batches
    (a step's worth at a time, the schedule's count), a slot past the last sample labelled
    IGNORED; the mean over their tokens, on every rank."""
    samples = min(samples, getattr(data, "windows", samples))
    micro, per_forward = batches.accumulation, batches.batch_size * batches.dp
    totals = torch.zeros(2, device=device)  # loss summed over tokens, tokens
    staged.train(False)
    for first in range(0, math.ceil(samples / per_forward), micro):
        indices = torch.cat([batches.micro(0, first + m) for m in range(micro)])
        kept = indices < samples
        inputs, labels = sequence_part(context, *data.batch(torch.where(kept, indices, 0)))
        labels = torch.where(kept.unsqueeze(1), labels, IGNORED)
        with loss_context(tp):
            losses = staged.evaluate(inputs.to(device), labels.to(device))
        counted = kept.view(micro, -1).sum(1) * labels.shape[1]
        for loss, tokens in zip(losses, counted.tolist(), strict=False):  # [] before the last
            if tokens:  # a micro-batch of slots only has no loss (0 / 0)
                totals[0] += loss * tokens
                totals[1] += tokens
    staged.train(True)
    dist.all_reduce(totals, group=summed)
    totals = staged.on_every_stage(totals)  # the last stage's ranks hold them
    return (totals[0] / totals[1]).item()
