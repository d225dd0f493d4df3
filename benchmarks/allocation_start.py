"""How long a run takes to start: sent into a held allocation that runs, against a job of its own on
the idle Slurm test cluster, against a Parsl task sent to a running pilot job. One run, side by
side, alternating, on one host.

1. mmm-orch, into an allocation: `mmm-orch allocate slurm-local -N 1`, then once it runs, each
   run `mmm-orch submit slurm-local --into ID -- true` from a new process, and the same from
   this process through the API (`Allocation.submit`).
2. mmm-orch, a job of its own: `mmm-orch submit slurm-local -- true` from a new process.
   For both: from the moment the submission begins to the first line of the run's job script
   (its `job_start` marker, by the same clock).
3. Parsl (a HighThroughputExecutor whose workers run in one Slurm job, SlurmProvider), once its
   workers have connected: from `app()` to the app's first line in the worker. This is the
   in-process call, with no new interpreter, so it has no start-up cost of its own.

Needs the cluster: `sudo bash scripts/slurm-cluster.sh up`. Parsl goes into its own virtualenv
(benchmarks/.venvs/parsl).

    python benchmarks/allocation_start.py [--runs 10]
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
from cli_render import ROOT, venv  # noqa: E402

MMM = [str(ROOT / ".venv" / "bin" / "python"), "-m", "mmm_orch"]

PARSL = r"""
import json, sys, time
import parsl
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.providers import SlurmProvider
from parsl.launchers import SrunLauncher

@parsl.python_app
def started():
    import time
    return time.time()

config = Config(executors=[HighThroughputExecutor(
    label="pilot", max_workers_per_node=1, address="127.0.0.1",
    provider=SlurmProvider(partition="debug", nodes_per_block=1, init_blocks=1, min_blocks=1,
                           max_blocks=1, walltime="00:10:00", launcher=SrunLauncher(),
                           worker_init=f"export PATH={sys.prefix}/bin:$PATH",
                           exclusive=False))],
    run_dir=sys.argv[2])
parsl.load(config)
started().result()  # the pilot runs and its worker has connected
gaps = []
for _ in range(int(sys.argv[1])):
    sent = time.time()
    gaps.append(started().result() - sent)
    time.sleep(0.5)
parsl.dfk().cleanup()
print(json.dumps(gaps))
"""


def mmm(*args: str, env: dict[str, str]) -> dict:
    cut = args.index("--") if "--" in args else len(args)  # (--json is mmm-orch's, not the run's)
    proc = subprocess.run([*MMM, *args[:cut], "--json", *args[cut:]], capture_output=True,
                          text=True, env=env, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"mmm-orch {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    found = json.loads(proc.stdout)
    return found[0] if isinstance(found, list) else found


def started_at(job: int, env: dict[str, str], timeout: float = 120) -> float:
    """When the job's script began, by its own clock: its log's job_start marker (read with
    the protocol's own pattern), to the nanosecond where the scheduler's start has seconds."""
    from mmm_orch.injob.protocol import ONCE

    deadline = time.monotonic() + timeout
    log = Path(mmm("status", str(job), "--all", env=env)["log_path"])
    while time.monotonic() < deadline:
        found = ONCE["job_start"].search(log.read_text()) if log.exists() else None
        if found:
            return float(found.group(1))
        time.sleep(0.05)
    raise SystemExit(f"job {job} did not start in {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="allocation-start-"))
    env = {**os.environ, "MMM_ORCH_DB": str(work / "jobs.db")}

    os.environ["MMM_ORCH_DB"] = env["MMM_ORCH_DB"]  # (the API's calls, in this process)
    import mmm_orch

    held = mmm("allocate", "slurm-local", "-N", "1", "--walltime", "00:15:00", env=env)["id"]
    started_at(held, env)
    allocation = mmm_orch.allocation(held)
    into, api, own = [], [], []
    for _ in range(args.runs):
        sent = time.time()
        job = mmm("submit", "slurm-local", "--into", str(held), "--walltime", "00:01:00",
                  "--", "true", env=env)["id"]
        into.append(started_at(job, env) - sent)
        mmm_orch.job(job).wait(poll=0.1)  # its node free again: the next run waits for none
        sent = time.time()
        run = allocation.submit(command=["true"], walltime="00:01:00")
        api.append(started_at(run.id, env) - sent)
        run.wait(poll=0.1)
        sent = time.time()
        job = mmm("submit", "slurm-local", "--walltime", "00:01:00", "--", "true", env=env)["id"]
        own.append(started_at(job, env) - sent)
    allocation.cancel()

    parsl_bin = venv("parsl", ["parsl==2026.10.26"])
    out = subprocess.run([str(parsl_bin / "python"), "-c", PARSL, str(args.runs),
                          str(work / "parsl")], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PATH": f"{parsl_bin}{os.pathsep}{os.environ['PATH']}"})
    if out.returncode != 0:
        raise SystemExit(f"parsl exited {out.returncode}: {out.stderr[-2000:]}")
    parsl = json.loads(out.stdout.strip().splitlines()[-1])

    print(f"{args.runs} runs each, slurm-local (Slurm 22.05, 3 nodes, idle), {time.ctime()}")
    print("| how the run is sent | median start (s) | min | max |")
    print("|---|---|---|---|")
    for name, gaps in (("`mmm-orch submit --into` (a new process) to a running allocation", into),
                       ("`Allocation.submit()` (in-process) to a running allocation", api),
                       ("`mmm-orch submit` (a new process), a job of its own", own),
                       ("Parsl app (in-process) to a running HTEX pilot", parsl)):
        print(f"| {name} | {statistics.median(gaps):.3f} | {min(gaps):.3f} | {max(gaps):.3f} |")


if __name__ == "__main__":
    main()
