"""The chunked language-model loss (trainers/loss.py): its value and both gradients, made in
forward a chunk at a time, against one cross-entropy over the whole vocabulary's logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.loss_head import Head
from mmm_orch.trainers.loss import token_losses


def losses_and_grads(chunk: int, reduction: str, scale: float = 1.0, seed: int = 0,
                     batch: int = 3, seq: int = 13, dim: int = 16, vocab: int = 97):
    torch.manual_seed(seed)
    tokens = torch.randint(vocab, (batch, seq))
    labels = torch.randint(vocab, (batch, seq))
    model = Head(dim, vocab, seed).double()
    if chunk:
        loss = token_losses(model, tokens, labels, chunk, tp=1, reduction=reduction)
    else:  # the reference: one cross-entropy over all the logits, in float64
        loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten(), reduction=reduction)
    (loss * scale).backward()
    return loss.detach(), model.embed.grad, model.output.weight.grad


@pytest.mark.slow
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk", [1, 4, 5, 12])
def test_chunks_give_the_whole_sequence_loss_and_gradients(chunk, reduction):
    whole = losses_and_grads(0, reduction)
    chunked = losses_and_grads(chunk, reduction)  # 4 and 5 leave a shorter last chunk of 13
    for got, want in zip(chunked, whole):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_the_gradients_follow_the_loss_gradient():
    """Backward scales the gradients made in forward by what reaches the loss (the trainer
    divides it by the number of micro-batches)."""
    _, embed_1, output_1 = losses_and_grads(4, "mean")
    _, embed_3, output_3 = losses_and_grads(4, "mean", scale=0.25)
    torch.testing.assert_close(embed_3, embed_1 * 0.25, rtol=1e-12, atol=0)
    torch.testing.assert_close(output_3, output_1 * 0.25, rtol=1e-12, atol=0)


def test_under_autocast_the_products_run_in_its_dtype_and_the_gradients_keep_theirs():
    torch.manual_seed(1)
    model = Head(32, 211, seed=1)
    tokens, labels = torch.randint(211, (2, 24)), torch.randint(211, (2, 24))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = token_losses(model, tokens, labels, 8, tp=1)
    loss.backward()
    chunked = loss.item(), model.embed.grad.clone(), model.output.weight.grad.clone()
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens)
    whole = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    whole.backward()
    assert model.output.weight.grad.dtype == chunked[2].dtype == torch.float32
    assert chunked[0] == pytest.approx(whole.item(), rel=1e-2)
    for got, want in ((chunked[1], model.embed.grad), (chunked[2], model.output.weight.grad)):
        assert (got - want).norm() / want.norm() < 2e-2


def test_without_gradients_the_chunks_give_every_token_its_loss():
    torch.manual_seed(2)
    model = Head(16, 53, seed=2)
    tokens, labels = torch.randint(53, (2, 11)), torch.randint(53, (2, 11))
    with torch.no_grad():
        per_token = token_losses(model, tokens, labels, 3, tp=1, reduction="none")
        whole = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten(), reduction="none")
    torch.testing.assert_close(per_token, whole.view(2, 11))
