"""Parallelism applied to a model: tensor parallel, compile, activation checkpointing, then FSDP2
over the data-parallel mesh dimension (on a world of more than one rank). torchtitan compiles around the checkpointed block; with
TP that fails in torch 2.13's AOT autograd, so here the checkpoint wraps the compiled block."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from mmm_orch.models.llama3.model import Block, Transformer
from mmm_orch.trainers.context import ContextShard


def tensor_parallel_llama(model: Transformer, tp_mesh: DeviceMesh) -> None:
    """Megatron-style TP with sequence-parallel norms: q/k/v and w1/w3 column-wise, wo and w2
    row-wise; activations between blocks stay sharded along the sequence."""
    if tp_mesh.size() == 1:
        return
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            # Logits stay sharded over the vocabulary: the loss runs under loss_parallel (loss.py).
            "output": ColwiseParallel(
                input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False
            ),
        },
    )
    for block in model.layers.values():
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
                ),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                "feed_forward.w3": ColwiseParallel(),
            },
        )


def activation_checkpointing(blocks: nn.ModuleDict, mode: str) -> None:
    """full: recompute every block; every_other: every other block (what torchtitan calls
    layer-wise selective checkpointing with option 2; not its per-op policy), trading half the
    recompute for half the saved activations."""
    if mode == "none":
        return
    for i, (name, block) in enumerate(list(blocks.items())):
        if mode == "full" or i % 2 == 0:
            blocks[name] = checkpoint_wrapper(block, preserve_rng_state=False)


def compile_blocks(blocks: nn.ModuleDict, whole: bool = True) -> None:
    """Each block compiled, as one graph where `whole` (not under context parallel: its gather
    of keys and values, a collective inside an autograd function, breaks the graph there)."""
    for name, block in list(blocks.items()):
        blocks[name] = compiled(block, fullgraph=whole)


def context_parallel(model: Transformer, cp_mesh: DeviceMesh) -> ContextShard | None:
    """Each block's attention over this rank's part of every sequence (trainers/context.py);
    the part, None without context parallel."""
    if cp_mesh.size() == 1:
        return None
    shard = ContextShard(cp_mesh.get_group(), cp_mesh.get_local_rank(), cp_mesh.size())
    for block in model.layers.values():
        cast(Block, block).attention.context = shard
    return shard


def compiled(module: nn.Module, **options: Any) -> nn.Module:
    """torch.compile(module, **options): an OptimizedModule, itself a module."""
    # torch's overloads type a compiled module as a plain callable.
    return torch.compile(module, **options)  # type: ignore[return-value]


def fsdp(
    model: nn.Module, blocks, dp_mesh: DeviceMesh, param_dtype: torch.dtype
) -> Callable[[], AbstractContextManager]:
    """FSDP2: each block its own unit (so gathers overlap compute), then the root; gradients are
    reduced in fp32. Returns the context a step's forward and loss run in: none under FSDP,
    whose parameters are gathered in the compute dtype. A world of one rank has nothing to shard
    or reduce: its parameters stay fp32 and compute under autocast instead, as torchtitan's do
    on one device (FSDP's copies into its one-rank buffers took 13% of a compiled step on an
    H200, benchmarks/README.md)."""
    if dist.get_world_size() == 1:
        if param_dtype == torch.float32:
            return contextlib.nullcontext
        return functools.partial(torch.autocast, dp_mesh.device_type, dtype=param_dtype)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)
    return contextlib.nullcontext
