"""The job scripts of every facility machine x workload, as a submission places them, against
the scripts kept in tests/fixtures/scripts/: a refactoring must leave them byte for byte as they
were. A change meant to alter the scripts regenerates them (and shows the diff for review):

    MMM_ORCH_REGENERATE_SCRIPTS=1 .venv/bin/python -m pytest tests/test_rendered_scripts.py
"""

from __future__ import annotations

import os

import pytest

from helpers import REPO
from helpers.profiles import facility_profiles
from mmm_orch.errors import MmmError
from mmm_orch.submission.chains import link_plans
from mmm_orch.planning import Request, resolve
from mmm_orch.rendering import render

KEPT = REPO / "tests" / "fixtures" / "scripts"
WORKLOADS = ["dist_check", "fsdp", "fsdp_tp", "llama3_8b", "llama3_70b", "llama3_debug", "vit"]
JOB_DIR = "/home/user/.local/state/mmm-orch/jobs/20261125-120000-abcd"
VARIANTS = {
    "plain": {},
    "spare": {"nodes": 2, "spare_nodes": 1, "avoid_nodes": ("x1000c0s0b0n0",)},
    "staged": {"stage_env": True, "env": (("MY_FLAG", "it's on"),)},
}


def _scripts() -> dict[str, str]:
    """Every machine, workload and variant. The memory check is off: 2 nodes do not hold the 8B
    and 70B models on 40 GB devices, and the scripts show the estimate all the same (refusals
    are tested in test_memory_plan.py)."""
    previous = os.environ.get("MMM_ORCH_MEMORY_CHECK")
    os.environ["MMM_ORCH_MEMORY_CHECK"] = "0"
    try:
        return _rendered()
    finally:
        if previous is None:
            del os.environ["MMM_ORCH_MEMORY_CHECK"]
        else:
            os.environ["MMM_ORCH_MEMORY_CHECK"] = previous


def _rendered() -> dict[str, str]:
    out = {}
    for machine in facility_profiles():
        for workload in WORKLOADS:
            for variant, options in VARIANTS.items():
                request = Request(machine=machine, workload=workload, account="proj1",
                                  workdir="/project/run", **options)
                try:
                    plan = resolve(request)
                except MmmError:
                    continue  # a workload the machine cannot run: refusals are tested elsewhere
                placed = plan.placed(JOB_DIR, "20261125-120000-abcd", f"{JOB_DIR}/job.log")
                out[f"{machine}.{workload}.{variant}.sh"] = render(placed)
                if variant == "plain" and {"run_name", "resume"} <= set(plan.launch.options):
                    second = link_plans(placed, 3, "/project/chain/chain.json", "run-1",
                                        "/project/run")[1].waiting_for("4242")
                    out[f"{machine}.{workload}.chain-link-2.sh"] = render(second)
    return out


def test_the_scripts_are_the_ones_kept():
    scripts = _scripts()
    if os.environ.get("MMM_ORCH_REGENERATE_SCRIPTS"):
        KEPT.mkdir(parents=True, exist_ok=True)
        for old in KEPT.glob("*.sh"):
            old.unlink()
        for name, text in scripts.items():
            (KEPT / name).write_text(text)
    kept = {path.name: path.read_text() for path in KEPT.glob("*.sh")}
    assert sorted(scripts) == sorted(kept)
    assert len(scripts) > 60
    for name, text in scripts.items():
        assert text == kept[name], f"{name} differs from tests/fixtures/scripts/{name}"


@pytest.mark.parametrize("machine", facility_profiles())
def test_the_kept_scripts_carry_the_plan(machine):
    """The kept scripts are the real thing, not empty files: each names its job, its walltime
    and its launch."""
    for path in KEPT.glob(f"{machine}.*.sh"):
        text = path.read_text()
        assert text.startswith("#!/bin/bash") and "walltime" in text and "[mmm-orch] launch" in text


def test_a_recorded_plan_holds_what_asdict_gives():
    """Plan.to_dict walks the plan without deep copies (its leaves are plain values): for every
    plan above it must equal dataclasses.asdict, so a section with another kind of leaf shows."""
    import dataclasses

    from mmm_orch.planning.model import _plain

    for machine in facility_profiles():
        for workload in WORKLOADS:
            for options in VARIANTS.values():
                try:
                    plan = resolve(Request(machine=machine, workload=workload, account="proj1",
                                           max_node_hours=10**6, **options))
                except MmmError:
                    continue
                assert _plain(plan) == dataclasses.asdict(plan), (machine, workload, options)
