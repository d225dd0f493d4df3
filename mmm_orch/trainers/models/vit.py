"""Vision Transformer (pre-norm blocks, class token, learned position embeddings)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class VitArgs:
    img_size: int = 224
    patch_size: int = 16
    depth: int = 24
    heads: int = 16
    head_dim: int = 64
    num_classes: int = 1000
    mlp_ratio: float = 4.0

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def patches(self) -> int:
        return (self.img_size // self.patch_size) ** 2


class VitBlock(nn.Module):
    def __init__(self, args: VitArgs):
        super().__init__()
        self.heads = args.heads
        self.norm1 = nn.LayerNorm(args.dim)
        self.qkv = nn.Linear(args.dim, 3 * args.dim)
        self.proj = nn.Linear(args.dim, args.dim)
        self.norm2 = nn.LayerNorm(args.dim)
        hidden = int(args.dim * args.mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(args.dim, hidden), nn.GELU(), nn.Linear(hidden, args.dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, -1).unbind(2)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, tokens, dim))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, args: VitArgs):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, args.dim, args.patch_size, args.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, args.dim))
        self.pos_embed = nn.Parameter(torch.randn(1, args.patches + 1, args.dim) * 0.02)
        self.blocks = nn.ModuleList(VitBlock(args) for _ in range(args.depth))
        self.norm = nn.LayerNorm(args.dim)
        self.head = nn.Linear(args.dim, args.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])
