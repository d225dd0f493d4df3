"""24 one-device runs on the live OpenPBS test server: one `sweep --pack --devices 1` against 24
separate one-node jobs (`sweep` without --pack), side by side in one run.

The server has three vnodes. The pack runs on a profile of the test server with 8 stand-in
devices a vnode (`pbs-bench`, written here: pbs-local's, with no CPU binding, as 24 one-device
runs on 3 nodes would be on Aurora's 12 tiles a node), so its 24 points fit its 3-node job at
once; the separate jobs take a whole vnode each, 3 at a time, as a queue gives them. Each run is
the `noop` probe workload (a trainer that does nothing).

Timed, from the records and the jobs' own markers:
- command to every run ended: from the moment the command starts to the last run's end;
- allocation start to every slot busy (the pack): from the pack job script's first line
  (`job_start=`) to the start of the last point's supervisor (its record's start), target
  under 2 s for 24; and to the last point's launch line (`launch_start=`), after each point's
  own script start-up (its setup and rendezvous port), as a job of its own has.

Needs the server: `sudo bash scripts/pbs-server.sh up`.

    python benchmarks/pack_devices.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_render import ROOT, this_checkout  # noqa: E402

POINTS = 24
BENCH_PROFILE = """extends: pbs-local
name: pbs-bench
description: the OpenPBS test server, 8 stand-in devices a vnode (benchmarks/pack_devices.py)
devices:
  slots:
    ids: ["0", "1", "2", "3", "4", "5", "6", "7"]
    cpus: []
    launcher_args: ["-n", "{ranks}", "-ppn", "{ranks}"]
    source: benchmarks/pack_devices.py
"""
MARKER = re.compile(r"\[mmm-orch\] (job_start|launch_start)=([0-9.]+)")


def _work(work: Path) -> dict[str, str]:
    (work / "noop_probe.py").write_text("pass\n")
    specs = work / ".mmm-orch"
    (specs / "workloads").mkdir(parents=True, exist_ok=True)
    (specs / "machines").mkdir(parents=True, exist_ok=True)
    (specs / "workloads" / "noop.yaml").write_text(
        "name: noop\ntrainer: noop_probe\noptions: {seed: {type: int, default: 0}}\n")
    (specs / "machines" / "pbs-bench.yaml").write_text(BENCH_PROFILE)
    return {**os.environ, "XDG_STATE_HOME": str(work / "state"),
            "XDG_CACHE_HOME": str(work / "cache"), "PYTHONPATH": str(work)}


def _rows(work: Path) -> list[dict]:
    with sqlite3.connect(work / "state" / "mmm-orch" / "jobs.db") as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute("SELECT * FROM jobs")]


def _marker(log: str, name: str) -> list[float]:
    text = Path(log).read_text(errors="replace") if Path(log).exists() else ""
    return [float(value) for found, value in MARKER.findall(text) if found == name]


def _wait(mmm: Path, work: Path, env: dict[str, str], count: int, timeout: float = 900) -> None:
    """Until `count` jobs of the database have ended (status refreshes them)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = json.loads(subprocess.run([str(mmm / "mmm-orch"), "status", "--all", "--json"],
                                         capture_output=True, text=True, env=env,
                                         cwd=work).stdout or "[]")
        ended = [r for r in rows if r["state"] not in ("pending", "running", "submitting")]
        if len(ended) >= count:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"not ended after {timeout} s: {[r['state'] for r in rows]}")
        time.sleep(2)


def pack_round(mmm: Path, work: Path) -> dict:
    env = _work(work)
    argv = [str(mmm / "mmm-orch"), "sweep", "pbs-bench", "noop", "--devices", "1", "--pack",
            "--pack-nodes", "3", "-t", "00:05:00", "--json",
            "--set", "seed=" + ",".join(str(i) for i in range(POINTS))]
    start = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=work)
    if proc.returncode != 0:
        raise SystemExit(f"sweep --pack: {proc.stderr}")
    _wait(mmm, work, env, POINTS + 1)
    rows = _rows(work)
    pack_job = next(r for r in rows if r["group_index"] == 0)
    points = [r for r in rows if r["group_index"]]
    job_start = _marker(pack_job["log_path"], "job_start")[0]
    launches = [_marker(r["log_path"], "launch_start")[0] for r in points]
    return {"ended_s": max(r["ended_at"] for r in points) - start,
            "busy_s": max(r["started_at"] for r in points) - job_start,
            "launched_s": max(launches) - job_start,
            "completed": sum(r["state"] == "completed" for r in points)}


def separate_round(mmm: Path, work: Path) -> dict:
    env = _work(work)
    argv = [str(mmm / "mmm-orch"), "sweep", "pbs-bench", "noop", "-t", "00:05:00", "--json",
            "--set", "seed=" + ",".join(str(i) for i in range(POINTS))]
    start = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=work)
    if proc.returncode != 0:
        raise SystemExit(f"sweep: {proc.stderr}")
    _wait(mmm, work, env, POINTS)
    rows = _rows(work)
    return {"ended_s": max(r["ended_at"] for r in rows) - start,
            "completed": sum(r["state"] == "completed" for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    mmm = this_checkout()
    rounds: dict[str, list[dict]] = {"pack": [], "separate": []}
    for run in range(args.runs):
        for tool in list(rounds) if run % 2 == 0 else list(reversed(rounds)):
            with tempfile.TemporaryDirectory() as tmp:
                result = (pack_round if tool == "pack" else separate_round)(mmm, Path(tmp))
            rounds[tool].append(result)
            print(f"run {run + 1} {tool}: {result}", flush=True)
    summary = {
        "pack: command to every run ended (s)": statistics.median(r["ended_s"] for r in rounds["pack"]),
        "pack: allocation start to every slot busy (s)":
            statistics.median(r["busy_s"] for r in rounds["pack"]),
        "pack: allocation start to every launch line started (s)":
            statistics.median(r["launched_s"] for r in rounds["pack"]),
        "separate: command to every run ended (s)":
            statistics.median(r["ended_s"] for r in rounds["separate"]),
    }
    out = ROOT / "benchmarks" / "results" / "pack_devices.json"
    out.write_text(json.dumps({"points": POINTS, "runs": args.runs, "summary": summary,
                               "rounds": rounds}, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
