"""Context parallel in the Llama trainer (`--set cp=C`): each sequence split over C ranks, keys
and values gathered (trainers/context.py). On CPU (gloo), 4 ranks, fp32, one seed and global
batch: dp2 x cp2, cp4, tp2 x cp2 and pp2 x cp2 give one process's loss at every step and its
validation loss (the reference run shared with test_pipeline's layouts); a run saved at pp2 x cp2
resumes at cp=1, on dp4 and on pp4, with every sample once; the plan refuses a split the trainer
could not make and names cp where a long sequence does not fit."""

from __future__ import annotations

import shutil

import pytest
import torch

from helpers.layouts import (
    ARGS,
    LAYOUT_RUNS,
    PIPELINE_LAYOUTS,
    assert_gives_one_process_s_losses,
    assert_refused_before_the_queue,
    curves,
    layout_run,
    trained,
)
from helpers.training import launch, steps

# Each layout makes a step of the same global batch (8) in two micro-batches a rank, as dp4 does:
# where context parallel leaves one data-parallel rank, 8 micro-batches of one sample each paid
# TP's, CP's and FSDP's collectives again (tp2 x cp2 took 236 CPU-seconds, dp4 42).
LAYOUTS = {
    "dp2 x cp2": ["--cp", "2", "--batch-size", "2"],
    "cp4": ["--cp", "4", "--batch-size", "4"],
    "tp2 x cp2": ["--tp", "2", "--cp", "2", "--batch-size", "4"],
    "pp2 x cp2": ["--pp", "2", "--cp", "2", "--batch-size", "4"],
}
# Where the pp2 x cp2 run's checkpoint is resumed: without context parallel, at pp=1 and at pp=4.
RESUMED_ON = {"dp4": [], "pp4 interleaved": PIPELINE_LAYOUTS["pp4 interleaved"]}


@pytest.mark.slow
@LAYOUT_RUNS
@pytest.mark.parametrize("name", LAYOUTS)
def test_each_layout_with_context_parallel_gives_one_process_s_losses(tmp_path_factory, name):
    assert_gives_one_process_s_losses(tmp_path_factory, LAYOUTS[name])


@pytest.mark.slow
@LAYOUT_RUNS
@pytest.mark.parametrize("name", RESUMED_ON)
def test_a_pp2_x_cp2_run_resumes_on_another_layout(tmp_path_factory, name, tmp_path):
    """The pp2 x cp2 run's step-2 checkpoint (two stages, each sequence split over two ranks),
    resumed on dp4 (one stage, whole sequences) and on pp4 interleaved (eight stages): the same
    losses and validation loss after it (and so dp4's are one process's too), every sample once
    across the two layouts."""
    saved = layout_run(tmp_path_factory, LAYOUTS["pp2 x cp2"])
    resumed = tmp_path / "resumed"
    shutil.copytree(saved, resumed)
    (resumed / "run" / "checkpoints" / "latest").write_text("step-2")
    proc = launch("llama3", [*ARGS, *RESUMED_ON[name], "--resume"], 4, "torchrun", resumed)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[resume] step=2" in proc.stdout
    after, before = curves(resumed), curves(saved)
    for step in (3, 4, -4):  # -4: the validation at step 4
        assert after[step] == pytest.approx(before[step], rel=1e-5), step
    assert trained(resumed) == list(range(32))


@pytest.mark.slow
def test_compiled_blocks_under_context_parallel_train_like_eager_ones(tmp_path):
    """The gather of keys and values breaks a compiled block's graph: compiled in parts there,
    the run has the eager one's losses."""
    common = ["--tiny", "--cp", "2", "--steps", "4", "--dtype", "fp32", "--seq-len", "32"]
    # (the limit catches a hang: inductor's compile alone takes minutes on a loaded 2-core host)
    runs = {name: launch("llama3", [*common, *extra], 2, "torchrun", tmp_path / name, timeout=600)
            for name, extra in (("compiled", ["--compile"]), ("eager", []))}
    for name, proc in runs.items():
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
    a, b = ([r["loss"] for r in steps(tmp_path / name)] for name in runs)
    assert a[0] == pytest.approx(b[0], abs=1e-5)  # same weights, same batch
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 0.02, (a, b)


def test_each_rank_holds_two_chunks_that_balance_the_causal_work():
    from mmm_orch.trainers.context import ContextShard

    sequence = torch.arange(16).view(1, 16)
    held = {rank: ContextShard(None, rank, 4).split(sequence)[0].tolist()  # type: ignore[arg-type]
            for rank in range(4)}
    assert held == {0: [0, 1, 14, 15], 1: [2, 3, 12, 13], 2: [4, 5, 10, 11], 3: [6, 7, 8, 9]}
    # The keys each rank's queries attend to, summed: the same on every rank.
    assert {sum(p + 1 for p in positions) for positions in held.values()} == {34}
    shard = ContextShard(None, 1, 2)  # type: ignore[arg-type]
    assert shard.positions(4, torch.device("cpu")).tolist() == [2, 3, 4, 5]


@pytest.mark.parametrize("sets,said", [
    (["tiny=true", "cp=3"], "cp 3 is invalid: tp x pp x cp = 3 must divide the 4 ranks"),
    (["tiny=true", "cp=4", "seq_len=36"],
     "cp 4 is invalid: a divisor of half the sequence length 36"),
    (["tiny=true", "cp=2", "tp=2", "pp=2"], "tp x pp x cp = 8 must divide the 4 ranks"),
])
def test_a_split_the_trainer_cannot_make_is_refused_before_the_queue(cli, sets, said):
    assert_refused_before_the_queue(cli, sets, said)


def test_the_memory_plan_splits_a_long_sequence_and_names_cp_where_it_fits(cli, isolated):
    """Llama 3.1 8B at 128K tokens on Polaris's 40 GiB A100s: refused without context parallel,
    naming the cp that fits; at cp=4 each rank's activations are a quarter (k and v whole)."""
    long = ["--set", "config=3.1-8b", "--set", "seq_len=131072", "--set", "ac=full"]
    refused = cli("render", "polaris", "llama3_8b", "-A", "P1", "-N", "4", *long)
    assert refused.code == 2, refused.out[-500:]
    assert "65.4 GiB" in refused.err and "it fits with --set cp=2 (39 GiB)" in refused.err, \
        refused.err
    split = cli("render", "polaris", "llama3_8b", "-A", "P1", "-N", "4", *long, "--set", "cp=4")
    assert split.code == 0, split.err
    assert "cp=4 (each sequence split over 4 ranks)" in split.out
    memory = next(line for line in split.out.splitlines() if line.startswith("# Memory per"))
    assert "activations 8.0" in memory, memory
