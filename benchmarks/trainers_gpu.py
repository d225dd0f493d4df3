"""GPU benchmark: our llama3 trainer against torchtitan on one GPU, the same model (Llama 3 8B's
dimensions, fewer layers so that it fits one device), batch, sequence length, bf16, activation
checkpointing of every other block, SDPA attention, synthetic tokens; eager, then with
torch.compile. Each side runs the way it ships on one GPU, both the same way: fp32 parameters
without FSDP, bf16 autocast over the forward and the loss.

    python benchmarks/trainers_gpu.py --layers 8 --seq-len 8192 --batch 1 --runs 3
    python benchmarks/trainers_gpu.py ... --base /path/to/an/older/checkout   # a third side
    python benchmarks/trainers_gpu.py --profile mmm-orch:eager,torchtitan:compile  # kernels

torchtitan (0.2.2 for torch 2.11; its side is benchmarks/torchtitan_llama3.py) must be
importable. Runs alternate between the sides; each run's first `--skip` steps (compilation,
allocator warm-up) are left out and the median of the rest is kept. MFU is recomputed for both
from tokens/s with one count (6 per non-embedding parameter + 12·layers·dim·seq per token; the
same as both trainers log) and the device's dense bf16 peak. Results: $OUT, else
benchmarks/results/ (trainers_gpu.json; profiles.json with trace_<side>_<mode>.json.gz).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TORCHTITAN_STEP = re.compile(r"step:\s*(\d+).*?tps:\s*([\d,]+)")
KERNEL_KINDS = [  # first match wins: where a step's GPU time goes
    ("attention", re.compile(r"flash|fmha|attention", re.I)),
    ("matmul", re.compile(r"gemm|nvjet|xmma|cutlass|wgmma|cublas", re.I)),
    ("collective", re.compile(r"nccl", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor", re.I)),
    ("compiled (triton)", re.compile(r"^triton_")),
    ("copy / cast", re.compile(r"copy|cast|memcpy|memset|cat_", re.I)),
    ("reduction", re.compile(r"reduce|norm|softmax|logsumexp", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled", re.I)),
]


class Side:
    """How one trainer is started and where its per-step tokens/s come from."""

    def __init__(self, name: str, args: argparse.Namespace, code: Path | None = None):
        self.name, self.args, self.code = name, args, code

    def command(self, compile_: bool, steps: int, work: Path, profile_at: int = 0) -> list[str]:
        a = self.args
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=1"]
        if self.name == "torchtitan":
            cmd = [*torchrun, "-m", "torchtitan.train",
                   "--experimental.custom_import", "torchtitan_llama3",
                   "--model.name", "llama3_bench", "--model.flavor", "8B_bench",
                   "--training.seq_len", str(a.seq_len), "--training.local_batch_size",
                   str(a.batch), "--training.steps", str(steps), "--lr_scheduler.warmup_steps",
                   "2", "--activation_checkpoint.mode", "selective",
                   "--activation_checkpoint.selective_ac_option", "2", "--metrics.log_freq", "1",
                   "--job.dump_folder", str(work)]
            if compile_:
                cmd += ["--compile.enable"]
            if profile_at:
                cmd += ["--profiling.enable_profiling", "--profiling.profile_freq",
                        str(profile_at), "--profiling.save_traces_folder", "traces"]
            return cmd
        entry = [str(HERE / "profile_ours.py"), str(profile_at)] if profile_at else \
            ["-m", "mmm_orch.trainers.llama3"]
        cmd = [*torchrun, *entry, "--config", "8b", "--n-layers", str(a.layers),
               "--seq-len", str(a.seq_len), "--batch-size", str(a.batch), "--steps", str(steps),
               "--warmup-steps", "2", "--ac", "every_other", "--dtype", "bf16",
               "--output-dir", str(work), "--run-name", "run"]
        return cmd + (["--compile"] if compile_ else [])

    def env(self) -> dict[str, str]:
        path = [str(HERE)] if self.name == "torchtitan" else [str(self.code or ROOT)]
        return {**os.environ, "MMM_BENCH_LAYERS": str(self.args.layers),
                "PYTHONPATH": os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")])}

    def run(self, compile_: bool, steps: int, profile_at: int = 0) -> tuple[list, str, Path]:
        """(per-step (step, tokens/s) rows, the run's output, its work directory)."""
        work = Path(tempfile.mkdtemp(prefix=f"bench-{self.name}-"))
        cmd = self.command(compile_, steps, work, profile_at)
        proc = subprocess.run(cmd, cwd=work, env=self.env(), capture_output=True, text=True,
                              timeout=self.args.run_timeout)
        log = ANSI.sub("", proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"{self.name} exit {proc.returncode}:\n{log[-3000:]}")
        if self.name == "torchtitan":
            rows = [(int(m[1]), float(m[2].replace(",", ""))) for m in TORCHTITAN_STEP.finditer(log)]
        else:
            lines = (work / "run" / "metrics.jsonl").read_text().splitlines()
            rows = [(r["step"], r["tokens_per_s"]) for r in map(json.loads, lines)
                    if r["event"] == "step"]
        return rows, log, work


def flops_per_token(layers: int, seq_len: int) -> float:
    """Llama 3 8B's training FLOPs per token at `layers` layers (runtime/flops.py's count)."""
    sys.path.insert(0, str(ROOT))
    from mmm_orch.models.llama3.args import PRESETS
    from mmm_orch.runtime.flops import transformer_flops_per_token

    m = PRESETS["8b"].model
    params = layers * m.block_params + 2 * m.vocab_size * m.dim + m.dim
    return transformer_flops_per_token(params, m.vocab_size * m.dim, layers, m.n_heads,
                                       m.head_dim, seq_len)


def peak_flops(name: str) -> float | None:
    sys.path.insert(0, str(ROOT))
    from mmm_orch.runtime.flops import peak_flops as peak

    return peak(name)


def measure(sides: list[Side], args, device: str, report: dict, save) -> None:
    peak, fpt = peak_flops(device), flops_per_token(args.layers, args.seq_len)
    for mode in args.modes:
        for run in range(args.runs):
            order = sides[run % len(sides):] + sides[:run % len(sides)]  # alternate who is first
            for side in order:
                if side.name.endswith("base") and run >= args.base_runs:
                    continue
                if time.monotonic() > args.deadline:
                    report["skipped"].append(f"{mode} run {run + 1} {side.name}: out of time")
                    continue
                started = time.monotonic()
                try:
                    rows, _, work = side.run(mode == "compile", args.steps)
                    shutil.rmtree(work, ignore_errors=True)
                except Exception as exc:
                    report["errors"].append(f"{mode} {side.name}: {exc}")
                    save()
                    continue
                kept = [tps for step, tps in rows if step > args.skip]
                tps = statistics.median(kept)
                row = {"mode": mode, "run": run + 1, "trainer": side.name,
                       "steps_measured": len(kept), "tokens_per_s": round(tps),
                       "mfu_pct": round(100 * fpt * tps / peak, 2) if peak else None,
                       "spread_pct": round(100 * (max(kept) - min(kept)) / tps, 1),
                       "wall_s": round(time.monotonic() - started, 1)}
                report["runs"].append(row)
                print(json.dumps(row), flush=True)
                save()
    summary = collections.defaultdict(list)
    for row in report["runs"]:
        summary[(row["mode"], row["trainer"])].append(row["tokens_per_s"])
    report["summary"] = [{"mode": mode, "trainer": name, "runs": len(values),
                          "tokens_per_s_median": statistics.median(values),
                          "mfu_pct": round(100 * fpt * statistics.median(values) / peak, 2)
                          if peak else None}
                         for (mode, name), values in summary.items()]


def kernel_summary(trace: Path) -> dict:
    """The profiled step's GPU kernels from a Chrome trace: time by kind, the top kernels, and
    how much of the step's wall time the GPU was busy."""
    events = json.loads(trace.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    by_kind, by_name = collections.Counter(), collections.Counter()
    counts = collections.Counter()
    for k in kernels:
        name = k["name"]
        kind = next((kind for kind, rx in KERNEL_KINDS if rx.search(name)), "other")
        by_kind[kind] += k["dur"] / 1000
        by_name[name[:120]] += k["dur"] / 1000
        counts[name[:120]] += 1
    busy = sum(by_kind.values())
    wall = max((s["dur"] for s in steps), default=0) / 1000
    return {"step_wall_ms": round(wall, 1), "gpu_busy_ms": round(busy, 1),
            "kernels": len(kernels),
            "by_kind_ms": {k: round(v, 1) for k, v in by_kind.most_common()},
            "top": [{"ms": round(v, 2), "calls": counts[n], "kernel": n}
                    for n, v in by_name.most_common(25)]}


def profile(sides: dict[str, Side], args, report: dict, save, out: Path) -> None:
    at = args.profile_step
    for pick in args.profile:
        name, mode = pick.split(":")
        if time.monotonic() > args.deadline:
            report["skipped"].append(f"profile {pick}: out of time")
            continue
        try:
            _, log, work = sides[name].run(mode == "compile", at, profile_at=at)
            trace = next(p for p in sorted(work.rglob("*.json")) if "trace" in str(p))
            summary = kernel_summary(trace)
            # what the compiler said (recompilations, graph breaks, fallbacks), if anything
            summary["compiler_said"] = [line[:300] for line in log.splitlines()
                                        if re.search(r"recompil|graph break|does not support|"
                                                     r"fall ?back", line, re.I)][:20]
            report["profiles"][pick] = summary
            with open(trace, "rb") as src, gzip.open(out / f"trace_{name}_{mode}.json.gz",
                                                     "wb") as dst:
                shutil.copyfileobj(src, dst)
            shutil.rmtree(work, ignore_errors=True)
        except Exception as exc:
            report["errors"].append(f"profile {pick}: {type(exc).__name__}: {exc}")
        save()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8, help="8B dimensions, this many layers")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=4, help="warm-up steps left out")
    parser.add_argument("--runs", type=int, default=3, help="runs of each side and mode")
    parser.add_argument("--modes", default="eager,compile", type=lambda s: s.split(","))
    parser.add_argument("--base", default="", help="an older checkout: a third side")
    parser.add_argument("--base-runs", type=int, default=1)
    parser.add_argument("--profile", default=[], type=lambda s: s.split(","),
                        help="instead of timing: profile one step of these side:mode pairs, "
                             "e.g. mmm-orch:eager,torchtitan:compile")
    parser.add_argument("--profile-step", type=int, default=7)
    parser.add_argument("--run-timeout", type=float, default=300)
    parser.add_argument("--budget-s", type=float, default=1e9, help="start nothing after this")
    parser.add_argument("--name", default="", help="the results file's name (without .json)")
    args = parser.parse_args()
    args.deadline = time.monotonic() + args.budget_s
    import torch
    import torchtitan

    out = Path(os.environ.get("OUT") or HERE / "results")
    device = torch.cuda.get_device_name(0)
    sides = [Side("mmm-orch", args), Side("torchtitan", args)]
    if args.base:
        sides.append(Side("mmm-orch-base", args, Path(args.base)))
    name = (args.name or ("profiles" if args.profile else "trainers_gpu")) + ".json"
    report = {"shape": {"layers": args.layers, "seq_len": args.seq_len, "batch": args.batch,
                        "steps": args.steps, "skip": args.skip},
              "device": device, "torch": torch.__version__,
              "torchtitan": getattr(torchtitan, "__version__", "?"),
              "date": time.strftime("%Y-%m-%d"), "runs": [], "profiles": {}, "errors": [],
              "skipped": []}

    def save() -> None:
        (out / name).write_text(json.dumps(report, indent=2) + "\n")

    if args.profile:
        profile({side.name: side for side in sides}, args, report, save, out)
    else:
        measure(sides, args, device, report, save)
    save()
    print(json.dumps({k: report[k] for k in ("summary", "errors", "skipped") if k in report},
                     indent=1))


if __name__ == "__main__":
    main()
