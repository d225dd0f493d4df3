"""The language-model loss without the whole vocabulary's fp32 logits of every token at once:
under TP the output layer keeps its logits sharded over the vocabulary (loss_parallel); without
TP the tokens are cut into chunks whose logits exist one at a time. For Llama 3 8B (vocabulary
128256, 8192 tokens) that is 1.2 GB of logits per chunk of 1024 tokens against 12.6 GB (bf16
logits, their fp32 copy and its gradient) for the sequence.

In training, each chunk's gradients are made as its loss is (_LinearCrossEntropy), so no chunk's
logits are kept for backward or made twice: checkpointing the chunks instead ran the output
layer's matrix product four times a step rather than three, 6% of an 8-layer 8B step's work.

With `compiled` (the trainer's --compile on CUDA) each chunk's softmax, loss and logits gradient
are one compiled function (_softmax_grad): a fused pass reads the low-precision logits and writes
their low-precision gradient, where eager makes several passes over an fp32 copy (on an H200,
8B-shaped, that copy, the subtract, the exponential and the scatter were ~18 ms of a 303 ms
step; compiled, 2.9 ms, and the compiled trainer 4.6% faster: benchmarks/README.md). The chunks
and their memory bound stay as they are."""

from __future__ import annotations

import contextlib
import functools
from typing import cast

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel


def loss_context(tp: int):
    """Where the loss and its backward run: inside loss_parallel under TP (logits stay sharded
    over the vocabulary)."""
    if tp == 1:
        return contextlib.nullcontext()
    return loss_parallel()


def token_losses(
    model,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    chunk: int,
    tp: int,
    reduction: str = "mean",
    compiled: bool = False,
) -> torch.Tensor:
    """Cross-entropy of every token (`reduction` none: one per token, shaped as labels; sum; or
    mean), inside loss_context(tp). `chunk`: tokens of a sequence whose logits exist at once (0:
    the whole sequence); ignored under TP, where the logits are sharded instead. `compiled`: the
    chunks' softmax and gradient in training run compiled (_softmax_grad)."""
    if tp > 1 or not chunk or chunk >= inputs.shape[1]:
        logits = model(inputs)
        losses = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none")
        reduced = _reduce(losses, labels, reduction)
        # Under loss_parallel the losses come back replicated over the TP group: as a tensor.
        return cast(DTensor, reduced).full_tensor() if tp > 1 else reduced
    hidden = model(inputs, hidden_only=True)
    if torch.is_grad_enabled() and reduction != "none":
        total = _LinearCrossEntropy.apply(hidden, model.output.weight, labels, chunk, compiled)
        return total if reduction == "sum" else total / labels.numel()
    parts = [
        _chunk_losses(
            model.output, hidden[:, start : start + chunk], labels[:, start : start + chunk]
        )
        for start in range(0, inputs.shape[1], chunk)
    ]
    return _reduce(torch.cat(parts, dim=1).flatten(), labels, reduction)


def _chunk_losses(output, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = output(hidden)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none").view(
        labels.shape
    )


def _reduce(losses: torch.Tensor, labels: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return losses.view(labels.shape)
    return losses.sum() if reduction == "sum" else losses.mean()


class _LinearCrossEntropy(torch.autograd.Function):
    """The summed cross-entropy of `hidden @ weight.T` against `labels`, `chunk` positions of
    the batch's sequences at a time, with both gradients made in forward (the softmax less the
    one-hot label, times the weight and times the chunk's hidden states) and scaled in backward
    by the loss's gradient. The products run in the dtype of autocast where it is on, else in
    the hidden states' (the logits' exponentials and sums in fp32 either way); the weight's
    gradient is summed over the chunks in the weight's dtype, as one product over all tokens
    would write it."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk, compiled=False):
        dtype = (
            torch.get_autocast_dtype(hidden.device.type)
            if torch.is_autocast_enabled(hidden.device.type)
            else hidden.dtype
        )
        with torch.autocast(hidden.device.type, enabled=False):
            hidden_c, weight_c = hidden.to(dtype), weight.to(dtype)
            grad_hidden = torch.empty_like(hidden_c)
            grad_weight = torch.zeros_like(weight_c)
            exact = torch.promote_types(dtype, torch.float32)  # the softmax's dtype: fp32 at least
            total = torch.zeros((), dtype=exact, device=hidden.device)
            for start in range(0, hidden.shape[1], chunk):
                part = hidden_c[:, start : start + chunk]
                tokens = part.flatten(0, 1)
                targets = labels[:, start : start + chunk].flatten().unsqueeze(1)
                if compiled:
                    loss, grad_logits = _compiled_softmax_grad()(tokens @ weight_c.T, targets)
                    total += loss
                else:
                    logits = (tokens @ weight_c.T).to(exact)
                    norm = logits.logsumexp(dim=1, keepdim=True)
                    total += (norm - logits.gather(1, targets)).sum()
                    probs = logits.sub_(norm).exp_()  # in place: no second logits-sized buffer
                    probs.scatter_add_(1, targets, torch.full_like(targets, -1, dtype=probs.dtype))
                    grad_logits = probs.to(dtype)
                grad_hidden[:, start : start + chunk] = (grad_logits @ weight_c).view_as(part)
                grad_weight.addmm_(grad_logits.T, tokens)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = hidden.dtype, weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        return (
            (grad_hidden * grad_total).to(hidden_dtype),
            (grad_weight * grad_total).to(weight_dtype),
            None,
            None,
            None,
        )


def _softmax_grad(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's summed cross-entropy (in fp32 at least) and its gradient with respect to the
    logits (softmax less the one-hot labels), in the logits' dtype; `targets` is (tokens, 1).
    Compiled, it reads the logits in their own dtype in one fused kernel (or two) instead of
    eager's several passes over an fp32 copy, as torchtitan's compiled loss does."""
    exact = logits.float() if logits.dtype != torch.float64 else logits
    norm = exact.logsumexp(dim=1, keepdim=True)
    loss = (norm - exact.gather(1, targets)).sum()
    classes = torch.arange(logits.shape[1], device=logits.device)
    probs = (exact - norm).exp() - (classes == targets).to(exact.dtype)
    return loss, probs.to(logits.dtype)


@functools.cache
def _compiled_softmax_grad():
    """_softmax_grad under torch.compile, made once (compiled at its first call; a chunk of
    another length, such as a shorter last one, compiles once more)."""
    return torch.compile(_softmax_grad, fullgraph=True, dynamic=False)
