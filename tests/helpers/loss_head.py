"""A model of the least that the chunked loss (trainers/loss.py, token_losses) asks: shared by
the loss's tests in eager mode and compiled."""

from __future__ import annotations

import torch
from torch import nn


class Head(nn.Module):
    """The two things token_losses asks of a model: hidden states, and the output layer."""

    def __init__(self, dim: int, vocab: int, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.embed = nn.Parameter(torch.randn(vocab, dim, generator=generator))
        self.output = nn.Linear(dim, vocab, bias=False)
        with torch.no_grad():
            self.output.weight.copy_(torch.randn(vocab, dim, generator=generator) / dim ** 0.5)

    def forward(self, tokens: torch.Tensor, hidden_only: bool = False) -> torch.Tensor:
        hidden = torch.tanh(self.embed[tokens])
        return hidden if hidden_only else self.output(hidden)
