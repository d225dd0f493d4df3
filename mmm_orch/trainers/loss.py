"""The language-model loss without the whole vocabulary's fp32 logits of every token at once:
under TP the output layer keeps its logits sharded over the vocabulary (loss_parallel); without
TP the sequence is cut into chunks whose logits are made, and remade in backward, one at a time.
For Llama 3 8B (vocabulary 128256, 8192 tokens) that is 1.2 GB of logits per chunk of 1024
tokens against 12.6 GB (bf16 logits, their fp32 copy and its gradient) for the sequence."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def loss_context(tp: int):
    """Where the loss and its backward run: inside loss_parallel under TP (logits stay sharded
    over the vocabulary)."""
    if tp == 1:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def token_losses(model, inputs: torch.Tensor, labels: torch.Tensor, chunk: int, tp: int,
                 reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of every token (`reduction` none: one per token, shaped as labels; sum; or
    mean), inside loss_context(tp). `chunk`: tokens of a sequence whose logits exist at once (0:
    the whole sequence); ignored under TP, where the logits are sharded instead."""
    if tp > 1 or not chunk or chunk >= inputs.shape[1]:
        logits = model(inputs)
        losses = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none")
        reduced = _reduce(losses, labels, reduction)
        # Under loss_parallel the losses come back replicated over the TP group: as a tensor.
        return reduced.full_tensor() if tp > 1 else reduced
    hidden = model(inputs, hidden_only=True)
    parts = [checkpoint(_chunk_losses, model.output, hidden[:, start:start + chunk],
                        labels[:, start:start + chunk], use_reentrant=False)
             if torch.is_grad_enabled() else
             _chunk_losses(model.output, hidden[:, start:start + chunk],
                           labels[:, start:start + chunk])
             for start in range(0, inputs.shape[1], chunk)]
    return _reduce(torch.cat(parts, dim=1).flatten(), labels, reduction)


def _chunk_losses(output, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = output(hidden)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                           reduction="none").view(labels.shape)


def _reduce(losses: torch.Tensor, labels: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return losses.view(labels.shape)
    return losses.sum() if reduction == "sum" else losses.mean()
