"""What carrying a run across walltimes costs, measured.

1. `margin`: the margin the watchdog needs before the walltime, against the checkpoint's size:
   the fsdp_tp trainer on 2 CPU ranks (gloo, torchrun) at a few model sizes saves a DCP
   checkpoint every 2 steps; the margin it needs is twice the longest save (the watchdog's rule).
2. `gap`: on the live test schedulers, a chain of 1-minute links (tiny Llama 3, 20 s margin):
   from one link's end (the scheduler's end time) to the next link's start (the scheduler's start
   time) and to its first training step (its `resumed_step` marker).

    python benchmarks/long_runs.py margin
    sudo bash scripts/slurm-cluster.sh up && sudo bash scripts/pbs-server.sh up
    python benchmarks/long_runs.py gap [--machines slurm-local pbs-local]
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
RESULTS = ROOT / "benchmarks" / "results"
SIZES = [(256, 4), (512, 4), (1024, 4), (1024, 12), (2048, 8)]  # (dim, layers)


def margin() -> list[dict]:
    rows = []
    for dim, layers in SIZES:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                   "-m", "mmm_orch.trainers.fsdp_tp", "--tp", "1", "--dim", str(dim), "--n-layers",
                   str(layers), "--n-heads", "8", "--n-kv-heads", "4", "--vocab-size", "32000",
                   "--seq-len", "32", "--batch-size", "2", "--steps", "6", "--checkpoint-every", "2",
                   "--output-dir", str(out), "--run-name", "run", "--dtype", "fp32"]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-2000:])
            events = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
            saves = [e["save_s"] for e in events if e["event"] == "checkpoint"]
            step_dir = out / "run" / "checkpoints" / "step-6"
            size = sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file())
            rows.append({"dim": dim, "layers": layers, "checkpoint_mib": size / 2**20,
                         # fp32 weights and AdamW's two moments: 12 bytes a parameter
                         "params_m": size / 12 / 1e6,
                         "save_s_median": statistics.median(saves), "save_s_max": max(saves),
                         "margin_needed_s": 2 * max(saves)})
            print(rows[-1], flush=True)
    return rows


def gap(machines: list[str]) -> dict[str, list[dict]]:
    results = {}
    for machine in machines:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            specs = work / ".mmm-orch" / "workloads"
            specs.mkdir(parents=True)
            (specs / "llama_chain.yaml").write_text(
                "extends: llama3_debug\nname: llama_chain\n"
                "args: {config: debug, tiny: true, warmup_steps: 20}\n"
                "watchdog: {walltime_margin: '00:00:20'}\n")
            env = {**os.environ, "XDG_STATE_HOME": str(work / "state"),
                   "XDG_CACHE_HOME": str(work / "cache")}
            mmm = [sys.executable, "-m", "mmm_orch"]
            subprocess.run([*mmm, "submit", machine, "llama_chain", "--set", "steps=1200",
                            "--walltime", "00:01:00", "--chain", "4"], check=True, env=env, cwd=work)
            deadline = time.monotonic() + 1200
            while time.monotonic() < deadline:
                rows = json.loads(subprocess.run([*mmm, "status", "--all", "--json"], env=env,
                                                 cwd=work, capture_output=True, text=True).stdout)
                if all(r["state"] in ("completed", "failed", "cancelled", "timeout") for r in rows):
                    break
                time.sleep(5)
            links = [r for r in rows if r["started_at"]]
            gaps = []
            for before, after in zip(links, links[1:]):
                log = subprocess.run([*mmm, "logs", str(after["id"])], env=env, cwd=work,
                                     capture_output=True, text=True).stdout
                # A link that resumes marks its first step `resumed_step=`.
                first = next(float(line.split("_step=")[1].split()[0]) for line in log.splitlines()
                             if line.startswith(("[mmm-orch] first_step=", "[mmm-orch] resumed_step=")))
                gaps.append({"link": after["id"], "end_to_start_s": after["started_at"] - before["ended_at"],
                             "end_to_first_step_s": first - before["ended_at"]})
            results[machine] = gaps
            print(machine, gaps, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["margin", "gap"])
    parser.add_argument("--machines", nargs="+", default=["slurm-local", "pbs-local"])
    args = parser.parse_args()
    data = margin() if args.what == "margin" else gap(args.machines)
    (RESULTS / f"long_runs_{args.what}.json").write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
