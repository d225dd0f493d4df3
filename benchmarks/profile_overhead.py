"""What `--profile` costs: the llama3 trainer's step time with profiling off against the same
trainer before profiling existed (a checkout of BASE), and with `--profile torch` outside its
window (the steps after it), on one rank, runs alternating.

    python benchmarks/profile_overhead.py --base c17dc3e [--repeats 3] [--steps 12]
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
AFTER_WINDOW = 7  # the window is steps 3-5 (the profiler starts at 2); steps from 7 are outside


def median_step_ms(source: Path, steps: int, more: list[str]) -> float:
    out = Path(tempfile.mkdtemp(prefix="mmm-profile-bench-"))
    command = [sys.executable, "-m", "mmm_orch.trainers.llama3", "--config", "debug", "--steps",
               str(steps), "--seq-len", "512", "--dtype", "fp32", "--output-dir", str(out),
               "--run-name", "b", *more]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(source)}
    subprocess.run(command, check=True, capture_output=True, env=env, cwd=out)
    records = [json.loads(line) for line in (out / "b" / "metrics.jsonl").read_text().splitlines()]
    return 1000 * statistics.median(
        r["dt"] for r in records if r["event"] == "step" and r["step"] >= AFTER_WINDOW
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="a commit before profiling")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    options = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mmm-profile-base-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), options.base],
                   check=True, capture_output=True)  # fmt: skip
    runs = {
        f"before profiling ({options.base})": (base, []),
        "--profile off": (ROOT, []),
        "--profile torch, steps after its window": (ROOT, ["--profile", "torch", "--profile-steps", "3:5"]),
    }  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in runs}
    try:
        for _ in range(options.repeats):
            for name, (source, more) in runs.items():
                times[name].append(median_step_ms(source, options.steps, more))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)])
    print("| run | median step ms (per repeat) | median |")
    print("|---|---|---|")
    for name, values in times.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"| {name} | {shown} | {statistics.median(values):.1f} |")


if __name__ == "__main__":
    main()
