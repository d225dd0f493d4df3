"""A node's death, measured: how long until training goes on, with a spare and without one.

On the live test schedulers (run as root, the clusters up), per machine and run, tiny Llama 3
(2 nodes x 2 CPU ranks, a checkpoint every 10 steps) passes step 45, then every rank process on
its second node is SIGKILLed:

- with `--spare-nodes 1`, in the same job: kill -> the `failover: retired` line (the launcher
  reported the loss, the loop named the node), -> `attempt=2/2` (the relaunch on the spare), ->
  `resumed_step` (the first step of the resumed training);
- without a spare, what a user does at best, at once: the job fails; `mmm-orch rerun JOB
  --resume` the moment `status` says so (polled every second); kill -> `failed` recorded ->
  `resumed_step` of the new job. On these idle clusters the new job does not wait in a queue;
  on a facility that wait comes on top.

    sudo bash scripts/slurm-cluster.sh up && sudo bash scripts/pbs-server.sh up
    python benchmarks/failover.py [--machines slurm-local pbs-local] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers.faults import kill, rank_pids, signal_node  # noqa: E402  (the tests' fault injection)

RESULTS = ROOT / "benchmarks" / "results"
SPEC = ("extends: llama3_debug\nname: llama_fo\n"
        "args: {config: debug, tiny: true, warmup_steps: 20, steps: 400, checkpoint_every: 10}\n")
TERMINAL = ("completed", "failed", "cancelled", "timeout", "hung")


class Session:
    """mmm-orch commands in a throwaway state directory and working directory."""

    def __init__(self, work: Path):
        self.work = work
        specs = work / ".mmm-orch" / "workloads"
        specs.mkdir(parents=True)
        (specs / "llama_fo.yaml").write_text(SPEC)
        self.env = {**os.environ, "XDG_STATE_HOME": str(work / "state"),
                    "XDG_CACHE_HOME": str(work / "cache"), "XDG_CONFIG_HOME": str(work / "config")}

    def run(self, *args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "mmm_orch", *args], env=self.env, cwd=self.work,
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise SystemExit(f"mmm-orch {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def row(self, job: int) -> dict:
        return json.loads(self.run("status", str(job), "--json"))[0]

    def log(self, job: int) -> str:
        """The job's log so far ('' while it has none)."""
        return subprocess.run([sys.executable, "-m", "mmm_orch", "logs", str(job)], env=self.env,
                              cwd=self.work, capture_output=True, text=True, timeout=120).stdout


def until(what, timeout: float, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while not (value := what()):
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(poll)
    return value


def last_step(run_dir: str) -> int:
    path = Path(run_dir) / "metrics.jsonl"
    steps = [r["step"] for r in map(json.loads, path.read_text().splitlines() if path.exists() else [])
             if r["event"] == "step"]
    return steps[-1] if steps else 0


def started(session: Session, job: int, step: int) -> dict:
    """The job's row once its training has passed `step`, with its failover state if any."""
    row = until(lambda: (r := session.row(job))["state"] == "running" and r, 300)
    until(lambda: last_step(row["run_dir"]) >= step, 300)
    return row


def with_spare(session: Session, machine: str) -> dict:
    job = json.loads(session.run("submit", machine, "llama_fo", "--nodes", "2", "--spare-nodes", "1",
                                 "--json"))["id"]
    row = started(session, job, 45)
    victim = json.loads((Path(row["job_dir"]) / "failover.json").read_text())["active"][1]
    step = last_step(row["run_dir"])
    killed = signal_node(row["native_id"], victim, signal.SIGKILL)
    until(lambda: "[mmm-orch] resumed_step=" in session.log(job), 300)
    log = session.log(job)
    resumed_from = int(log.split("[resume] step=", 1)[1].split()[0])
    result = {"victim": victim, "step_at_kill": step, "resumed_from": resumed_from,
              "to_retired_s": retired_at(log) - killed,
              "to_relaunch_s": epoch_after(log, "[mmm-orch] attempt=2/") - killed,
              "to_resumed_step_s": epoch_after(log, "[mmm-orch] resumed_step=") - killed}
    stop(session, job)
    return result


def without_spare(session: Session, machine: str) -> dict:
    job = json.loads(session.run("submit", machine, "llama_fo", "--nodes", "2", "--json"))["id"]
    row = started(session, job, 45)
    killed = kill(rank_pids(row["native_id"], {2, 3}), signal.SIGKILL)  # the second node's ranks
    until(lambda: session.row(job)["state"] in TERMINAL, 300, poll=1.0)
    failed = time.time()
    rerun = json.loads(session.run("rerun", str(job), "--resume", "--json"))["id"]
    until(lambda: "[mmm-orch] resumed_step=" in session.log(rerun), 300)
    log = session.log(rerun)
    result = {"state": session.row(job)["state"], "to_failed_recorded_s": failed - killed,
              "to_resumed_step_s": epoch_after(log, "[mmm-orch] resumed_step=") - killed}
    stop(session, rerun)
    return result


def stop(session: Session, job: int) -> None:
    """Cancel the job and wait for its end (it saves a checkpoint on the way out)."""
    session.run("cancel", str(job))
    until(lambda: session.row(job)["state"] in TERMINAL, 120)


def epoch_after(log: str, prefix: str) -> float:
    """The `at=EPOCH` (or `resumed_step=EPOCH`) of the first line starting with `prefix`."""
    line = next(line for line in log.splitlines() if line.startswith(prefix))
    if "at=" in line and not prefix.endswith("="):
        return float(line.split("at=", 1)[1].split()[0])
    return float(line[len(prefix):].split()[0])


def retired_at(log: str) -> float:
    line = next(line for line in log.splitlines() if line.startswith("[mmm-orch] failover: retired"))
    return float(line.split(" at=", 1)[1].split()[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--machines", nargs="+", default=["slurm-local", "pbs-local"])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, dict] = {}
    for machine in args.machines:
        runs = {"with_spare": [], "without_spare": []}
        for _ in range(args.runs):
            for kind, measure in (("with_spare", with_spare), ("without_spare", without_spare)):
                with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
                    runs[kind].append(measure(Session(Path(tmp)), machine))
                print(machine, kind, runs[kind][-1], flush=True)
        results[machine] = {
            **runs,
            "median": {kind: {key: statistics.median(r[key] for r in rows)
                              for key in rows[0] if key.endswith("_s")}
                       for kind, rows in runs.items()}}
        print(machine, json.dumps(results[machine]["median"]), flush=True)
    (RESULTS / "failover.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
