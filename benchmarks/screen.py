"""The screen's cost and what it finds, on this host (root: a cgroup v1 CPU quota makes a node slow).

1. Cost: the screen program (`python -m mmm_orch.injob.screen`) over 2, 4 and 8 stand-in nodes, a
   per-node launcher that starts one task per node here (as srun --ntasks-per-node=1 would),
   three times each; from its start to its verdict, as it reports it.
2. Detection: three stand-in nodes, the second held to a share of one CPU (100%, 50%, 25%, 10%,
   5%, 2%) by a cgroup's CPU quota, as the live test holds a Slurm node; the slow node's matrix
   figure over the others' median, its ring links' (the faster of its two) over the third
   link, and whether the profile thresholds (`of_median` 0.5 on the facilities, 0.2 on the
   test servers) leave it out. Five times each.

    sudo python benchmarks/screen.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CPU = Path("/sys/fs/cgroup/cpu")
GROUP = CPU / "mmm-orch-bench-slow"
FAN = """#!/bin/bash
# One task per stand-in node, its rank in PMI_RANK; the node SLOW (if any) held by the cgroup.
for ((r = 0; r < {nodes}; r++)); do
    if [[ $r -eq {slow} ]]; then
        (echo $BASHPID > {group}/tasks; PMI_RANK=$r exec "$@") &
    else
        PMI_RANK=$r "$@" &
    fi
done
wait
"""


def screen(nodes: int, slow: int = -1) -> dict:
    with tempfile.TemporaryDirectory() as work:
        job = Path(work)
        (job / "nodes.txt").write_text("".join(f"n{i}\n" for i in range(nodes)))
        fan = job / "fan.sh"
        fan.write_text(FAN.format(nodes=nodes, slow=slow, group=GROUP))
        fan.chmod(0o755)
        subprocess.run([sys.executable, "-m", "mmm_orch.injob.screen", "--dir", str(job),
                        "--active", "1", "--seconds", "120", "--of-median", "0.2",
                        "--per-node", str(fan), "--host-addr", "127.0.0.1"], check=True,
                       capture_output=True)
        return json.loads((job / "screen.json").read_text())


def main() -> None:
    GROUP.mkdir(exist_ok=True)
    (GROUP / "cpu.cfs_period_us").write_text("100000")
    print("| stand-in nodes | screen, median of 3 (s) | min | max |")
    print("|---|---|---|---|")
    for nodes in (2, 4, 8):
        costs = [screen(nodes)["seconds"] for _ in range(3)]
        print(f"| {nodes} | {statistics.median(costs):.2f} | {min(costs):.2f} | {max(costs):.2f} |")
    print()
    print("| node 2's share of a CPU | its matmul / the others' median (median of 5) | its "
          "faster link / the third link | left out at 0.5 | left out at 0.2 |")
    print("|---|---|---|---|---|")
    for share in (1.0, 0.5, 0.25, 0.1, 0.05, 0.02):
        (GROUP / "cpu.cfs_quota_us").write_text(str(int(100000 * share)) if share < 1 else "-1")
        ratios, links = [], []
        for _ in range(5):
            nodes = {n["node"]: n for n in screen(3, slow=1)["nodes"]}
            ratios.append(nodes["n1"]["of_median"])
            # n1's links: from n0 (its own figure) and to n2 (n2's); the third, n2 to n0
            links.append(max(nodes["n1"]["link_in"], nodes["n2"]["link_in"])
                         / nodes["n0"]["link_in"])
        left = [min(r, k) for r, k in zip(ratios, links, strict=True)]
        print(f"| {share:.0%} | {statistics.median(ratios):.2f} ({min(ratios):.2f}-"
              f"{max(ratios):.2f}) | {statistics.median(links):.2f} ({min(links):.2f}-"
              f"{max(links):.2f}) | {sum(v < 0.5 for v in left)}/5 | "
              f"{sum(v < 0.2 for v in left)}/5 |")
    (GROUP / "cpu.cfs_quota_us").write_text("-1")


if __name__ == "__main__":
    main()
