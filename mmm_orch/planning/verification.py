"""--verify: a plan's layout checked on this CPU before the queue. A workload whose trainer has a
check (its spec's layout_check) runs the trainer's own model and parallelization at the
job's world size under fake tensors and a fake process group (trainers/verify.py), for one rank
of each kind, in a Python of its own (torch is imported there, never by the planner).

What it finds is set beside the analytic plan (planning/memory.py) in the script's header, and
what cannot run is refused (MmmError, exit 2) before anything is written: a shape the layout
cannot make, a module left whole where the layout splits it, a pipeline stage with twice the
memory of another, a peak past the device's memory less the profile's headroom."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any

from mmm_orch.config.machine import Machine
from mmm_orch.config.registry import load_machine, load_workload
from mmm_orch.errors import MmmError
from mmm_orch.models.spec import GIB
from mmm_orch.planning.memory import compute_dtype
from mmm_orch.planning.model import (
    CollectiveCount,
    Plan,
    RankCheck,
    ShardShape,
    Verified,
    trainer_argv,
)

# How far the two may be apart before the header says which part differs: the plan's own error.
PLAN_ERROR = 0.25
# A stage this many times another's peak: the pipeline's split is refused.
STAGE_IMBALANCE = 2.0
# What the check may take (a 405B plan at 2048 ranks takes ~2 minutes on two cores).
TIMEOUT_S = 900


def where_wanted(plan: Plan, asked: bool) -> Plan:
    """`plan`, its layout checked where asked (--verify: MmmError where its workload has no
    check), or set by the user (MMM_ORCH_VERIFY=1) or the machine's profile (verify: true:
    a workload without a check is planned as it is); MmmError for what cannot run."""
    machine, workload = load_machine(plan.machine), load_workload(plan.workload)
    always = os.environ.get("MMM_ORCH_VERIFY") == "1" or machine.verify
    if not (asked or always):
        return plan
    if not workload.layout_check:
        if not asked:
            return plan
        raise MmmError(
            f"--verify: workload {plan.workload} has no layout check (its spec's layout_check "
            "is off); the in-repo trainers' workloads have one (llama3_*, fsdp_tp, vit, fsdp)"
        )
    return _verify(plan, machine, workload)


def _verify(plan: Plan, machine: Machine, workload) -> Plan:
    """`plan` carrying the check's figures; MmmError for what cannot run."""
    node = machine.node
    request = {
        "trainer": workload.trainer,
        "argv": list(trainer_argv(plan.launch.args)),
        "world_size": plan.layout.ranks,
        "ranks_per_node": plan.layout.ranks_per_node,
        "dtype": compute_dtype(machine, workload, plan.launch.args),
        "attention": node.attention_kernel,
        "device": {
            "flops": node.peak_tflops * 1e12 if node.peak_tflops else None,
            "memory_bandwidth": node.memory_tbs * 1e12 if node.memory_tbs else None,
            "network_bandwidth": node.network_gbs * 1e9 / max(node.gpus, 1)
            if node.network_gbs
            else None,
        },
    }
    started = time.perf_counter()
    report = _run(request)
    checked = _checked(report, time.perf_counter() - started)
    _refuse_faults(report, machine, checked)
    if plan.memory is not None:
        checked = dataclasses.replace(checked, disagreements=_disagreements(plan, checked))
    return dataclasses.replace(plan, verified=checked)


def _run(request: dict[str, Any]) -> dict[str, Any]:
    import subprocess  # a plan that is not checked never needs it

    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # its ranks run side by side, one a CPU
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mmm_orch.trainers.verify"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise MmmError(f"--verify: the check took more than {TIMEOUT_S} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if "No module named 'torch'" in proc.stderr:
            last = "it needs torch in this Python (pip install torch==2.13.0)"
        raise MmmError(f"--verify: the check failed: {last}")
    return json.loads(proc.stdout)


def _checked(report: dict[str, Any], seconds: float) -> Verified:
    ranks = []
    for found in report["ranks"]:
        if "fault" in found or "peak" not in found:
            continue
        ranks.append(
            RankCheck(
                kind=found["kind"],
                rank=found["rank"],
                peak={k: v / GIB for k, v in found["peak"].items()},
                collectives=tuple(
                    CollectiveCount(c["op"], c["group"], c["count"], c["bytes"] / GIB)
                    for c in found["collectives"]
                ),
                compute_s=found["compute_s"],
                network_s=found["network_s"],
                shards=tuple(
                    ShardShape(n, tuple(s["local"]), tuple(s["whole"]), _placed(s["placements"]))
                    for n, s in found["shards"].items()
                ),
            )
        )
    return Verified(tuple(ranks), report.get("torch", ""), seconds)


def _placed(placements: dict[str, str]) -> str:
    return " ".join(f"{dim}={p}" for dim, p in placements.items())


def _refuse_faults(report: dict[str, Any], machine: Machine, checked: Verified) -> None:
    """MmmError, one line naming the rank kind, the module and the numbers, for what cannot
    run."""
    for found in report["ranks"]:
        where = f"--verify: {found['kind']} (rank {found['rank']})"
        if found.get("fault") == "shape":
            module = f" in {found['module']}" if found.get("module") else ""
            raise MmmError(f"{where}: the layout fails{module}: {found['error']}")
        if found.get("fault") == "unsharded":
            left = found["modules"]
            more = f" and {len(left) - 1} more" if len(left) > 1 else ""
            raise MmmError(f"{where}: {left[0]}{more}: the layout leaves it unsplit")
    if len(checked.ranks) > 1:
        heaviest = max(checked.ranks, key=lambda r: r.total)
        lightest = min(checked.ranks, key=lambda r: r.total)
        if heaviest.total >= STAGE_IMBALANCE * lightest.total:
            raise MmmError(
                f"--verify: the {heaviest.kind} needs {heaviest.total:.2f} GiB, "
                f"{heaviest.total / lightest.total:.1f}x the {lightest.kind}'s "
                f"{lightest.total:.2f} GiB: the pipeline's stages are unbalanced (fewer "
                "stages, or more layers a stage)"
            )
    device = machine.node.gpu_memory_gib
    if device and os.environ.get("MMM_ORCH_MEMORY_CHECK") != "0":
        limit = device * (1 - machine.node.memory_headroom)
        top = checked.busiest
        if top.total > limit:
            raise MmmError(
                f"--verify: the {top.kind} (rank {top.rank}) peaks at {top.total:.1f} GiB, above "
                f"{limit:.1f} GiB ({device:g} GiB of one {machine.node.device} device less the "
                f"profile's {machine.node.memory_headroom:.0%} headroom; "
                "MMM_ORCH_MEMORY_CHECK=0 submits it anyway)"
            )


def _disagreements(plan: Plan, checked: Verified) -> tuple[str, ...]:
    """Where the analytic plan and the check differ by more than the plan's error: the totals,
    and the two sides' largest parts (they name them differently: MemTracker counts a gathered
    parameter as a parameter, and a gradient before its reduction as a temporary)."""
    assert plan.memory is not None
    planned, found = plan.memory.parts, checked.busiest
    if abs(found.total / plan.memory.total - 1) <= PLAN_ERROR:
        return ()

    def largest(parts: dict[str, float]) -> str:
        name, size = max(parts.items(), key=lambda kv: kv[1])
        return f"{name} {size:.1f}"

    return (
        f"the plan's {plan.memory.total:.1f} GiB and the check's {found.total:.1f} GiB (the "
        f"{found.kind}) differ by more than {PLAN_ERROR:.0%}; largest parts: planned "
        f"{largest(planned)}, checked {largest(found.peak)}",
    )
