"""Context parallel in the Llama trainer (`--set cp=C`): each sequence split over C ranks, keys
and values gathered (trainers/context.py). On CPU (gloo), 4 ranks, fp32, one seed and global
batch: dp4, dp2 x cp2, cp4, tp2 x cp2 and pp2 x cp2 give the same loss at every step and the
same validation loss; a run saved at cp=2 resumes at cp=1 with every sample once; the plan
refuses a split the trainer could not make and names cp where a long sequence does not fit."""

from __future__ import annotations

import shutil

import pytest
import torch

from test_pipeline import TINY, losses, trained
from test_trainers import launch, steps

LAYOUTS = {
    "dp4": [],
    "dp2 x cp2": ["--cp", "2"],
    "cp4": ["--cp", "4"],
    "tp2 x cp2": ["--tp", "2", "--cp", "2"],
    "pp2 x cp2": ["--pp", "2", "--cp", "2"],
}


@pytest.mark.slow
def test_every_layout_with_context_parallel_gives_the_same_loss_and_a_cp2_run_resumes_at_cp1(
        tmp_path):
    found = {}
    args = [*TINY, "--steps", "10", "--eval-every", "5", "--eval-samples", "13",
            "--checkpoint-every", "5"]
    for name, layout in LAYOUTS.items():
        out = tmp_path / name.replace(" ", "")
        proc = launch("llama3", [*args, *layout], 4, "torchrun", out)
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
        found[name] = {**losses(out), **{-s: v for s, v in losses(out, "val_loss").items()}}
        assert trained(out) == list(range(80)), name  # 10 steps x 8 samples, each once
    reference = found["dp4"]
    assert sorted(reference) == [-10, -5, *range(1, 11)]
    for name, curve in found.items():
        for step, loss in reference.items():
            assert curve[step] == pytest.approx(loss, rel=1e-4), (name, step)

    # The dp2 x cp2 run's step-5 checkpoint, resumed without context parallel.
    resumed = tmp_path / "cp2-then-dp4"
    shutil.copytree(tmp_path / "dp2xcp2", resumed)
    (resumed / "run" / "checkpoints" / "latest").write_text("step-5")
    proc = launch("llama3", [*args, "--resume"], 4, "torchrun", resumed)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[resume] step=5" in proc.stdout
    after = losses(resumed)
    for step in range(6, 11):
        assert after[step] == pytest.approx(found["dp2 x cp2"][step], rel=1e-5), step
    assert trained(resumed) == list(range(80))  # every sample once across the layouts


@pytest.mark.slow
def test_compiled_blocks_under_context_parallel_train_like_eager_ones(tmp_path):
    """The gather of keys and values breaks a compiled block's graph: compiled in parts there,
    the run has the eager one's losses."""
    common = ["--tiny", "--cp", "2", "--steps", "4", "--dtype", "fp32", "--seq-len", "32"]
    runs = {name: launch("llama3", [*common, *extra], 2, "torchrun", tmp_path / name)
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
def test_a_split_the_trainer_cannot_make_is_refused_before_the_queue(cli, isolated, sets, said):
    args = [item for s in sets for item in ("--set", s)]
    result = cli("submit", "slurm-local", "llama3_debug", "-N", "2", *args)
    assert result.code == 2 and said in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1
    assert not (isolated.parent / "state" / "mmm-orch").exists()


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
