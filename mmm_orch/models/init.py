"""Initial weights that do not depend on how the model is sharded, for the models' torch modules
(each folder's model.py). It imports torch: a trainer imports it through them, the registry and
its MODELs never."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

Init = Callable[[torch.Tensor, torch.Generator], object]  # fills a tensor in place


def draw_whole(param: torch.Tensor, seed: int, name: str, init: Init) -> None:
    """Fill `param` with what `init` draws for the whole tensor from a generator of its own,
    seeded by (seed, name). On a sharded DTensor (FSDP, TP) this rank keeps its part of the
    whole, so a model starts from the same weights on any mesh as on one process: the same
    global batch then gives the same loss curve on any number of nodes. One whole parameter at a
    time is drawn on the device (the largest, Llama 3's output layer: 2-8 GB in fp32)."""
    generator_seed = (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63
    with torch.no_grad():
        if not isinstance(param, DTensor):
            init(param, torch.Generator(param.device).manual_seed(generator_seed))
            return
        local = param.to_local()
        whole = torch.empty(param.shape, dtype=param.dtype, device=local.device)
        init(whole, torch.Generator(whole.device).manual_seed(generator_seed))
        shape, offset = compute_local_shape_and_global_offset(
            param.shape, param.device_mesh, param.placements
        )
        local.copy_(whole[tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))])
