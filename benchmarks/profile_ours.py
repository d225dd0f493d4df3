"""The llama3 trainer as shipped, with torch.profiler over one step: what torchtitan's
`--profiling.profile_freq N` does for its side (three warm-up steps, then step N recorded),
so that trainers_gpu.py can lay the two kernel by kernel side by side.

    torchrun --nproc-per-node 1 benchmarks/profile_ours.py N <llama3 trainer options>

The Chrome trace goes to <output dir>/traces/step_N.json.
"""

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from mmm_orch.runtime import loop
from mmm_orch.trainers import llama3


def main() -> int:
    at, argv = int(sys.argv[1]), sys.argv[2:]
    out = Path(argv[argv.index("--output-dir") + 1]) / "traces"
    out.mkdir(parents=True, exist_ok=True)
    warmup = min(3, at - 1)
    profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                       schedule=schedule(wait=at - 1 - warmup, warmup=warmup, active=1),
                       on_trace_ready=lambda p: p.export_chrome_trace(str(out / f"step_{at}.json")))
    stop = loop.StepTimer.stop

    def stop_and_step(self):  # the trainer stops its timer once at the end of every step
        times = stop(self)
        profiler.step()
        return times

    loop.StepTimer.stop = stop_and_step
    with profiler:
        return llama3.main(argv)


if __name__ == "__main__":
    sys.exit(main())
