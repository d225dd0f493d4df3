"""--verify: a trainer's own model and step at the job's world size under fake tensors and a
fake process group (trainers/verify.py), beside the analytic plan in the script's header where
the model has one, and what cannot run refused before anything is written. Run as a user runs it: the CLI, whose
check runs in a Python of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers.cli import run_cli
from helpers.training import checked_under_fake_tensors

TINY = [
    "--config",
    "debug",
    "--n-layers",
    "4",
    "--seq-len",
    "256",
    "--batch-size",
    "4",
    "--dtype",
    "fp32",
]


def verify(world: int, *argv: str) -> dict:
    return checked_under_fake_tensors(("llama3", [*TINY, *argv], world))[0]


@pytest.mark.slow
def test_a_user_who_always_verifies_gets_the_checked_peak_beside_the_estimate(tmp_path):
    """MMM_ORCH_VERIFY=1 (the user's setting; a profile's is `verify: true`), no --verify."""
    proc = run_cli(
        "submit",
        "local",
        "llama3_debug",
        "--set",
        "tp=2",
        "--set",
        "n_layers=2",
        "--dry-run",
        cwd=tmp_path,
        env={"MMM_ORCH_VERIFY": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    header = [line for line in proc.stdout.splitlines() if line.startswith("# Memory per device")]
    assert header[0].startswith("# Memory per device (estimate, +-25%)")
    assert header[1].startswith("# Memory per device (verified"), header
    assert "reduce_scatter_tensor over 2" in proc.stdout  # FSDP's, over the two ranks
    shards = next(line for line in proc.stdout.splitlines() if "#     shards" in line)
    assert "layers.0.attention.wq.weight 256x256 as 128x256 (dp=" in shards, shards
    assert "layers.1." not in shards  # one block stands for the others


@pytest.mark.slow
def test_the_other_trainers_are_checked_and_their_faults_refused(tmp_path):
    """The ViT (no analytic plan: the check alone in the header) and fsdp_tp, whose 3 heads
    cannot be cut over tp 2: refused in the attention's q projection, nothing written."""
    proc = run_cli("submit", "local", "vit", "--verify", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    header = [line for line in proc.stdout.splitlines() if line.startswith("# Memory per device")]
    assert len(header) == 1 and header[0].startswith("# Memory per device (verified"), header
    assert "blocks.0.qkv.weight" in proc.stdout and "blocks.1." not in proc.stdout
    refused = run_cli("submit", "local", "fsdp_tp", "--set", "tp=2", "--set", "dim=96", "--set",
                      "n_heads=3", "--set", "n_kv_heads=3", "--verify", "--dry-run", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "--verify: first rank (rank 0): the layout fails in layers.0.attention.wq" \
        in refused.stderr, refused.stderr
    assert not refused.stdout and not list(tmp_path.rglob("jobs.db"))


@pytest.mark.slow
def test_the_workloads_that_say_they_have_a_check_are_those_whose_trainer_has_one():
    """layout_check: true where the trainer has a `layout` (verify.py calls it), and only there."""
    import importlib

    from mmm_orch.config.registry import load_workload, names

    for name in names("workloads"):
        workload = load_workload(name)
        if workload.trainer:
            has = hasattr(importlib.import_module(workload.trainer), "layout")
            assert workload.layout_check == has, name


def test_a_workload_without_a_check_is_refused_when_asked(cli, isolated):
    result = cli("submit", "local", "dist_check", "--verify", "--dry-run")
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert "--verify: workload dist_check has no layout check" in result.err


API = """
import mmm_orch.api as api
plan = api.plan("local", "llama3_debug", options={"tp": 2, "n_layers": 2}, verify=True)
first = plan.verified.ranks[0]
print(first.kind, sum(first.peak.values()) > 0, len(first.shards))
"""


@pytest.mark.slow
def test_the_api_verifies_a_plan(tmp_path):
    proc = subprocess.run([sys.executable, "-c", API], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["first", "rank", "True", "21"], proc.stdout


@pytest.mark.slow
def test_a_tp_degree_that_does_not_divide_the_heads_is_a_shape_fault():
    """debug's 16 heads over tp 6: the first rank's q projection cannot be cut into heads."""
    report = verify(6, "--tp", "6")
    first = report["ranks"][0]
    assert first["fault"] == "shape" and first["module"] == "layers.0.attention.wq", first


@pytest.mark.slow
def test_the_shards_are_the_layouts_and_a_pipeline_rank_holds_its_stage():
    report = verify(4, "--tp", "2", "--pp", "2", "--global-batch", "16")
    stage0, stage1 = report["ranks"]
    assert stage0["kind"] == "first rank of pp rank 0" and stage1["kind"] == "first rank of pp rank 1"
    wq = stage0["shards"]["layers.0.attention.wq.weight"]
    assert wq["whole"] == [256, 256] and wq["local"] == [128, 256]  # tp 2 over the rows
    assert "tok_embeddings.weight" in stage0["shards"] and "output.weight" in stage1["shards"]
    assert "layers.2.attention.wq.weight" in stage1["shards"]
    assert "layers.2.attention.wq.weight" not in stage0["shards"]
    for rank in report["ranks"]:
        assert rank["peak"]["optimizer"] > 0 and rank["peak"]["activations"] > 0


def test_a_tp_degree_that_does_not_divide_the_heads_is_refused_by_the_plan(cli, isolated):
    """70B's 64 heads and 8 key-value heads over tp 12 (Aurora's 12 tiles a node)."""
    result = cli("submit", "aurora", "llama3_70b", "--nodes", "64", "-A", "P", "--set", "tp=12",
                 "--dry-run")
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert "tp 12 is invalid: a divisor of the model's 64 attention heads and 8 key-value heads" \
        in result.err


def test_a_sequence_context_parallel_cannot_split_is_refused_by_the_plan(cli, isolated):
    result = cli("submit", "aurora", "llama3_8b", "-A", "P", "--set", "cp=3", "--dry-run")
    assert result.code == 2 and "cp 3 is invalid: a divisor of half the sequence length" \
        in result.err, result.err


@pytest.mark.slow
def test_a_pipeline_with_its_weight_in_one_stage_is_refused(tmp_path):
    """A 65536-word vocabulary on four stages of one layer each: the last stage's output layer
    and logits dwarf a middle stage's block."""
    proc = run_cli("submit", "slurm-local", "llama3_debug", "-N", "2", "--set", "pp=4",
                   "--set", "n_layers=4", "--set", "vocab_size=65536", "--set", "seq_len=256",
                   "--set", "batch_size=2", "--set", "global_batch=8", "--dry-run", "--verify",
                   cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--verify: the first rank of pp rank 3 needs " in proc.stderr
    assert "the pipeline's stages are unbalanced" in proc.stderr and not proc.stdout


@pytest.mark.slow
def test_a_plan_the_estimate_fits_but_the_check_finds_past_the_device_is_refused(tmp_path):
    """8B on 4 Polaris nodes: estimated at 37 GiB of an A100's 40, checked at 38.4 GiB, past its
    40 GiB less the profile's 10% headroom; nothing written."""
    proc = run_cli("submit", "polaris", "llama3_8b", "-N", "4", "-A", "P", "--dry-run",
                   "--verify", cwd=tmp_path, timeout=600)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--verify: the first rank (rank 0) peaks at 38.4 GiB, above 36.0 GiB (40 GiB of one " \
        "cuda device less the profile's 10% headroom" in proc.stderr
    assert not proc.stdout and not list(tmp_path.rglob("jobs.db"))


UNSHARDED = """
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
from torch.testing._internal.distributed.fake_pg import FakeStore
from mmm_orch.trainers.verify import unsharded
dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
with torch.device("meta"):
    block = nn.ModuleDict({"wq": nn.Linear(8, 8), "wk": nn.Linear(8, 8)})
parallelize_module(block, mesh, {"wq": ColwiseParallel()})  # wk forgotten
print(unsharded(block, tp=4, dp=1))
"""


@pytest.mark.slow
def test_a_linear_layer_the_tp_plan_forgot_is_named():
    proc = subprocess.run([sys.executable, "-c", UNSHARDED], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "['wk (whole over tp 4)']", proc.stdout


@pytest.mark.slow
def test_a_sweep_verifies_each_point_and_refuses_the_one_that_cannot_run(tmp_path):
    """Every point is checked; a point that cannot run is refused, named, before anything runs."""
    proc = run_cli("sweep", "slurm-local", "llama3_debug", "--nodes", "1", "--set", "n_layers=2",
                   "--set", "tp=2,1", "--dry-run", "--verify", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    refused = run_cli("sweep", "slurm-local", "llama3_debug", "--nodes", "2", "--set",
                      "n_layers=4", "--set", "pp=4", "--set", "vocab_size=65536", "--set",
                      "seq_len=256", "--set", "batch_size=2", "--set", "global_batch=8",
                      "--dry-run", "--verify", cwd=tmp_path)
    assert refused.returncode == 2 and "global_batch=8): --verify: the first rank of pp rank 3" \
        in refused.stderr, \
        refused.stderr
