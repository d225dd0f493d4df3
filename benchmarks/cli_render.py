"""Cold wall time of `mmm-orch render` against `torchx run --dryrun`, side by side in one run.

Each tool lives in its own virtualenv (benchmarks/.venvs/, made on first use): mmm-orch installed
non-editable from this checkout, TorchX from PyPI with torch==2.13.0. Every sample is a new
process; the commands alternate so that machine noise hits them alike. `--baseline DIR` measures
another checkout of mmm-orch (an earlier commit: `git worktree add DIR REV`) in the same run, for
"no slower than before".

    python benchmarks/cli_render.py [--runs 25] [--baseline DIR]
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
VENVS = ROOT / "benchmarks" / ".venvs"
RENDER = ["render", "aurora", "llama3_8b", "--nodes", "4", "--account", "MYPROJ"]
TORCHX = ["run", "--dryrun", "-s", "slurm", "utils.echo", "--msg", "hi"]


def venv(name: str, packages: list[str]) -> Path:
    path = VENVS / name
    if not (path / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(path / "bin" / "pip"), "install", "-q", *packages], check=True)
    return path / "bin"


def installed(checkout: Path, name: str) -> Path:
    """A virtualenv of mmm-orch from `checkout`, reinstalled so that it measures that tree."""
    mmm = venv(name, [str(checkout)])
    subprocess.run([str(mmm / "pip"), "install", "-q", "--force-reinstall", "--no-deps", str(checkout)],
                   check=True)
    return mmm


def without_pbs(path: str) -> tuple[str, list[str]]:
    """PATH without the directories holding a PBS's qsub, and those directories. Where qsub is
    found, render counts the user's queued jobs against Aurora's job limits as a submission
    would (`id`, `qselect` and `qstat`: a round trip to the server, or seconds of retries while
    it is down), which TorchX's --dryrun never does: both tools run as on a host that is not a
    PBS login node, as the tests' reviews do."""
    dirs = path.split(os.pathsep)
    dropped = [d for d in dirs if d and os.path.exists(os.path.join(d, "qsub"))]
    return os.pathsep.join(d for d in dirs if d not in dropped), dropped


def sample(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--baseline", type=Path, help="another mmm-orch checkout to measure beside")
    args = parser.parse_args()

    mmm = installed(ROOT, "mmm-orch")
    torchx = venv("torchx", ["torch==2.13.0", "torchx"])
    version = subprocess.run([str(torchx / "python"), "-c", "import torchx; print(torchx.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()

    cache = tempfile.mkdtemp(prefix="mmm-bench-cache-")
    path, dropped = without_pbs(os.environ.get("PATH", ""))
    plain_env = {**os.environ, "PATH": path}
    base_env = {**plain_env, "XDG_CACHE_HOME": cache}
    commands = {
        "mmm-orch render (config cache warm)": ([str(mmm / "mmm-orch"), *RENDER], base_env),
        "mmm-orch render (first run: validate + fill cache)": ([str(mmm / "mmm-orch"), *RENDER], None),
        f"torchx {version} run --dryrun": ([str(torchx / "torchx"), *TORCHX], base_env),
    }
    if args.baseline:
        before = installed(args.baseline.resolve(), "mmm-orch-baseline")
        commands["baseline render (config cache warm)"] = ([str(before / "mmm-orch"), *RENDER], base_env)
    for cmd, env in commands.values():  # warm the OS file cache and mmm-orch's config cache
        sample(cmd, env or base_env)

    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, (cmd, env) in commands.items():
            times[name].append(sample(cmd, env or {**plain_env, "XDG_CACHE_HOME": tempfile.mkdtemp()}))

    torchx_median = statistics.median(times[f"torchx {version} run --dryrun"])
    rows = []
    for name, values in times.items():
        values.sort()
        median = statistics.median(values)
        rows.append({"command": name, "median_ms": round(median * 1000, 1),
                     "min_ms": round(values[0] * 1000, 1),
                     "p90_ms": round(values[int(0.9 * (len(values) - 1))] * 1000, 1),
                     "ratio_to_torchx": round(median / torchx_median, 2)})
    print(f"{args.runs} runs each, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"off PATH: {', '.join(dropped) or 'nothing'}")
    print("| command | median ms | min ms | p90 ms | x TorchX |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['command']} | {r['median_ms']} | {r['min_ms']} | {r['p90_ms']} | {r['ratio_to_torchx']} |")
    out = ROOT / "benchmarks" / "results" / "cli_render.json"
    baseline = None  # the baseline's commit, not where it was checked out
    if args.baseline:
        baseline = subprocess.run(["git", "-C", str(args.baseline), "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True).stdout.strip() or None
    out.write_text(json.dumps({"runs": args.runs, "off_path": dropped, "baseline": baseline,
                               "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
