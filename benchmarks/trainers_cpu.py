"""CPU regression benchmark: steps/s of the llama3 trainer's debug config on 1 and 2 ranks
(torchrun, gloo), the median over steps after the first (which includes warm-up).

    python benchmarks/trainers_cpu.py [--steps 8] [--seq-len 512]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(ranks: int, steps: int, seq_len: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix="mmm-bench-llama3-"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           "-m", "mmm_orch.trainers.llama3", "--config", "debug", "--steps", str(steps),
           "--seq-len", str(seq_len), "--dtype", "fp32", "--output-dir", str(out), "--run-name", "b"]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": str(2 // ranks)})
    records = [json.loads(line) for line in (out / "b" / "metrics.jsonl").read_text().splitlines()]
    dts = [r["dt"] for r in records if r["event"] == "step"][1:]
    dt = statistics.median(dts)
    return {"ranks": ranks, "seq_len": seq_len, "batch_per_rank": 8, "median_step_s": dt,
            "steps_per_s": 1 / dt, "tokens_per_s": 8 * seq_len * ranks / dt}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    args = parser.parse_args()
    results = [run(ranks, args.steps, args.seq_len) for ranks in (1, 2)]
    (ROOT / "benchmarks" / "results" / "trainers_cpu.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
