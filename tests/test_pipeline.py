"""Pipeline parallel in the Llama trainer (`--set pp=P`, `pp_schedule`): on CPU (gloo), 4 ranks,
fp32, one seed and global batch, dp2 x pp2, tp2 x pp2, pp4 interleaved and GPipe give one
process's loss at every step and its validation loss; a run saved at pp=2 resumes at pp=1 (dp4)
and at pp=4 with every sample once (test_context_parallel: its pp2 x cp2 run's checkpoint); the
plan refuses a pipeline the trainer could not make and sizes the busiest stage; live, pp across
the two nodes of the Slurm cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.jobs import wait_state
from helpers.layouts import (
    LAYOUT_RUNS,
    PIPELINE_LAYOUTS,
    assert_gives_one_process_s_losses,
    assert_refused_before_the_queue,
    losses,
)
from helpers.training import launch


@pytest.mark.slow
@LAYOUT_RUNS
@pytest.mark.parametrize("name", PIPELINE_LAYOUTS)
def test_each_pipeline_layout_gives_one_process_s_losses(tmp_path_factory, name):
    assert_gives_one_process_s_losses(tmp_path_factory, PIPELINE_LAYOUTS[name])


def test_the_layers_split_into_stages_of_as_many_each():
    from mmm_orch.models.layout import stage_layers

    assert stage_layers(8, 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert stage_layers(80, 1) == [list(range(80))]
    with pytest.raises(ValueError, match="8 layers do not split into 3 pipeline stages"):
        stage_layers(8, 3)


@pytest.mark.parametrize(
    "sets,said",
    [
        (
            ["tiny=true", "pp=4", "global_batch=16"],
            "pp 4 is invalid: a divisor of the model's 2 layers",
        ),
        (["tiny=true", "pp=3"], "pp 3 is invalid: tp x pp = 3 must divide the 4 ranks"),
        (["tiny=true", "pp=2", "tp=2", "n_layers=4"], "at least pp 2 micro-batches"),
        (["pp=2", "pp_schedule=zero_bubble"], "option pp_schedule='zero_bubble' is invalid"),
        (
            [
                "tiny=true",
                "n_layers=8",
                "pp=2",
                "pp_schedule=interleaved_1f1b",
                "global_batch=24",
                "batch_size=4",
            ],
            "a multiple of pp 2 (interleaved_1f1b)",
        ),
    ],
)
def test_a_pipeline_the_trainer_cannot_make_is_refused_before_the_queue(cli, sets, said):
    assert_refused_before_the_queue(cli, sets, said)


def memory_line(cli, *args: str) -> str:
    result = cli("render", "polaris", "llama3_70b", "-A", "P1", *args)
    assert result.code == 0, result.err
    return next(line for line in result.out.splitlines() if line.startswith("# Memory per device"))


def test_the_memory_plan_sizes_the_busiest_stage(cli, isolated, monkeypatch):
    """70B on Polaris: a pipeline keeps the states per device (FSDP shards them over every rank
    either way), and its whole stage gathered with fp32 gradients through a step (torch's
    schedule holds FSDP's resharding and gradient sync to the last micro-batch: --verify found
    it); GPipe's step of micro-batches in flight costs what 1F1B's pp do not."""
    plain = memory_line(cli, "-N", "16")
    assert "26.0 GiB of 40" in plain and "activations 2.5" in plain, plain
    piped = memory_line(cli, "-N", "64", "--set", "pp=4", "--set", "global_batch=256")
    # 20 layers of 856M parameters and the 1.05B embedding, over tp 4, in bf16 and fp32
    assert "gathered 25.4" in piped and "activations 2.5" in piped, piped
    monkeypatch.setenv("MMM_ORCH_MEMORY_CHECK", "0")
    gpipe = memory_line(
        cli, "-N", "64", "--set", "pp=4", "--set", "global_batch=256", "--set", "pp_schedule=gpipe"
    )
    assert "activations 10.0" in gpipe, gpipe
    monkeypatch.delenv("MMM_ORCH_MEMORY_CHECK")
    refused = cli(
        "render",
        "polaris",
        "llama3_70b",
        "-A",
        "P1",
        "-N",
        "16",
        "--set",
        "pp=4",
        "--set",
        "global_batch=64",
    )
    assert refused.code == 2 and "gathered 25.4" in refused.err, refused.err
    assert "it fits with -N 64 (36 GiB)" in refused.err, refused.err


@pytest.mark.live
@pytest.mark.slow
def test_on_slurm_the_pipeline_spans_the_two_nodes(
    cli, isolated, slurm_cluster, leftovers_cancelled, tmp_path
):
    """pp outermost: stage 0 on the first node's two ranks, stage 1 on the second's; the loss
    is the one a single process gives here for the same global batch; profiled, each node's
    first rank (one stage each) shows the bubble, and so does the report."""
    sets = [
        "tiny=true",
        "n_layers=4",
        "dtype=fp32",
        "global_batch=8",
        "batch_size=2",
        "seq_len=32",
        "steps=4",
    ]
    args = [
        item for s in [*sets, "pp=2", "profile=torch", "profile_steps=2:3"] for item in ("--set", s)
    ]
    result = cli("submit", "slurm-local", "llama3_debug", "-N", "2", *args, "--json")
    assert result.code == 0, result.err
    job = json.loads(result.out)
    assert wait_state(cli, job["id"], timeout=600)["state"] == "completed", cli(
        "logs", str(job["id"])
    ).out[-3000:]
    across = {
        r["step"]: r["loss"]
        for r in map(json.loads, (Path(job["run_dir"]) / "metrics.jsonl").read_text().splitlines())
        if r["event"] == "step"
    }
    local = tmp_path / "local"
    argv = [
        "--tiny",
        "--n-layers",
        "4",
        "--dtype",
        "fp32",
        "--global-batch",
        "8",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--steps",
        "4",
    ]
    proc = launch("llama3", argv, 1, "none", local)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = losses(local)
    assert sorted(across) == [1, 2, 3, 4]
    for step, loss in reference.items():
        assert across[step] == pytest.approx(loss, rel=1e-4), step
    shown = json.loads(cli("profile", str(job["id"]), "--json").out)
    assert [r["rank"] for r in shown["ranks"]] == [0, 2]
    assert all(r["shares"]["bubble"] > 0 for r in shown["ranks"]), shown
    report = json.loads(
        cli("report", str(job["id"]), "--json", "--out", str(tmp_path / "report")).out
    )
    assert report[0]["bubble_pct"] > 0, report
