"""The chunked loss's compiled softmax and gradient (trainers/loss.py, `compiled`: the llama3
trainer's --compile on CUDA) against its eager path: the same loss and both gradients.

On the CPU the function is compiled with the aot_eager backend: the whole graph traced, with
no break, and run through AOT autograd's decompositions, in about a second; Inductor's C++ code
for it took 40-60 s to build on the 2-core CI machine. Inductor itself (the trainer's compiler)
is checked where CUDA is."""

from __future__ import annotations

import pytest
import torch

from mmm_orch.trainers import loss as loss_module
from mmm_orch.trainers.loss import token_losses
from helpers.loss_head import Head


def compiled_and_eager(device: str, dtype: torch.dtype = torch.float32):
    torch.manual_seed(3)
    vocab, batch, seq = 512, 2, 32  # 64 tokens, chunks of 16: one compiled shape
    tokens, labels = torch.randint(vocab, (batch, seq)), torch.randint(vocab, (batch, seq))
    results = []
    for compiled in (False, True):
        model = Head(32, vocab, seed=3).to(device, dtype)
        loss = token_losses(
            model, tokens.to(device), labels.to(device), 16, tp=1, compiled=compiled
        )
        loss.backward()
        results.append((loss.detach(), model.embed.grad, model.output.weight.grad))
    return results


def test_the_compiled_chunks_give_the_eager_loss_and_gradients(monkeypatch):
    traced = torch.compile(
        loss_module._softmax_grad, fullgraph=True, dynamic=False, backend="aot_eager"
    )
    monkeypatch.setattr(loss_module, "_compiled_softmax_grad", lambda: traced)
    eager, compiled = compiled_and_eager("cpu")
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Inductor's CUDA code: needs a GPU")
def test_on_cuda_inductor_gives_the_eager_loss_and_gradients():
    eager, compiled = compiled_and_eager("cuda")
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
