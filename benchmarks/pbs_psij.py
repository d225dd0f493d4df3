"""Submit and status of 200 jobs on the live OpenPBS test server: mmm-orch against PSI/J's PBS
executor (psij-python 0.9.11), side by side in one run.

Both submit the same one-node job (`/bin/true` for PSI/J, mmm-orch's `noop` probe workload) to
the server's `parked` queue, which takes jobs and never starts them, so every job is still
queued when its status is asked, and the right answer is known: 200 queued jobs.

- Submit: 200 x `mmm-orch submit pbs-local noop -q parked` (each a new process: plan, render,
  job directory, database record, qsub), and one `mmm-orch sweep` of 200 points (one process),
  against 200 x `executor.submit(job)` in one PSI/J process (script generation, qsub).
- Status: `mmm-orch status --all` (one `qstat -f -F dsv -x` for the 200 ids) against PSI/J's own
  status query (`qstat -f -F json -x` for the 200 ids, parsed by its executor), each timed and
  checked: how many of the 200 each reports queued.

Needs the server: `sudo bash scripts/pbs-server.sh up`.

    python benchmarks/pbs_psij.py [--jobs 200] [--runs 5]

`inprocess` compares submitting from inside one Python process, per job: mmm-orch's Python API
(`mmm_orch.submit(...)`: plan, render, job directory, record before the scheduler is asked,
qsub or sbatch, record) against PSI/J's `executor.submit(job)`, on the PBS server and on the
Slurm test cluster (`sudo bash scripts/slurm-cluster.sh up`), each to a queue that takes jobs
and never starts them (PBS `parked`, Slurm partition `parked`, which is down):

    python benchmarks/pbs_psij.py inprocess [--jobs 200] [--runs 3]

`pack` times recording and queueing `--jobs` runs: one `mmm-orch sweep --pack` of that many
points (every point planned and rendered, the sweep recorded with their plans, one pack job
queued) against PSI/J submitting as many jobs in a loop, both to the PBS `parked` queue:

    python benchmarks/pbs_psij.py pack [--jobs 100] [--runs 5]
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

Q = "/opt/pbs/bin"
PSIJ_VERSION = "0.9.11"

# `count` one-node jobs of /bin/true to the `parked` queue, submitted one after the other, timed.
PSIJ_JOB = r"""
def new_job():
    return Job(JobSpec("/bin/true", launcher="single", inherit_environment=False,
                       resources=ResourceSpecV1(node_count=1, processes_per_node=1),
                       attributes=JobAttributes(queue_name="parked", duration=timedelta(minutes=10))))
"""
PSIJ_SUBMITS = PSIJ_JOB + r"""
jobs = [new_job() for _ in range(count)]
start = time.perf_counter()
for job in jobs:
    executor.submit(job)
"""
PSIJ = r"""
import json, os, subprocess, sys, time
from pathlib import Path
from datetime import timedelta
from psij import Job, JobAttributes, JobExecutor, JobSpec, ResourceSpecV1
from psij.executors.batch.pbs import PBSExecutorConfig

count, work = int(sys.argv[1]), sys.argv[2]
config = PBSExecutorConfig(initial_queue_polling_delay=10**6, work_directory=Path(work))
executor = JobExecutor.get_instance("pbs", config=config)  # its poller stays idle: we time one query
""" + PSIJ_SUBMITS + r"""submit_s = time.perf_counter() - start
start = time.perf_counter()
command = executor.get_status_command([job.native_id for job in jobs])
result = subprocess.run(command, capture_output=True, text=True)
states = executor.parse_status_output(result.returncode, result.stdout)
status_s = time.perf_counter() - start
# What PSI/J then reports for a job it asked about: the state parsed, else COMPLETED (its
# executor assumes a job missing from qstat's answer has finished).
reported = [states[job.native_id].state.name if job.native_id in states else "COMPLETED"
            for job in jobs]
print(json.dumps({"submit_s": submit_s, "status_s": status_s,
                  "ids": [job.native_id for job in jobs],
                  "queued": sum(state == "QUEUED" for state in reported),
                  "states": {s: reported.count(s) for s in set(reported)}}))
"""


# One process, `count` submits, each tool's own way: the time per job, and the ids to delete.
PSIJ_INPROCESS = r"""
import json, sys, time
from pathlib import Path
from datetime import timedelta
from psij import Job, JobAttributes, JobExecutor, JobSpec, ResourceSpecV1

kind, count, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
config_class = {"pbs": "psij.executors.batch.pbs.PBSExecutorConfig",
                "slurm": "psij.executors.batch.slurm.SlurmExecutorConfig"}[kind]
module, name = config_class.rsplit(".", 1)
config = getattr(__import__(module, fromlist=[name]), name)(
    initial_queue_polling_delay=10**6, work_directory=Path(work))
executor = JobExecutor.get_instance(kind, config=config)
""" + PSIJ_JOB + r"""
first = new_job()
executor.submit(first)  # untimed, as mmm-orch's first: what a process does once
jobs = [new_job() for _ in range(count)]
start = time.perf_counter()
for job in jobs:
    executor.submit(job)
print(json.dumps({"per_job_ms": (time.perf_counter() - start) / count * 1e3,
                  "ids": [job.native_id for job in [first, *jobs]]}))
"""
MMM_INPROCESS = r"""
import json, sys, time
import mmm_orch

kind, count, planned = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "planned"
machine = {"pbs": "pbs-local", "slurm": "slurm-local"}[kind]
plan = mmm_orch.plan(machine, "noop", queue="parked")  # what the first call loads once (profiles)
# Untimed, as PSI/J's first: what a process does once (imports, the job database made).
first = mmm_orch.submit(plan)
start = time.perf_counter()
if planned:  # planned once before the clock, as PSI/J's Job objects are made before it
    jobs = [mmm_orch.submit(plan) for _ in range(count)]
else:  # planned for every job, as `submit(machine, workload, ...)` does
    jobs = [mmm_orch.submit(machine, "noop", queue="parked") for _ in range(count)]
print(json.dumps({"per_job_ms": (time.perf_counter() - start) / count * 1e3,
                  "ids": [job.native_id for job in [first, *jobs]],
                  "recorded": len(mmm_orch.jobs())}))
"""


def delete(ids: list[str], kind: str = "pbs") -> None:
    """The round's jobs, and any other job in `parked`, gone before the next round starts:
    queued jobs slow down every later submit (the scheduler's cycle walks them), whichever tool
    made them."""
    command = [f"{Q}/qdel"] if kind == "pbs" else ["scancel"]
    listing = [f"{Q}/qselect", "-q", "parked"] if kind == "pbs" else ["squeue", "-h", "-p",
                                                                     "parked", "-o", "%i"]
    deadline = time.monotonic() + 60
    while ids:
        for start in range(0, len(ids), 50):
            subprocess.run([*command, *ids[start:start + 50]], capture_output=True)
        time.sleep(0.5)
        ids = subprocess.run(listing, capture_output=True, text=True).stdout.split()
        if ids and time.monotonic() > deadline:
            raise SystemExit(f"{len(ids)} jobs are still queued in parked: {ids[:5]}")


def inprocess_round(tool: str, python: Path, kind: str, count: int, work: Path,
                    cache: Path) -> dict:
    """One process submitting `count` jobs. Each round has its own job database; the cache
    directory (mmm-orch's validated profiles and compiled templates) is kept between rounds, as
    on a user's computer after the first use."""
    env = {**os.environ, "XDG_STATE_HOME": str(work / "state"), "XDG_CACHE_HOME": str(cache),
           "PYTHONPATH": str(work), "PATH": f"{Q}{os.pathsep}{os.environ['PATH']}"}
    if tool == "psij":
        argv = [str(python / "python"), "-c", PSIJ_INPROCESS, kind, str(count), str(work / "psij")]
    else:
        _noop_workload(work)
        argv = [str(python / "python"), "-c", MMM_INPROCESS, kind, str(count), tool.split()[-1]]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=work)
    if proc.returncode != 0:
        raise SystemExit(f"{tool} on {kind}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def inprocess(args: argparse.Namespace, mmm: Path, psij: Path) -> None:
    rounds: dict[str, list[dict]] = {}
    cache = Path(tempfile.mkdtemp(prefix="mmm-orch-bench-cache-"))
    for kind in ("pbs", "slurm"):  # untimed: fills the cache, as a first use does
        for tool in ("mmm-orch api", "psij"):
            with tempfile.TemporaryDirectory() as tmp:
                delete(inprocess_round(tool, psij if tool == "psij" else mmm, kind, 1, Path(tmp),
                                       cache)["ids"], kind)
    for run in range(args.runs):
        for kind in ("pbs", "slurm"):
            tools = ["mmm-orch api", "mmm-orch api planned", "psij"]
            for tool in tools if run % 2 == 0 else reversed(tools):
                with tempfile.TemporaryDirectory() as tmp:
                    result = inprocess_round("psij" if tool == "psij" else tool,
                                             psij if tool == "psij" else mmm, kind, args.jobs,
                                             Path(tmp), cache)
                delete(result.pop("ids"), kind)
                rounds.setdefault(f"{tool} {kind}", []).append(result)
                print(f"run {run + 1} {tool} on {kind}: {result['per_job_ms']:.1f} ms a job"
                      + (f", {result['recorded']} recorded" if "recorded" in result else ""),
                      flush=True)
                time.sleep(2)
    summary = {name: {"per_job_ms": statistics.median(r["per_job_ms"] for r in rs),
                      "runs": [round(r["per_job_ms"], 2) for r in rs]}
               for name, rs in rounds.items()}
    out = ROOT / "benchmarks" / "results" / "inprocess_submit.json"
    out.write_text(json.dumps({"jobs": args.jobs, "runs": args.runs, "psij": PSIJ_VERSION,
                               "summary": summary, "rounds": rounds}, indent=2))
    print(json.dumps(summary, indent=2))


def _noop_workload(work: Path) -> None:
    """The probe workload both CLI and API rounds submit: a trainer that does nothing."""
    (work / "noop_probe.py").write_text("pass\n")
    specs = work / ".mmm-orch" / "workloads"
    specs.mkdir(parents=True, exist_ok=True)
    (specs / "noop.yaml").write_text("name: noop\ntrainer: noop_probe\n"
                                     "options: {seed: {type: int, default: 0}}\n")


def mmm_round(mmm: Path, count: int, work: Path, sweep: bool = False) -> dict:
    """`count` submits, each a new process; with `sweep`, one `mmm-orch sweep` of `count` points
    (one process)."""
    env = {**os.environ, "XDG_STATE_HOME": str(work / "state"), "XDG_CACHE_HOME": str(work / "cache"),
           "PYTHONPATH": str(work)}
    _noop_workload(work)
    submit = [str(mmm / "mmm-orch"), "submit", "pbs-local", "noop", "-q", "parked", "--json"]
    if sweep:
        submit = [str(mmm / "mmm-orch"), "sweep", "pbs-local", "noop", "-q", "parked", "--json",
                  "--set", "seed=" + ",".join(str(i) for i in range(count))]
    ids = []
    start = time.perf_counter()
    for _ in range(1 if sweep else count):
        proc = subprocess.run(submit, capture_output=True, text=True, env=env, cwd=work)
        if proc.returncode != 0:
            raise SystemExit(f"mmm-orch submit: {proc.stderr}")
        out = json.loads(proc.stdout)
        ids += [r["native_id"] for r in out] if sweep else [out["native_id"]]
    submit_s = time.perf_counter() - start
    time.sleep(1.1)  # qstat sleeps 200 ms when the same user called it within the second
    start = time.perf_counter()
    proc = subprocess.run([str(mmm / "mmm-orch"), "status", "--all", "--json"], capture_output=True,
                          text=True, env=env, cwd=work)
    status_s = time.perf_counter() - start
    rows = json.loads(proc.stdout)
    time.sleep(1.1)
    start = time.perf_counter()  # the floor: the one qstat that status runs, alone
    subprocess.run([f"{Q}/qstat", "-f", "-F", "dsv", "-x", *ids], capture_output=True, check=True)
    qstat_s = time.perf_counter() - start
    return {"submit_s": submit_s, "status_s": status_s, "qstat_s": qstat_s, "ids": ids,
            # Only what the server said counts: a stale row is the last known state, shown when
            # qstat did not answer within status's deadline.
            "queued": sum(r["state"] == "pending" and not r["stale"] for r in rows),
            "stale": sum(bool(r["stale"]) for r in rows),
            "states": {s: [r["state"] for r in rows].count(s) for s in {r["state"] for r in rows}}}


def pack_round(mmm: Path, count: int, work: Path, cache: Path) -> dict:
    """One `mmm-orch sweep --pack` of `count` points, a new process, timed; checked: the sweep
    holds `count` points and one job is queued. Each round has its own job database; the cache
    (validated profiles, compiled templates) is kept, as on a user's computer after first use."""
    import sqlite3

    env = {**os.environ, "XDG_STATE_HOME": str(work / "state"), "XDG_CACHE_HOME": str(cache),
           "PYTHONPATH": str(work)}
    _noop_workload(work)
    argv = [str(mmm / "mmm-orch"), "sweep", "pbs-local", "noop", "-q", "parked", "--pack",
            "--pack-walltime", "00:10:00", "--json",
            "--set", "seed=" + ",".join(str(i) for i in range(count))]
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=work)
    submit_s = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"mmm-orch sweep --pack: {proc.stderr}")
    with sqlite3.connect(work / "state" / "mmm-orch" / "jobs.db") as db:
        plans = db.execute("SELECT count(*) FROM group_plans").fetchone()[0]
    queued = subprocess.run([f"{Q}/qselect", "-q", "parked"], capture_output=True,
                            text=True).stdout.split()
    native_id = json.loads(proc.stdout)["native_id"]
    return {"submit_s": submit_s, "points": plans,
            "queued": int(native_id in queued), "ids": [native_id]}


# PSI/J's loop alone, in a process of its own: the loop's time, and the process's as a whole
# (interpreter, imports, executor) is timed from outside, as mmm-orch's command is.
PSIJ_LOOP = r"""
import json, sys, time
from pathlib import Path
from datetime import timedelta
from psij import Job, JobAttributes, JobExecutor, JobSpec, ResourceSpecV1
from psij.executors.batch.pbs import PBSExecutorConfig

count, work = int(sys.argv[1]), sys.argv[2]
config = PBSExecutorConfig(initial_queue_polling_delay=10**6, work_directory=Path(work))
executor = JobExecutor.get_instance("pbs", config=config)
""" + PSIJ_SUBMITS + r"""
print(json.dumps({"loop_s": time.perf_counter() - start, "ids": [job.native_id for job in jobs]}))
"""


def psij_loop_round(psij: Path, count: int, work: Path) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([str(psij / "python"), "-c", PSIJ_LOOP, str(count), str(work / "psij")],
                          capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{Q}{os.pathsep}{os.environ['PATH']}"})
    process_s = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"psij: {proc.stderr[-2000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "process_s": process_s}


def pack(args: argparse.Namespace, mmm: Path, psij: Path) -> None:
    rounds: dict[str, list[dict]] = {"mmm-orch sweep --pack": [], "psij": []}
    cache = Path(tempfile.mkdtemp(prefix="mmm-orch-bench-cache-"))
    with tempfile.TemporaryDirectory() as tmp:  # untimed: fills the cache, as a first use does
        delete(pack_round(mmm, 1, Path(tmp), cache)["ids"])
    for run in range(args.runs):
        for tool in list(rounds) if run % 2 == 0 else list(reversed(rounds)):
            with tempfile.TemporaryDirectory() as tmp:
                result = (psij_loop_round(psij, args.jobs, Path(tmp)) if tool == "psij"
                          else pack_round(mmm, args.jobs, Path(tmp), cache))
            delete(result.pop("ids"))
            rounds[tool].append(result)
            print(f"run {run + 1} {tool}: {result}", flush=True)
            time.sleep(2)
    ours = statistics.median(r["submit_s"] for r in rounds["mmm-orch sweep --pack"])
    loop = statistics.median(r["loop_s"] for r in rounds["psij"])
    process = statistics.median(r["process_s"] for r in rounds["psij"])
    summary = {"mmm-orch sweep --pack (the whole command)": ours,
               "psij submit loop (in a running process)": loop,
               "psij process (interpreter, imports, loop)": process,
               "ratio to the loop": ours / loop, "ratio to the process": ours / process}
    out = ROOT / "benchmarks" / "results" / "pack_psij.json"
    out.write_text(json.dumps({"jobs": args.jobs, "runs": args.runs, "psij": PSIJ_VERSION,
                               "summary": summary, "rounds": rounds}, indent=2))
    print(json.dumps(summary, indent=2))


def psij_round(psij: Path, count: int, work: Path) -> dict:
    proc = subprocess.run([str(psij / "python"), "-c", PSIJ, str(count), str(work / "psij")],
                          capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{Q}{os.pathsep}{os.environ['PATH']}"})
    if proc.returncode != 0:
        raise SystemExit(f"psij: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", nargs="?", choices=["cli", "inprocess", "pack"], default="cli")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    mmm = this_checkout()
    psij = venv("psij", [f"psij-python=={PSIJ_VERSION}"])
    if args.mode in ("inprocess", "pack"):
        (inprocess if args.mode == "inprocess" else pack)(args, mmm, psij)
        return
    rounds = {"mmm-orch": [], "mmm-orch sweep": [], "psij": []}
    for run in range(args.runs):
        order = list(rounds) if run % 2 == 0 else list(reversed(rounds))
        for tool in order:
            with tempfile.TemporaryDirectory() as tmp:
                result = (psij_round(psij, args.jobs, Path(tmp)) if tool == "psij"
                          else mmm_round(mmm, args.jobs, Path(tmp), sweep=tool.endswith("sweep")))
            delete(result.pop("ids"))
            rounds[tool].append(result)
            print(f"run {run + 1} {tool}: submit {result['submit_s']:.1f} s, status "
                  f"{result['status_s'] * 1e3:.0f} ms, {result['queued']}/{args.jobs} queued "
                  f"{result['states']}, stale {result.get('stale', '-')}", flush=True)
            time.sleep(2)
    summary = {tool: {"submit_ms_per_job": statistics.median(r["submit_s"] for r in rs) / args.jobs * 1e3,
                      "status_ms": statistics.median(r["status_s"] for r in rs) * 1e3,
                      "raw_qstat_ms": (statistics.median(r["qstat_s"] for r in rs) * 1e3
                                       if "qstat_s" in rs[0] else None),
                      "queued_reported": [r["queued"] for r in rs], "states": rs[-1]["states"]}
               for tool, rs in rounds.items()}
    out = ROOT / "benchmarks" / "results" / "pbs_psij.json"
    out.write_text(json.dumps({"jobs": args.jobs, "runs": args.runs, "psij": PSIJ_VERSION,
                               "summary": summary, "rounds": rounds}, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
