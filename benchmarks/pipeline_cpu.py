"""The pipeline's cost on CPU (gloo, 4 ranks): the llama3 trainer's step time with dp4 against
dp2 x pp2 (1F1B and GPipe) and pp4 (interleaved 1F1B), the same model, global batch and samples;
and the share of the pipelined step beyond dp4's (1 - t_dp4 / t_pp: the bubble, with the
stages' sends and receives) beside the schedule's theory, (P - 1) / (M + P - 1) for 1F1B.

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
    out = Path(tempfile.mkdtemp(prefix="mmm-pp-bench-"))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
               "-m", "mmm_orch.trainers.llama3", "--config", "debug", "--n-layers", "8",
               "--seq-len", "128", "--batch-size", "1", "--global-batch", str(global_batch),
               "--dtype", "fp32", "--steps", str(steps), "--output-dir", str(out),
               "--run-name", "b", *layout]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())}
    subprocess.run(command, check=True, capture_output=True, env=env, cwd=out)
    records = [json.loads(line) for line in (out / "b" / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["dt"] for r in records if r["event"] == "step" and r["step"] > 2)


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
    print("| layout | median step s (per repeat) | median | beyond dp4 | 1F1B theory |")
    print("|---|---|---|---|---|")
    for name, values in times.items():
        stages = LAYOUTS[name][1]
        micro = global_batch // (4 // stages)
        median = statistics.median(values)
        theory = (stages - 1) / (micro + stages - 1) if stages > 1 else 0.0
        shown = ", ".join(f"{v:.3f}" for v in values)
        print(f"| {name} | {shown} | {median:.3f} | {1 - base / median:.1%} | {theory:.1%} |")


if __name__ == "__main__":
    main()
