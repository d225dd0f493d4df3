"""The pipeline's cost on CPU (gloo, 4 ranks): the llama3 trainer's step time with dp4 against
dp2 x pp2 (1F1B and GPipe) and pp4 (interleaved 1F1B), the same model, global batch and samples;
and the bubble, measured inside the step (one more run of each layout under `--profile torch`,
every rank profiled: `mmm-orch profile`'s share of the schedule's time a stage waited on its
neighbour's transfer) beside the schedule's theory, (P - 1) / (M + P - 1) for 1F1B.

    python benchmarks/pipeline_cpu.py [--repeats 3] [--steps 8] [--microbatches 8]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mmm_orch.reporting.trace_summary import read, traces

LAYOUTS = {
    "dp4": ([], 1),
    "dp2 x pp2, 1F1B": (["--pp", "2"], 2),
    "dp2 x pp2, GPipe": (["--pp", "2", "--pp-schedule", "gpipe"], 2),
    "pp4, interleaved 1F1B": (["--pp", "4", "--pp-schedule", "interleaved_1f1b"], 4),
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def median_step_s(layout: list[str], steps: int, global_batch: int) -> float:
    out = run(layout, steps, global_batch)
    records = [json.loads(line) for line in (out / "b" / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["dt"] for r in records if r["event"] == "step" and r["step"] > 2)


def bubble_share(layout: list[str], steps: int, global_batch: int) -> float:
    """The ranks' mean share of the pipelined part of a step (forward, where the schedule runs,
    and the bubble) spent in the bubble, over profiled steps 4 to 6."""
    out = run([*layout, "--profile", "torch", "--profile-steps", "4:6", "--profile-ranks",
               "0,1,2,3"], steps, global_batch)
    ranks = [read(file, rank, host) for rank, (host, file) in traces(out / "b" / "profile").items()]
    bubble = sum(s.parts_ms["bubble"] for r in ranks for s in r.steps)
    return bubble / (bubble + sum(s.parts_ms["forward"] for r in ranks for s in r.steps))


def run(layout: list[str], steps: int, global_batch: int) -> Path:
    out = Path(tempfile.mkdtemp(prefix="mmm-pp-bench-"))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
               "-m", "mmm_orch.trainers.llama3", "--config", "debug", "--n-layers", "8",
               "--seq-len", "128", "--batch-size", "1", "--global-batch", str(global_batch),
               "--dtype", "fp32", "--steps", str(steps), "--output-dir", str(out),
               "--run-name", "b", *layout]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())}
    subprocess.run(command, check=True, capture_output=True, env=env, cwd=out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=8, help="a step's on each dp2 rank")
    options = parser.parse_args()
    global_batch = 2 * options.microbatches  # dp2 x pp2: M micro-batches of 1 on each dp rank
    times: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    for _ in range(options.repeats):
        for name, (layout, _stages) in LAYOUTS.items():
            times[name].append(median_step_s(layout, options.steps, global_batch))
    base = statistics.median(times["dp4"])
    print("| layout | median step s (per repeat) | median | vs dp4 | bubble measured | 1F1B theory |")
    print("|---|---|---|---|---|---|")
    for name, values in times.items():
        layout, stages = LAYOUTS[name]
        micro = global_batch // (4 // stages)
        median = statistics.median(values)
        theory = (stages - 1) / (micro + stages - 1) if stages > 1 else 0.0
        measured = bubble_share(layout, options.steps, global_batch) if stages > 1 else 0.0
        shown = ", ".join(f"{v:.3f}" for v in values)
        print(f"| {name} | {shown} | {median:.3f} | {base / median:.2f}x | {measured:.1%} "
              f"| {theory:.1%} |")


if __name__ == "__main__":
    main()
