"""What `--profile` costs: the llama3 trainer's step time with profiling off against the same
trainer before profiling existed (a checkout of BASE), and with `--profile torch` outside its
window (the steps after it), on one rank, runs alternating; and, below the noise of a step, what
the code profiling adds to a step when off, counted in nanoseconds: a range (`region`) and the
step clock's two hooks, as many as a trainer's step runs.

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
import time
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


def off_ns_per_step(calls: int = 1_000_000) -> tuple[float, float]:
    """Nanoseconds of one `with region(...)` and of the step clock's two hooks with profiling off
    (the best of 5 rounds of `calls`), and of a step of the llama3 trainer: 4 ranges, 2 hooks."""
    from mmm_orch.runtime import profiling

    def best(body) -> float:
        rounds = []
        for _ in range(5):
            start = time.perf_counter_ns()
            body()
            rounds.append((time.perf_counter_ns() - start) / calls)
        return min(rounds)

    def ranges() -> None:
        for _ in range(calls):
            with profiling.region("forward"):
                pass

    def hooks() -> None:
        for _ in range(calls):
            profiling.step_opened()
            profiling.step_closed()

    def empty() -> None:
        for _ in range(calls):
            pass

    loop = best(empty)
    one_range, both_hooks = best(ranges) - loop, best(hooks) - loop
    return one_range, 4 * one_range + both_hooks


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
    one_range, per_step = off_ns_per_step()
    off_ms = statistics.median(times["--profile off"])
    print(f"\noff: a range {one_range:.0f} ns; a step's ranges and hooks {per_step:.0f} ns, "
          f"{100 * per_step / (off_ms * 1e6):.6f}% of the median step")


if __name__ == "__main__":
    main()
