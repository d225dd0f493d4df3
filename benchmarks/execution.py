"""Submit and status on the real Slurm test cluster, side by side in one run.

1. Wall time of `mmm-orch submit slurm-local dist_check` (one node) against
   `torchx run -s slurm utils.echo --msg hi` (TorchX's own one-node job), alternating, each a new
   process in its own virtualenv (benchmarks/.venvs/, as in cli_render.py). Every submitted job
   is cancelled at the end.
2. Wall time of `mmm-orch status --all` with 1,000 recorded jobs against one raw `squeue` call,
   three times: the usual history (990 finished jobs, cached, and 10 queued jobs that squeue
   answers for), the worst case (all 1,000 open with ids the controller does not know, so one
   squeue and then one sacct call carry all 1,000 ids), and like for like (1,000 jobs really
   queued and open in the database: squeue, raw or ours, lists all of them).

Needs the cluster: `sudo bash scripts/slurm-cluster.sh up`.

    python benchmarks/execution.py [--runs 15]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_render import ROOT, this_checkout, venv  # noqa: E402


def timed(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-500:]}")
    return elapsed, proc.stdout


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": statistics.median(ordered) * 1e3, "min_ms": ordered[0] * 1e3,
            "p90_ms": ordered[int(0.9 * (len(ordered) - 1))] * 1e3, "runs": len(ordered)}


def measure_status(mmm: Path, env: dict[str, str], work: str, runs: int,
                   times: dict[str, list[float]]) -> None:
    sys.path.insert(0, str(ROOT))
    from mmm_orch.records.db import JobDB

    submitted = JobDB(Path(work) / "state" / "mmm-orch" / "jobs.db")
    first = submitted.get(1)
    queued = [r.native_id for r in submitted.list()][:10]  # pending: the partition is down
    template = {k: v for k, v in first.to_dict(full=True).items()
                if k not in ("id", "events", "state", "native_state", "reason", "exit_code",
                             "signal", "started_at", "ended_at", "checked_at")}
    status = [str(mmm / "mmm-orch"), "status", "--all"]

    def compare(label: str, open_ids: list[str], squeue_label: str) -> None:
        state = Path(work) / label.replace(",", "").replace(" ", "-")
        db = JobDB(state / "mmm-orch" / "jobs.db")
        for i in range(1000 - len(open_ids)):
            db.insert(**{**template, "native_id": str(700000 + i), "state": "completed"})
        for native_id in open_ids:
            db.insert(**{**template, "native_id": native_id, "state": "pending"})
        name = f"mmm-orch status (1,000 jobs, {label})"
        times[name] = []
        times.setdefault(squeue_label, [])
        for _ in range(runs):
            elapsed, out = timed(status, {**env, "XDG_STATE_HOME": str(state)}, work)
            assert len(out.splitlines()) == 1001, len(out.splitlines())
            times[name].append(elapsed)
            times[squeue_label].append(timed(["squeue"], env, work)[0])

    compare("10 open", queued, "squeue (raw, one call)")
    compare("1,000 open", [str(800000 + i) for i in range(1000)], "squeue (raw, one call)")
    # Like for like: 1,000 jobs really queued, all of them open in mmm-orch's database, so one
    # squeue answers for every job and the raw squeue lists them all too.
    real = [timed(["sbatch", "--parsable", "--job-name=bench", "--wrap=true"], env, work)[1]
            .strip().split(";")[0] for _ in range(1000)]
    compare("1,000 open, all queued", real, "squeue (raw, one call, 1,000+ jobs queued)")
    times["python3 -c pass (interpreter floor)"] = [
        timed([str(mmm / "python"), "-c", "pass"], env, work)[0] for _ in range(runs)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    mmm = this_checkout()
    torchx = venv("torchx", ["torch==2.13.0", "torchx"])
    work = tempfile.mkdtemp(prefix="mmm-bench-exec-")
    env = {**os.environ, "XDG_STATE_HOME": f"{work}/state", "XDG_CACHE_HOME": f"{work}/cache"}
    submit = [str(mmm / "mmm-orch"), "submit", "slurm-local", "dist_check", "--nodes", "1",
              "--name", "bench"]
    torchx_run = [str(torchx / "torchx"), "run", "-s", "slurm", "utils.echo", "--msg", "hi"]

    # Partition DOWN: jobs queue but never start, so they do not compete for the two cores.
    subprocess.run(["scontrol", "update", "partitionname=debug", "state=down"], check=True)
    times: dict[str, list[float]] = {"mmm-orch submit": [], "torchx run -s slurm": []}
    try:
        timed(submit, env, work)  # fills the config cache, as any second use would
        for _ in range(args.runs):
            times["mmm-orch submit"].append(timed(submit, env, work)[0])
            times["torchx run -s slurm"].append(timed(torchx_run, env, work)[0])
        measure_status(mmm, env, work, args.runs, times)
    finally:
        subprocess.run(["scancel", "--name=bench"], check=False)
        subprocess.run(["scancel", "--name=echo"], check=False)
        subprocess.run(["scontrol", "update", "partitionname=debug", "state=up"], check=True)


    version = subprocess.run([str(torchx / "python"), "-c", "import torchx; print(torchx.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    results = {name: summary(samples) for name, samples in times.items()}
    results["ratios"] = {
        "submit_vs_torchx": results["mmm-orch submit"]["median_ms"]
        / results["torchx run -s slurm"]["median_ms"],
        "status_10_open_vs_squeue": results["mmm-orch status (1,000 jobs, 10 open)"]["median_ms"]
        / results["squeue (raw, one call)"]["median_ms"],
        "status_1000_open_vs_squeue": results["mmm-orch status (1,000 jobs, 1,000 open)"]["median_ms"]
        / results["squeue (raw, one call)"]["median_ms"],
        "status_1000_queued_vs_squeue_1000_queued":
            results["mmm-orch status (1,000 jobs, 1,000 open, all queued)"]["median_ms"]
            / results["squeue (raw, one call, 1,000+ jobs queued)"]["median_ms"],
    }
    results["torchx_version"] = version
    out = ROOT / "benchmarks" / "results" / "execution.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
