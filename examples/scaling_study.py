"""A small scaling study driven from Python, as a notebook would: a sweep of the FSDP MNIST
trainer over node counts and batch sizes, waited for, then reported (rows printed, report.html
written). Copy it and change the machine, workload and grid.

    python examples/scaling_study.py                          # this computer (local executor)
    python examples/scaling_study.py --machine slurm-local --nodes 1,2
    python examples/scaling_study.py --machine polaris --nodes 1,2,4 --account MYPROJ
"""

from __future__ import annotations

import argparse

import mmm_orch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", default="local")
    parser.add_argument("--nodes", default="1", help="node counts, comma-separated")
    parser.add_argument("--account", default=None)
    parser.add_argument("--out", default="scaling-report")
    args = parser.parse_args()

    study = mmm_orch.sweep(
        args.machine, "fsdp", account=args.account,
        nodes=[int(n) for n in args.nodes.split(",")],
        grid={"batch_size": [32, 64]},
        options={"epochs": 1, "train_samples": 512})
    print(f"sweep {study.id}: jobs {', '.join(str(job.id) for job in study.jobs)}")

    for job in study.jobs:
        job.wait(timeout=1800)
        print(f"  job {job.id} {job.state} (exit {job.exit_code}): {job.reason or ''}")

    rows = mmm_orch.report(study, out=args.out)
    for row in rows:
        print(f"  job {row['job']}: {row['point']}, {row['ranks']} ranks, step "
              f"{row['step_ms']} ms, {row['throughput']} {row['unit']} per device")
    print(f"report: {args.out}/report.html")
    return 0 if all(job.state == "completed" for job in study.jobs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
