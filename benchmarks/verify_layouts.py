"""--verify beside the analytic plan: how long each takes, and what each says.

    python benchmarks/verify_layouts.py   # facility plans: `render` with and without --verify

Each plan is rendered twice, each a new process (`mmm-orch render`): without --verify (the
analytic plan alone) and with it, MMM_ORCH_MEMORY_CHECK=0 so that a plan past the device still
shows its figures; wall time, the estimate, the verified peak of the busiest rank kind and the
step time the roofline gives. Results: results/verify_layouts.json and the table in
README.md."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable

PLANS = [  # (name, machine, workload, nodes, settings)
    ("8B, Polaris, 8 nodes, the workload's layout", "polaris", "llama3_8b", 8, []),
    (
        "70B, Aurora, 64 nodes, tp 4 x pp 2",
        "aurora",
        "llama3_70b",
        64,
        ["tp=4", "pp=2", "global_batch=192"],
    ),
    (
        "70B, Aurora, 64 nodes, tp 4 x pp 4",
        "aurora",
        "llama3_70b",
        64,
        ["tp=4", "pp=4", "global_batch=192"],
    ),
    (
        "405B, Aurora, 256 nodes (3072 ranks), tp 4 x pp 6",
        "aurora",
        "llama3_70b",
        256,
        ["config=405b", "tp=4", "pp=6", "global_batch=1536"],
    ),
    (
        "405B, Frontier, 256 nodes (2048 ranks), tp 8 x pp 2",
        "frontier",
        "llama3_70b",
        256,
        ["config=405b", "tp=8", "pp=2", "global_batch=512"],
    ),
]


def render(machine: str, workload: str, nodes: int, settings: list[str], verify: bool):
    argv = [PYTHON, "-m", "mmm_orch", "render", machine, workload, "--nodes", str(nodes), "-A", "P"]
    for setting in settings:
        argv += ["--set", setting]
    if verify:
        argv.append("--verify")
    env = {**os.environ, "MMM_ORCH_MEMORY_CHECK": "0"}
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/tmp")
    seconds = time.perf_counter() - started
    if proc.returncode:
        return {"seconds": seconds, "error": proc.stderr.strip()}
    found = {"seconds": seconds}
    for line in proc.stdout.splitlines():
        if line.startswith("# Memory per device (estimate"):
            found["estimate_gib"] = float(re.search(r": ([\d.]+) GiB", line)[1])
        elif line.startswith("# Memory per device (verified"):
            found["verified_gib"] = float(re.search(r": ([\d.]+) GiB on the", line)[1])
            found["busiest"] = re.search(r"GiB on the (.+?) \(rank", line)[1]
            step = re.search(
                r"step ~([\d.]+) s on the device \(roofline ([\d.]+) s, "
                r"collectives across nodes ([\d.]+) s",
                line,
            )
            found["step_s"], found["compute_s"], found["network_s"] = (
                (float(step[1]), float(step[2]), float(step[3])) if step else (None, None, None)
            )
            found["kinds"] = int(re.search(r"\((\d+) rank kind", line)[1])
    return found


def plans() -> list[dict]:
    rows = []
    for name, machine, workload, nodes, settings in PLANS:
        analytic = render(machine, workload, nodes, settings, verify=False)
        verified = render(machine, workload, nodes, settings, verify=True)
        rows.append({"plan": name, "analytic": analytic, "verified": verified})
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    out = HERE / "results" / "verify_layouts.json"
    saved = {"plans": plans(), "plans_date": time.strftime("%Y-%m-%d")}
    out.write_text(json.dumps(saved, indent=1) + "\n")
