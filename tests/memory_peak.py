"""Run under torchrun: for each case (the trainer's options; cases separated by `--`), the llama3
trainer's own model and steps for two steps on CPU, and print the peak of live tensor bytes on
rank 0 (a pipeline's first stage, its busiest), from the profiler's allocation events (every
allocation and free of torch's CPU allocator, in order): one JSON line per case, in order. The
cases share one process group: a torchrun per case would start its ranks (and import torch) again.
A case after the first leaves out what a process allocates once (2-3 MB here: 83.1 against 85.8
MB alone for 2 ranks, full recompute, chunks of 64)."""

from __future__ import annotations

import dataclasses
import gc
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from mmm_orch.runtime import dist as runtime_dist
from mmm_orch.runtime.data import GlobalBatch, SyntheticTokens
from mmm_orch.runtime.loop import StepTimer, mesh
from mmm_orch.runtime.options import parse
from mmm_orch.trainers import pipeline
from mmm_orch.trainers.llama3 import Config, build_model, resolve, train_step


def peak_bytes(argv: list[str], rt: runtime_dist.Runtime) -> int:
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
    live = peak = 0
    for event in sorted((e for e in prof.profiler.kineto_results.events()
                         if e.name() == "[memory]"), key=lambda e: e.start_ns()):
        live += event.nbytes()
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
for case in cases(sys.argv[1:]):
    peak = peak_bytes(case, rt)
    gc.collect()  # nothing of this case is freed inside the next one's window
    if rt.is_main:
        print(json.dumps({"peak_bytes": peak}), flush=True)
runtime_dist.teardown()
