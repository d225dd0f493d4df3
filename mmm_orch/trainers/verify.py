"""A trainer's layout checked before the queue, on a CPU: the trainer's own model, parallelized
as the job will (each trainer's `layout(cfg, rt)`: llama3's TP, context parallel, pipeline stages
and their schedule, activation checkpointing and FSDP2; fsdp_tp's TP and FSDP2; the ViT's and the
CNN's FSDP2), for one rank of each kind, at the job's world size, under fake tensors (no
parameter is allocated) and a fake process group (nothing is sent).

Each rank's step holds AdamW's states, as every step after the first does (made first by an
optimizer step over zero gradients). PyTorch's MemTracker takes the peak by part; a dispatch
mode of ours takes the collectives and their sizes, and the step's time by the roofline torch's
RuntimeEstimator uses (its operators' FLOP formulas and byte counts, the larger of compute and
memory time), with the device's figures from the machine's profile: RuntimeEstimator itself
asks CUDA for them, and the point is to need no GPU.

A rank kind is a pipeline stage's first rank, and its last where their shards differ (a
dimension FSDP or TP does not split evenly). Each is checked in a process of its own: a fake
process group's rank is its process's, and DTensor and the device mesh keep its groups for the
process's life. A pipeline rank runs its part of torch's own schedule (pipeline.rehearse).

    python -m mmm_orch.trainers.verify < request.json > report.json   (or lists of them)

The request and report are verification.py's (mmm_orch/planning/verification.py); a fault is in
the report, not an exit code: the planner says it, with the rank kind and the numbers."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import multiprocessing
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fake_collectives import CollectiveOp, collective_ops, sync_ops
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.distributed.tensor.placement_types import _StridedShard
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._runtime_estimation import _IGNORE_OPS, _VIEW_OPS, get_num_bytes
from torch.utils.flop_counter import flop_registry

from mmm_orch.injob.launch_env import LaunchEnv
from mmm_orch.models.llama3 import model as llama_model
from mmm_orch.runtime.device import Device
from mmm_orch.runtime.dist import Runtime
from mmm_orch.runtime.loop import adamw, classifier_loss
from mmm_orch.runtime.options import parse

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
def propagation_unseen() -> Iterator[None]:
    """DTensor's sharding propagation out of the check's sight. To find an operator's output
    shape it runs the operator on fake tensors of the whole (unsharded) shapes; in a job those
    are its own fake mode's and hold no memory, but under the check's fake mode it takes that
    one, and MemTracker and the roofline counted them: loss_parallel's backward showed two
    whole-vocabulary logits, 4 MiB too many at tp 2 on the debug model. Here it runs with the
    check's modes off, as in a job."""
    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def unseen(self, op_schema):
        with _disable_current_modes():
            return original(self, op_schema)

    ShardingPropagator._propagate_tensor_meta_non_cached = unseen  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original  # type: ignore[method-assign]


@contextmanager
def attention_kernel(kernel: str) -> Iterator[None]:
    """The models' attention as the job's device runs it: with "math", the math kernel alone
    (which keeps every head's probabilities for backward, as on a device without a fused
    training kernel); otherwise the CPU's own. The Llama model names its kernels itself
    (model.py's ATTENTION_KERNELS, which an outer sdpa_kernel would not override)."""
    if kernel != "math":
        yield
        return
    kept = llama_model.ATTENTION_KERNELS
    llama_model.ATTENTION_KERNELS = [SDPBackend.MATH]
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        llama_model.ATTENTION_KERNELS = kept


@dataclasses.dataclass
class Layout:
    """A trainer's rank as its job builds it (the trainer's `layout(cfg, rt)`): its model
    parallelized on the meta device, the TP degree and the data-parallel ranks (FSDP's) it
    splits over, and one training step's forwards and backwards over the job's micro-batches,
    run once the model is materialized under fake tensors (the optimizer's step is the
    check's)."""

    model: nn.Module
    step: Callable[[], None]
    tp: int = 1
    dp: int = 1


def classifier_layout(
    model: nn.Module, rt: Runtime, dp: int, batch: int, image: tuple[int, ...], classes: int, dtype
) -> Layout:
    """An image classifier's layout (the ViT's, the CNN's): its step a forward and backward
    on a batch of the job's shape, drawn at random (the synthetic images are drawn sample by
    sample, which fake tensors cannot)."""

    def step() -> None:
        images = torch.randn(batch, *image)
        labels = torch.randint(classes, (batch,))
        classifier_loss(model, rt, dtype, images, labels).backward()

    return Layout(model, step, dp=dp)


class StandIn(Device):
    """The job's device as a CPU under fake tensors stands in for it: it computes in bf16 where
    the job's does (the plan's compute dtype decides, not this CPU's features)."""

    @property
    def supports_bf16(self) -> bool:
        return True


def runtime(rank: int, world_size: int, ranks_per_node: int) -> Runtime:
    launch = LaunchEnv(rank, rank % ranks_per_node, world_size, ranks_per_node, "fake", "", 0)
    return Runtime(launch, StandIn("cpu", None, "fake"), "verify")


@dataclasses.dataclass
class Check:
    """One rank's check: the trainer (its module, with a `Config` and a `layout`), its options
    as the job's, the job's world and device."""

    trainer: str
    cfg: Any
    world_size: int
    ranks_per_node: int
    device: DeviceFigures

    def run(self, rank: int, step: bool = True) -> dict[str, Any]:
        """The rank's report: its shards, and with `step` its peak by part, collectives and step
        time."""
        join(rank, self.world_size)
        rt = runtime(rank, self.world_size, self.ranks_per_node)
        layout = importlib.import_module(self.trainer).layout(self.cfg, rt)
        model = layout.model
        found: dict[str, Any] = {"rank": rank, "shards": shards(model)}
        left = unsharded(model, layout.tp, layout.dp)
        if left:
            return {**found, "fault": "unsharded", "modules": left}
        if not step:
            return found
        cost = StepCost(self.device, self.ranks_per_node)
        tracker = StepMemory()
        where = Where(model)
        try:
            with (
                propagation_unseen(),
                FakeTensorMode(allow_non_fake_inputs=True),
                where,
                tracker,
                cost,
            ):
                model.to_empty(device="cpu")
                optimizer = adamw(model.parameters(), rt, lr=1e-4)
                with_states(optimizer, model)
                cost.counting = True
                layout.step()
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
    trainer = importlib.import_module(request["trainer"])
    cfg = parse(trainer.Config, request["argv"])
    # in the job's compute dtype, and eager: what compiling changes is kernels and time, not
    # the layout (and under fake tensors it would compile every block for nothing)
    cfg = dataclasses.replace(
        cfg, dtype=request["dtype"], **({"compile": False} if hasattr(cfg, "compile") else {})
    )
    world_size = request["world_size"]
    check = Check(
        request["trainer"],
        cfg,
        world_size,
        request["ranks_per_node"],
        DeviceFigures(**request["device"]),
    )
    stages = getattr(cfg, "pp", 1)  # a trainer without a pipeline: one stage
    per_stage = world_size // stages
    firsts = [stage * per_stage for stage in range(stages)]
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
        found["kind"] = f"{place} rank" + (f" of pp rank {stage}" if stages > 1 else "")
    return {"ranks": ranks, "torch": torch.__version__}


if __name__ == "__main__":
    given = json.load(sys.stdin)  # a request, or a list of them (torch imported once for all)
    json.dump([verify(r) for r in given] if isinstance(given, list) else verify(given), sys.stdout)
