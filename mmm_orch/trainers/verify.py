"""A Llama 3 layout checked before the queue, on a CPU: the trainer's own model, parallelized as
the job will (trainers/llama3.py's `parallelized`: TP, context parallel, pipeline stages and their
schedule, activation checkpointing, FSDP2), for one rank of each kind, at the job's world size,
under fake tensors (no parameter is allocated) and a fake process group (nothing is sent).

Each rank's step holds AdamW's states, as every step after the first does (made first by an
optimizer step over zero gradients). PyTorch's MemTracker takes the peak by part; a dispatch
mode of ours takes the collectives and their sizes, and the step's time by the roofline torch's
RuntimeEstimator uses (its operators' FLOP formulas and byte counts, the larger of compute and
memory time), with the device's figures from the machine's profile: RuntimeEstimator itself
asks CUDA for them, and the point is to need no GPU.

A rank kind is a pipeline stage's first rank, and its last where their shards differ (a
dimension FSDP or TP does not split evenly). Each is checked in a process of its own: a fake
process group's rank is its process's, and DTensor and the device mesh keep its groups for the
process's life. A pipeline rank runs its part of torch's own schedule, its stages' forwards and
backwards in that schedule's order (`actions`), what a neighbour would send arriving in
receive buffers as PipelineStage's do.

    python -m mmm_orch.trainers.verify < request.json > report.json   (or lists of them)

The request and report are verification.py's (mmm_orch/planning/verification.py); a fault is in
the report, not an exit code: the planner says it, with the rank kind and the numbers."""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import sys
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fake_collectives import CollectiveOp, collective_ops, sync_ops
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    ScheduleGPipe,
    _ComputationType,
)
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.placement_types import _StridedShard
from torch.nn.attention import SDPBackend
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._runtime_estimation import _IGNORE_OPS, _VIEW_OPS, get_num_bytes
from torch.utils.flop_counter import flop_registry

from mmm_orch.injob.launch_env import LaunchEnv
from mmm_orch.models.llama3 import model as llama_model
from mmm_orch.runtime.data import GlobalBatch, SyntheticTokens
from mmm_orch.runtime.device import Device
from mmm_orch.runtime.dist import Runtime
from mmm_orch.runtime.loop import StepTimer, adamw, mesh
from mmm_orch.runtime.options import parse
from mmm_orch.trainers import llama3, pipeline
from mmm_orch.trainers.loss import loss_context

# MemTracker's parts, named as the plan names its own (planning/memory.py)
PARTS = {
    "Parameter": "parameters",
    "Buffer": "parameters",
    "Gradient": "gradients",
    "Optstate": "optimizer",
    "Activation": "activations",
    "Temp": "temporaries",
    "Other": "temporaries",
}


@dataclasses.dataclass(frozen=True)
class DeviceFigures:
    """The job's device as the profile gives it: its peak dense FLOPS in the compute dtype, its
    memory's bandwidth and each device's share of its node's network, bytes/s (None: unknown)."""

    flops: float | None
    memory_bandwidth: float | None
    network_bandwidth: float | None


class StepMemory(MemTracker):
    """PyTorch's MemTracker, over a training loop: a model called again from the top (the next
    micro-batch, the next step) starts its module's stats afresh, where MemTracker refuses a
    second call; the peak and every live tensor are kept. Only the device's peak is kept up to
    date: MemTracker also walks every module's stats at every operator (a 40-layer stage's ~500,
    three quarters of a check's time), and the check reads none of them."""

    def _update_peak_stats(self, peak_state: Any) -> None:
        for device, snapshot in self._curr_mem_snap.items():
            if self._peak_mem.get(device, 0) < snapshot["Total"]:
                self._peak_mem[device] = snapshot["Total"]
                self._peak_mem_snap[device] = dict(snapshot)

    def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
        name = self._mod_tracker.get_known_fqn(module)
        top = set(self._mod_tracker.parents) - {name} == {"Global"}
        if top and not self._mod_tracker.is_bw and module in self.memory_tracking:
            del self.memory_tracking[module]
        super()._pre_fw_hook(module, inputs)


class StepCost(TorchDispatchMode):
    """One step's collectives (op, group size: count and bytes) and its roofline time on the job's
    device, from the operators on plain (local) tensors."""

    def __init__(self, device: DeviceFigures, ranks_per_node: int):
        super().__init__()
        self.device, self.ranks_per_node = device, ranks_per_node
        self.collectives: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
        self.compute_s = self.network_s = 0.0
        self.counting = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            # DTensor first: it comes back as the collectives and local operators it runs
            # (as torch's CommDebugMode does), where the operator on DTensors would hide them.
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if not self.counting:
            return out
        if func in collective_ops:
            if func not in sync_ops:
                self._collective(func, out, args, kwargs or {})
        elif computes(func):
            self._roofline(func, out, args, kwargs or {})
        return out

    def _collective(self, func, out, args, kwargs) -> None:
        size = CollectiveOp.get_comm_tensor_size(func, out, args, kwargs)
        group = CollectiveOp.get_process_group(func, args).size()
        name = func._overloadpacket.__name__.strip("_").removesuffix("_base").removesuffix("_")
        record = self.collectives[(name, group)]
        record[0] += 1
        record[1] += size
        self.network_s += self._transfer_s(name, size, group)

    def _transfer_s(self, name: str, size: int, group: int) -> float:
        """A ring's time for the collective where its group crosses nodes (a group of more ranks
        than a node holds), at each device's share of the node's network; 0 inside a node."""
        if group <= self.ranks_per_node or not self.device.network_bandwidth:
            return 0.0
        factor = 2 * (group - 1) / group if name.endswith("reduce") else (group - 1) / group
        return factor * size / self.device.network_bandwidth

    def _roofline(self, func, out, args, kwargs) -> None:
        tensors = [
            t for t in pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)
        ]
        moved = sum(get_num_bytes(t) for t in tensors)  # a view's own bytes, not its storage's
        memory_s = moved / self.device.memory_bandwidth if self.device.memory_bandwidth else 0
        compute_s = 0.0
        if func._overloadpacket in flop_registry and self.device.flops:
            flops = flop_registry[func._overloadpacket](*args, **kwargs, out_val=out)
            compute_s = flops / self.device.flops
        self.compute_s += max(memory_s, compute_s)


def computes(func) -> bool:
    """Whether an operator reads or writes tensor data on the device: not a view, an allocation
    or a query of a tensor's metadata (prim.device alone, asked thousands of times a step, read
    as moving its tensor, was two thirds of a 70B stage's roofline)."""
    return not (
        func.namespace == "prim"
        or func.is_view
        or func._overloadpacket in _IGNORE_OPS | _VIEW_OPS
        or func.__name__.startswith(("empty", "new_empty"))
    )


def with_states(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    """AdamW's states made, as its first step makes them, from gradients of zero."""
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def join(rank: int, world_size: int) -> None:
    """This process as `rank` of a fake process group of `world_size` (once: a process of its
    own per rank, verify's)."""
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())


def runtime(rank: int, world_size: int, ranks_per_node: int) -> Runtime:
    launch = LaunchEnv(rank, rank % ranks_per_node, world_size, ranks_per_node, "fake", "", 0)
    return Runtime(launch, Device("cpu", None, "fake"), "verify")


def shards(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Each parameter's shard on this rank: its local and whole shapes, its placements over the
    mesh's dimensions (dp, tp: Shard(dim) or Replicate), and whether every rank's is alike (the
    whole split evenly)."""
    found = {}
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        placements = shards_of(param)
        pieces = math.prod(  # none for a plain tensor: it has no placements
            cast(DTensor, param).device_mesh.size(i)
            for i, placement in enumerate(placements.values())
            if splits(placement)
        )
        found[name] = {
            "local": list(local.shape),
            "whole": list(param.shape),
            "placements": {dim: str(p) for dim, p in placements.items()},
            "even": local.numel() * pieces == param.numel(),
        }
    return found


def unsharded(model: nn.Module, tp: int, dp: int) -> list[str]:
    """Modules whose weights the layout leaves whole on every rank: under TP, a block's linear
    layer not split over tp; under FSDP (dp > 1), a parameter not split over dp."""
    left = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if weight is None:
            continue
        placements = shards_of(weight)
        if tp > 1 and isinstance(module, nn.Linear) and not splits(placements.get("tp")):
            left.append(f"{name} (whole over tp {tp})")
        elif dp > 1 and not any(splits(placements.get(dim)) for dim in ("dp", "dp_cp")):
            left.append(f"{name} (whole over dp {dp})")
    return left


def shards_of(param: torch.Tensor) -> dict[str, Any]:
    """A parameter's placements by mesh dimension name ({} for a plain tensor)."""
    if not isinstance(param, DTensor):
        return {}
    return dict(zip(param.device_mesh.mesh_dim_names or (), param.placements, strict=True))


def splits(placement: Any) -> bool:
    """Whether a placement splits its tensor: a Shard, or FSDP's strided shard under TP."""
    return isinstance(placement, Shard | _StridedShard)


@contextmanager
def attention_kernel(kernel: str) -> Iterator[None]:
    """The model's attention as the job's device runs it: with "math", the math kernel alone
    (which keeps every head's probabilities for backward, as on a device without a fused
    training kernel); otherwise the CPU's own."""
    if kernel != "math":
        yield
        return
    kept = llama_model.ATTENTION_KERNELS
    llama_model.ATTENTION_KERNELS = [SDPBackend.MATH]
    try:
        yield
    finally:
        llama_model.ATTENTION_KERNELS = kept


@dataclasses.dataclass
class Check:
    """One rank's check: the trainer's options, the job's world and device."""

    cfg: llama3.Config
    world_size: int
    ranks_per_node: int
    dtype: torch.dtype
    device: DeviceFigures

    def build(self, rank: int):
        """The rank's mesh, its batches and its parallelized (meta) model, stages and forward."""
        join(rank, self.world_size)
        cfg = self.cfg
        args, batch_size, seq_len, _, ac = llama3.resolve(cfg)
        world = mesh(runtime(rank, self.world_size, self.ranks_per_node), cfg.tp, cfg.pp, cfg.cp)
        dp = world["dp"]
        batches = GlobalBatch.of(cfg.global_batch, batch_size, dp.size(), dp.get_local_rank())
        model, stages, forward, _ = llama3.parallelized(cfg, args, seq_len, ac, world, self.dtype)
        return world, batches, args, seq_len, model, stages, forward

    def run(self, rank: int, step: bool = True) -> dict[str, Any]:
        """The rank's report: its shards, and with `step` its peak by part, collectives and step
        time."""
        world, batches, args, seq_len, model, stages, forward = self.build(rank)
        cfg = self.cfg
        found: dict[str, Any] = {"rank": rank, "shards": shards(model)}
        left = unsharded(model, cfg.tp, world["dp"].size() * world["cp"].size())
        if left:
            return {**found, "fault": "unsharded", "modules": left}
        if not step:
            return found
        rt = runtime(rank, self.world_size, self.ranks_per_node)
        cost = StepCost(self.device, self.ranks_per_node)
        tracker = StepMemory()
        if forward.context is not None:
            forward.context.masks(seq_len // cfg.cp)
        where = Where(model)
        try:
            with FakeTensorMode(allow_non_fake_inputs=True), where, tracker, cost:
                model.to_empty(device="cpu")
                optimizer = adamw(model.parameters(), rt, lr=1e-4, betas=(0.9, 0.95))
                with_states(optimizer, model)
                data = SyntheticTokens(args.vocab_size, seq_len, cfg.seed)
                cost.counting = True
                if cfg.pp > 1:
                    self._pipeline_step(world, stages, forward, batches, seq_len, args.dim)
                else:
                    llama3.train_step(
                        forward, data, batches, 0, StepTimer(rt), rt.device.torch, 1, None
                    )
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        except (RuntimeError, ValueError, AssertionError) as exc:
            message = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            return {**found, "fault": "shape", "module": where.module, "error": message[:400]}
        peak = tracker.get_tracker_snapshot("peak")
        by_part: dict[str, int] = defaultdict(int)
        for device_parts in peak.values():
            for part, size in device_parts.items():
                if part != "Total":  # the rest are MemTracker's _MemRefType, str enums
                    by_part[PARTS.get(str(getattr(part, "value", part)), "temporaries")] += size
        return {
            **found,
            "peak": dict(by_part),
            "collectives": [
                {"op": op, "group": group, "count": count, "bytes": size}
                for (op, group), (count, size) in sorted(cost.collectives.items())
            ],
            "compute_s": cost.compute_s,
            "network_s": cost.network_s,
        }

    def _pipeline_step(self, world, stages, forward, batches, seq_len: int, dim: int) -> None:
        """This rank's part of one step of torch's own schedule: its actions in order, each
        stage's forward or backward (FSDP's gradient sync held to the last, as the schedule
        holds it). What its neighbours would send arrives in receive buffers, one per
        micro-batch for activations (a stage after the first) and for gradients (a stage before
        the last), held for the pipeline's life as PipelineStage holds them."""
        cfg = self.cfg
        pp = world["pp"]
        microbatches = batches.accumulation
        built = pipeline.build(stages, pp, cfg.pp_schedule, microbatches, "cpu")
        by_index = {stage.stage_index: stage for stage in built.stages}
        local = seq_len // cfg.cp
        hidden = (batches.batch_size, local // cfg.tp if cfg.tp > 1 else local, dim)
        tokens = torch.zeros(batches.batch_size, local, dtype=torch.long)

        def buffers(wanted: bool) -> list[torch.Tensor]:
            return [
                torch.empty(hidden, dtype=self.dtype) for _ in range(microbatches if wanted else 0)
            ]

        received = {i: buffers(not s.is_first) for i, s in by_index.items()}
        gradients = {i: buffers(not s.is_last) for i, s in by_index.items()}
        kept: dict[tuple[int, int], tuple] = {}
        backwards: dict[int, int] = defaultdict(int)
        for index, kind, micro in actions(built, pp.get_local_rank(), microbatches):
            stage = by_index[index]
            if kind == _ComputationType.FORWARD:
                inputs = (
                    tokens
                    if stage.is_first
                    else received[index][micro].detach().requires_grad_(True)
                )
                with loss_context(cfg.tp):
                    out = stage.submod(inputs)
                    if stage.is_last:
                        out = pipeline.token_loss(out, tokens)
                kept[(index, micro)] = (inputs, out)
            elif kind == _ComputationType.FULL_BACKWARD:
                inputs, out = kept.pop((index, micro))
                grads = None if stage.is_last else (gradients[index][micro],)
                backwards[index] += 1
                with loss_context(cfg.tp):
                    stage.backward_maybe_with_nosync(
                        "full",
                        {
                            "stage_output": out if stage.is_last else (out,),
                            "output_grads": grads,
                            "input_values": () if stage.is_first else (inputs,),
                        },
                        last_backward=backwards[index] == microbatches,
                    )
            elif kind == _ComputationType.REDUCE_GRAD:
                stage.perform_reduce_grad(microbatches)


def actions(built: pipeline.Pipeline, pp_rank: int, microbatches: int) -> list[tuple]:
    """(stage index, F/B/REDUCE_GRAD, micro-batch) in the order this pipeline rank runs them:
    a looped schedule's own `pipeline_order`; for one stage a rank, the order its
    `_step_microbatches` runs (whose `pipeline_order`, drawn for display, is not it: torch 2.13
    numbers the last stage's micro-batches from 1 there): GPipe every forward then every
    backward, 1F1B min(M, stages - stage) forwards, then a backward and a forward in turn."""
    schedule = built.schedule
    F, B = _ComputationType.FORWARD, _ComputationType.FULL_BACKWARD
    if isinstance(schedule, PipelineScheduleMulti):
        return [
            (a.stage_index, a.computation_type, a.microbatch_index)
            for a in schedule.pipeline_order[pp_rank]
            if a is not None
        ]
    stage = built.stages[0].stage_index
    if isinstance(schedule, ScheduleGPipe):
        order = [(F, m) for m in range(microbatches)] + [(B, m) for m in range(microbatches)]
    else:
        warmup = min(microbatches, built.stages[0].num_stages - stage)
        order = [(F, m) for m in range(warmup)]
        for m in range(microbatches):
            order.append((B, m))
            if warmup + m < microbatches:
                order.append((F, warmup + m))
    return [(stage, kind, m) for kind, m in order] + [(stage, _ComputationType.REDUCE_GRAD, None)]


class Where:
    """The module a forward or backward is in when it fails (its qualified name)."""

    def __init__(self, model: nn.Module):
        self.module = ""
        self._names = {id(m): n or "model" for n, m in model.named_modules()}

    def __enter__(self):
        def note(module, *_):
            self.module = self._names.get(id(module), type(module).__name__)

        self._handles = [
            nn.modules.module.register_module_forward_pre_hook(note),
            nn.modules.module.register_module_full_backward_pre_hook(note),
        ]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()


def verify(request: dict[str, Any]) -> dict[str, Any]:
    """The report of `request` (planning/verification.py's): each pipeline stage's first rank,
    and its last where its shards differ (some dimension not split evenly), each checked in a
    process forked from this one (torch imported once), as many at once as there are CPUs; a
    last rank's shards only."""
    # eager: what compiling changes is kernels and time, not the layout (and under fake
    # tensors it would compile every block for nothing)
    cfg = dataclasses.replace(parse(llama3.Config, request["argv"]), compile=False)
    device = DeviceFigures(**request["device"])
    dtype = torch.bfloat16 if request["dtype"] == "bf16" else torch.float32
    world_size = request["world_size"]
    check = Check(cfg, world_size, request["ranks_per_node"], dtype, device)
    per_stage = world_size // cfg.pp
    firsts = [stage * per_stage for stage in range(cfg.pp)]
    forks = multiprocessing.get_context("fork")
    with (
        attention_kernel(request["attention"]),
        forks.Pool(min(len(firsts), os.cpu_count() or 1), maxtasksperchild=1) as pool,
    ):
        # chunksize given: with it unset, starmap divides by the pool's live workers, which
        # are none for a moment while maxtasksperchild replaces them
        ranks = pool.starmap(check.run, [(rank, True) for rank in firsts], chunksize=1)
        uneven = [
            first + per_stage - 1
            for first, found in zip(firsts, ranks, strict=True)
            if per_stage > 1 and not all(s["even"] for s in found["shards"].values())
        ]
        # FSDP pads every shard to the first's size: the last rank's memory is the first's,
        # its shapes are what may differ.
        ranks += pool.starmap(check.run, [(rank, False) for rank in uneven], chunksize=1)
    for found in ranks:
        stage = found["rank"] // per_stage
        place = "first" if found["rank"] % per_stage == 0 else "last"
        found["kind"] = f"{place} rank" + (f" of pp rank {stage}" if cfg.pp > 1 else "")
    return {"ranks": ranks, "torch": torch.__version__}


if __name__ == "__main__":
    given = json.load(sys.stdin)  # a request, or a list of them (torch imported once for all)
    json.dump([verify(r) for r in given] if isinstance(given, list) else verify(given), sys.stdout)
