"""GPU benchmark: our llama3 trainer against torchtitan on one GPU, same model shape (Llama 3 8B
dimensions, fewer layers so it fits on one device), batch, sequence length, bf16, FSDP2,
activation checkpointing of every other block and torch.compile. Reports the median tokens/s per device and
MFU over the steps after the warm-up ones.

    python benchmarks/trainers_gpu.py --layers 8 --seq-len 8192 --batch 1 --steps 30 \
        --torchtitan-repo ~/src/torchtitan        # a checkout at the installed torchtitan's tag

torchtitan needs its repository's test assets (tokenizer, c4 sample), which the wheel does not
ship; give --torchtitan-repo '' to run our side only. Results go to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TORCHTITAN_STEP = re.compile(r"step:\s*(\d+).*?tps:\s*([\d,]+).*?mfu:\s*([\d.]+)%")


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
            *args]


def summarize(name: str, rows: list[tuple[int, float, float]], skip: int) -> dict:
    """rows: (step, tokens/s per device, MFU %); the first `skip` steps (compile, warm-up) are
    left out of the medians."""
    kept = [r for r in rows if r[0] > skip]
    if not kept:
        raise SystemExit(f"{name}: no steps after the first {skip} were logged")
    return {"trainer": name, "steps_measured": len(kept),
            "tokens_per_s": statistics.median(r[1] for r in kept),
            "mfu_pct": statistics.median(r[2] for r in kept)}


def run_ours(args: argparse.Namespace) -> dict:
    out = Path(tempfile.mkdtemp(prefix="mmm-bench-gpu-"))
    cmd = torchrun("-m", "mmm_orch.trainers.llama3", "--config", "8b", "--n-layers", str(args.layers),
                   "--seq-len", str(args.seq_len), "--batch-size", str(args.batch),
                   "--steps", str(args.steps), "--warmup-steps", "5", "--ac", "every_other",
                   "--compile", "--dtype", "bf16", "--output-dir", str(out), "--run-name", "gpu")
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    records = [json.loads(line) for line in (out / "gpu" / "metrics.jsonl").read_text().splitlines()]
    rows = [(r["step"], r["tokens_per_s"], r["mfu"]) for r in records if r["event"] == "step"]
    return {**summarize("mmm-orch", rows, args.skip), "command": " ".join(cmd[1:])}


def run_torchtitan(args: argparse.Namespace) -> dict:
    env = {**os.environ, "MMM_BENCH_LAYERS": str(args.layers), "MMM_BENCH_BATCH": str(args.batch),
           "MMM_BENCH_SEQ_LEN": str(args.seq_len), "MMM_BENCH_STEPS": str(args.steps),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"),
                                                       os.environ.get("PYTHONPATH")]))}
    cmd = torchrun("-m", "torchtitan.train", "--module", "torchtitan_llama3",
                   "--config", "llama3_8b_bench")
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=args.torchtitan_repo, env=env, capture_output=True, text=True)
    log = ANSI.sub("", proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"torchtitan failed (exit {proc.returncode}):\n{log[-4000:]}")
    rows = [(int(m[1]), float(m[2].replace(",", "")), float(m[3]))
            for m in TORCHTITAN_STEP.finditer(log)]
    return {**summarize("torchtitan", rows, args.skip), "command": " ".join(cmd[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8, help="8B dimensions, this many layers")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--skip", type=int, default=10, help="warm-up steps left out")
    parser.add_argument("--torchtitan-repo", default="", help="torchtitan checkout; '' skips it")
    args = parser.parse_args()
    import torch

    shape = {"layers": args.layers, "seq_len": args.seq_len, "batch": args.batch,
             "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    results = [run_ours(args)] + ([run_torchtitan(args)] if args.torchtitan_repo else [])
    report = {"shape": shape, "results": results}
    (ROOT / "benchmarks" / "results" / "trainers_gpu.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
