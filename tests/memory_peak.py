"""Run under torchrun: for each case (a trainer's name, then its options; cases separated by
`--`), the trainer's model and steps for two steps on CPU, and print the peak of live tensor
bytes on rank 0 (a pipeline's first stage, its busiest), from the profiler's allocation events
(every allocation and free of torch's CPU allocator, matched by address: peak_of says why),
with rank 0's parameter shards (their local shapes): one JSON line per case, in order. The
llama3 trainer runs its own steps (a pipeline's real schedule, its stages sending to each
other); the others their `layout` (what --verify checks), materialized and stepped for real.
The cases share one process group: a torchrun per case would start its ranks (and import torch)
again. A case after the first leaves out what a process allocates once (2-3 MB here: 83.1
against 85.8 MB alone for 2 ranks, full recompute, chunks of 64)."""

from __future__ import annotations

import dataclasses
import gc
import importlib
import json
import sys

import torch
from torch.distributed.tensor import DTensor
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from mmm_orch.runtime import dist as runtime_dist
from mmm_orch.runtime.data import GlobalBatch, SyntheticTokens
from mmm_orch.runtime.loop import StepTimer, mesh
from mmm_orch.runtime.options import parse
from mmm_orch.trainers import pipeline
from mmm_orch.trainers.llama3 import Config, build_model, resolve, train_step


def peak_bytes(argv: list[str], rt: runtime_dist.Runtime) -> tuple[int, dict[str, list[int]]]:
    """The llama3 trainer's peak and rank 0's shards."""
    cfg = parse(Config, argv)
    args, batch_size, seq_len, _, ac = resolve(cfg)
    world = mesh(rt, cfg.tp, cfg.pp, cfg.cp)
    batches = GlobalBatch.of(
        cfg.global_batch, batch_size, world["dp"].size(), world["dp"].get_local_rank()
    )
    data = SyntheticTokens(args.vocab_size, seq_len, cfg.seed)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model, stages, forward, _ = build_model(cfg, args, seq_len, ac, rt, world)
        if cfg.pp > 1:
            staged = pipeline.build(
                stages, world["pp"], cfg.pp_schedule, batches.accumulation, rt.device.torch
            )
            forward = dataclasses.replace(forward, staged=staged)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        timer = StepTimer(rt)
        for step in range(2):
            train_step(forward, data, batches, step * batches.size, timer, rt.device.torch,
                       step + 1, None)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return peak_of(allocations(prof)), local_shapes(model)


def layout_peak(trainer: str, argv: list[str], rt) -> tuple[int, dict[str, list[int]]]:
    """The peak and rank 0's shards of a trainer's `layout`, run for real: its model
    materialized (uninitialized: the values change no size) and two steps of it."""
    module = importlib.import_module(f"mmm_orch.trainers.{trainer}")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        layout = module.layout(parse(module.Config, argv), rt)
        layout.model.to_empty(device=rt.device.torch)
        optimizer = torch.optim.AdamW(layout.model.parameters(), lr=1e-4)
        for _ in range(2):
            layout.step()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return peak_of(allocations(prof)), local_shapes(layout.model)


def local_shapes(model: torch.nn.Module) -> dict[str, list[int]]:
    return {name: list((p.to_local() if isinstance(p, DTensor) else p).shape)
            for name, p in model.named_parameters()}


COLLECTIVES = ("c10d::", "_c10d_functional::", "gloo:")


def allocations(prof) -> list[tuple[int, int, int, bool]]:
    """Every allocation (size > 0) and free (size < 0) the profiler recorded, in time order:
    (time, bytes, address, made inside a collective)."""
    found = []

    def walk(event, in_collective: bool) -> None:
        in_collective = in_collective or event.name.startswith(COLLECTIVES)
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            found.append((event.start_time_ns, fields.alloc_size, fields.ptr, in_collective))
        for child in event.children:
            walk(child, in_collective)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, False)
    return sorted(found)


def peak_of(events: list[tuple[int, int, int, bool]]) -> int:
    """The peak of live bytes, an allocation live from its record to its free's. Gloo loses
    some frees: it drops a collective's tensors on its worker thread outside the profiler's
    reach (ProcessGroupGloo's runLoop resets the work after its run, where the thread's profiler
    state is off), and its reduce-scatter is an all-reduce of a clone of the input. A block
    allocated inside a collective whose free is never recorded (its address handed out again,
    or never freed by the end) is left out: a GPU's allocator counts frees on every thread, and
    NCCL reduce-scatters in place. Another block whose free went unrecorded (a tensor a send
    held last, dropped on gloo's thread) is live until its address is handed out again."""
    unfreed, holder = set(), {}
    for index, (_, size, address, _) in enumerate(events):
        if size > 0:
            if address in holder:  # handed out again: the free before went unrecorded
                unfreed.add(holder[address])
            holder[address] = index
        else:
            holder.pop(address, None)
    unfreed |= set(holder.values())
    live, sizes, peak = 0, {}, 0
    for index, (_, size, address, in_collective) in enumerate(events):
        if size > 0:
            if in_collective and index in unfreed:
                continue
            live += size - sizes.get(address, 0)  # a block handed out again was freed by then
            sizes[address] = size
        elif address in sizes:
            live -= sizes.pop(address)
        peak = max(peak, live)
    return peak


def cases(argv: list[str]) -> list[list[str]]:
    found: list[list[str]] = [[]]
    for arg in argv:
        if arg == "--":
            found.append([])
        else:
            found[-1].append(arg)
    return found


rt = runtime_dist.setup()
for trainer, *case in cases(sys.argv[1:]):
    peak, shards = peak_bytes(case, rt) if trainer == "llama3" else layout_peak(trainer, case, rt)
    gc.collect()  # nothing of this case is freed inside the next one's window
    if rt.is_main:
        print(json.dumps({"peak_bytes": peak, "shards": shards}), flush=True)
runtime_dist.teardown()
