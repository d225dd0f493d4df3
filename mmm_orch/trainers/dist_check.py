"""Preflight for a new allocation: can every rank reach every other, and how fast?

1. Join the process group; print rank, local rank, node, device and backend of every rank.
2. All-reduce a known tensor (rank + 1 on each rank) and check the sum on every rank.
3. Time all-reduce at a few message sizes: latency and bus bandwidth (as nccl-tests defines it).
Prints `[dist_check] PASS` on rank 0 and exits 0 only when every rank's check passed.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from mmm_orch.injob.protocol import DIST_CHECK_JSON
from mmm_orch.options.run import option
from mmm_orch.runtime import dist as runtime_dist
from mmm_orch.runtime.metrics import say
from mmm_orch.runtime.options import parse


@dataclass(frozen=True)
class Config:
    """torch.distributed preflight: all-reduce correctness, latency and bandwidth."""

    sizes: str = option(
        "4,65536,1048576,16777216",
        "all-reduce message sizes in bytes, comma-separated",
        pattern=r"[1-9][0-9]{0,10}(,[1-9][0-9]{0,10}){0,31}",
    )
    iters: int = option(10, "timed all-reduces per size", ge=1, le=100000)
    warmup: int = option(2, "untimed all-reduces per size", ge=0, le=100000)


def check_allreduce(rt: runtime_dist.Runtime) -> bool:
    tensor = torch.full((1024,), float(rt.rank + 1), device=rt.device.torch)
    dist.all_reduce(tensor)
    expected = rt.world_size * (rt.world_size + 1) / 2
    ok = bool(torch.all(tensor == expected))
    say(
        f"[dist_check] rank={rt.rank} all_reduce {'OK' if ok else 'FAILED'} "
        f"(got {tensor[0].item():g}, expected {expected:g})"
    )
    return ok


def time_allreduce(rt: runtime_dist.Runtime, nbytes: int, iters: int, warmup: int) -> dict:
    tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=rt.device.torch)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    rt.device.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    rt.device.synchronize()
    seconds = (time.perf_counter() - start) / iters
    size = tensor.numel() * 4
    n = rt.world_size
    bus_factor = 2 * (n - 1) / n if n > 1 else 1.0  # ring all-reduce moves 2(n-1)/n of the data
    return {
        "bytes": size,
        "latency_us": seconds * 1e6,
        "algbw_gbps": size / seconds / 1e9,
        "busbw_gbps": size / seconds / 1e9 * bus_factor,
    }


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv)
    sizes = [int(s) for s in cfg.sizes.split(",") if s.strip()]
    rt = runtime_dist.setup()
    me = {
        "rank": rt.rank,
        "local_rank": rt.launch.local_rank,
        "node": rt.hostname,
        "device": str(rt.device.torch),
        "backend": rt.device.backend,
        "launcher": rt.launch.launcher,
        "python": sys.prefix,
    }
    ranks: list = [None] * rt.world_size
    dist.all_gather_object(ranks, me)
    if rt.is_main:
        for info in ranks:
            say("[dist_check] " + " ".join(f"{k}={v}" for k, v in info.items()))
    ok = check_allreduce(rt)
    results = [time_allreduce(rt, size, cfg.iters, cfg.warmup) for size in sizes]
    passed = torch.tensor([1 if ok else 0], device=rt.device.torch)
    dist.all_reduce(passed)
    all_ok = int(passed.item()) == rt.world_size
    if rt.is_main:
        for r in results:
            say(
                f"[dist_check] all_reduce bytes={r['bytes']} latency_us={r['latency_us']:.1f} "
                f"algbw_gbps={r['algbw_gbps']:.3f} busbw_gbps={r['busbw_gbps']:.3f}"
            )
        nodes = sorted({info["node"] for info in ranks})
        verdict = "PASS" if all_ok else "FAIL"
        say(
            f"[dist_check] {verdict} world={rt.world_size} nodes={','.join(nodes)} "
            f"backend={rt.device.backend}"
        )
        say(DIST_CHECK_JSON + json.dumps({"pass": all_ok, "ranks": ranks, "allreduce": results}))
    runtime_dist.teardown()
    return 0 if all_ok else 1


if __name__ == "__main__":
    runtime_dist.run_main(main)
