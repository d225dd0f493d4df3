"""Memory per device before the queue: the plan's estimate (planning/memory.py) against the
peak the trainer really reaches on CPU, the header and --dry-run that show it, and the plans it
refuses with their numbers and the changes that fit."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from pathlib import Path

import pytest
from helpers.profiles import facility_profiles
from helpers.training import checked_under_fake_tensors, free_port, launch, run_training, steps

from mmm_orch.models.llama3.args import PRESETS
from mmm_orch.models.llama3.memory import estimate
from mmm_orch.models.spec import GIB, Shape

HERE = Path(__file__).resolve().parent
SMALL = dataclasses.replace(PRESETS["debug"].model, n_layers=4)  # 256 wide, vocabulary 2048


CASES = [  # ranks, tp, ac, loss chunk, cp, pp
    (2, 1, "none", 0, 1, 1), (2, 1, "every_other", 0, 1, 1), (2, 1, "full", 0, 1, 1),
    (2, 1, "none", 64, 1, 1), (2, 1, "full", 64, 1, 1), (2, 2, "none", 0, 1, 1),
    (4, 2, "none", 0, 1, 1), (4, 2, "full", 0, 1, 1), (2, 1, "none", 0, 2, 1),
    (4, 1, "none", 64, 4, 1), (4, 1, "none", 0, 1, 2), (4, 1, "every_other", 0, 1, 2)]


def _microbatches(pp: int) -> int:
    return 2 * pp if pp > 1 else 1  # a pipeline's: twice its stages


def _argv(ranks: int, tp: int, ac: str, chunk: int, cp: int, pp: int) -> list[str]:
    dp = ranks // (tp * cp * pp)
    return ["--config", "debug", "--n-layers", "4", "--seq-len", "256", "--batch-size", "4",
            "--dtype", "fp32", "--tp", str(tp), "--ac", ac, "--loss-chunk", str(chunk),
            "--cp", str(cp), "--pp", str(pp), "--global-batch", str(4 * dp * _microbatches(pp))]


# The other trainers' layouts (trainer, its options, ranks), checked against their `layout` run
# for real: FSDP over a ViT with a parameter too small to split evenly (cls_token), over the MNIST
# CNN, and TP x FSDP over fsdp_tp's Llama-style model.
LAYOUTS = [("vit", ("--img-size", "64", "--patch-size", "8", "--depth", "2", "--heads", "4",
                    "--head-dim", "32", "--num-classes", "10", "--batch-size", "16",
                    "--dtype", "fp32"), 2),
           ("fsdp", ("--batch-size", "64", "--dtype", "fp32"), 2),
           ("fsdp_tp", ("--dim", "128", "--n-layers", "2", "--n-heads", "4", "--n-kv-heads", "2",
                        "--vocab-size", "2048", "--seq-len", "128", "--batch-size", "4",
                        "--tp", "2", "--dtype", "fp32"), 4)]


def _runs() -> list[tuple[tuple, str, list[str], int]]:
    """Every layout measured and checked: (its key, trainer, options, ranks)."""
    return ([(case, "llama3", _argv(*case), case[0]) for case in CASES]
            + [(layout, layout[0], list(layout[1]), layout[2]) for layout in LAYOUTS])


@functools.cache
def _peaks(ranks: int) -> dict[tuple, dict]:
    """The measured peak and rank 0's shards of each layout of `ranks` ranks, all in one
    torchrun (memory_peak.py)."""
    mine = [run for run in _runs() if run[3] == ranks]
    argv = []
    for _, trainer, options, _ in mine:
        argv += [trainer, *options, "--"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = run_training([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         f"--nproc-per-node={ranks}", str(HERE / "memory_peak.py"), *argv[:-1]],
                        capture_output=True, text=True, timeout=900,
                        env={**env, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()[-len(mine):]
    return {run[0]: json.loads(line) for run, line in zip(mine, lines, strict=True)}


@functools.cache
def _verified() -> dict[tuple, dict]:
    """Each layout checked under fake tensors at its world size (trainers/verify.py), all in one
    Python: rank 0's report."""
    runs = _runs()
    reports = checked_under_fake_tensors(*((trainer, options, ranks)
                                           for _, trainer, options, ranks in runs))
    return {run[0]: report["ranks"][0] for run, report in zip(runs, reports, strict=True)}


@pytest.mark.slow
@pytest.mark.xdist_group("memory-peaks")  # one worker: its cases of one rank count run together
@pytest.mark.parametrize("ranks,tp,ac,chunk,cp,pp", CASES)
def test_the_estimate_is_within_25_percent_of_the_peak_on_cpu(ranks, tp, ac, chunk, cp, pp):
    dp = ranks // (tp * cp * pp)
    microbatches = _microbatches(pp)
    measured = _peaks(ranks)[(ranks, tp, ac, chunk, cp, pp)]["peak_bytes"]
    estimated = estimate(Shape(SMALL, batch=4, seq=256, dp=dp, tp=tp, ac=ac, value_bytes=4,
                               loss_chunk=chunk, cp=cp, pp=pp, microbatches=microbatches)).total
    print(f"ranks {ranks} tp {tp} cp {cp} pp {pp} ac {ac} chunk {chunk}: measured {measured / 2**20:.1f} MiB, "
          f"estimated {estimated / 2**20:.1f} MiB ({estimated / measured - 1:+.0%})")
    assert abs(estimated / measured - 1) <= 0.25, (measured, estimated)


@pytest.mark.slow
@pytest.mark.xdist_group("memory-peaks")
@pytest.mark.parametrize("case", CASES + LAYOUTS)
def test_the_check_under_fake_tensors_has_the_real_shards_and_peak(case):
    """--verify's check of each layout against the trainer run for real on gloo: rank 0's
    shards exactly, its peak within 10% (MemTracker against the CPU allocator)."""
    ranks = next(run[3] for run in _runs() if run[0] == case)
    real, fake = _peaks(ranks)[case], _verified()[case]
    assert {name: s["local"] for name, s in fake["shards"].items()} == real["shards"]
    verified = sum(fake["peak"].values())
    print(f"{case}: measured {real['peak_bytes'] / 2**20:.1f} MiB, verified "
          f"{verified / 2**20:.1f} MiB ({verified / real['peak_bytes'] - 1:+.1%})")
    assert abs(verified / real["peak_bytes"] - 1) <= 0.10, (real["peak_bytes"], verified)


@pytest.mark.slow
def test_the_loss_in_chunks_is_the_loss(tmp_path):
    """The sequence's logits a chunk at a time (each one's gradient made with its loss) train exactly as whole."""
    curves = {}
    for chunk in (0, 16):
        proc = launch("llama3", ["--tiny", "--dtype", "fp32", "--steps", "6", "--warmup-steps",
                                 "2", "--loss-chunk", str(chunk)], 2, "torchrun",
                      tmp_path / f"c{chunk}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        curves[chunk] = [r["loss"] for r in steps(tmp_path / f"c{chunk}")]
    assert curves[16] == pytest.approx(curves[0], rel=1e-5)


def test_the_old_70b_preset_did_not_fit_an_aurora_tile():
    """Before the loss was sharded over the vocabulary, the 70B preset (8 sequences of 8192
    tokens per rank, tp 4 on Aurora's 16 nodes) built replicated fp32 logits of 128256 ids."""
    old = Shape(PRESETS["70b"].model, batch=8, seq=8192, dp=16 * 12 // 4, tp=4, ac="full",
                value_bytes=2, loss_chunk=0, loss_sharded=False)
    found = estimate(old)
    assert found.total > 64 * GIB and found.parts["loss or recompute"] > 64 * GIB
    new = dataclasses.replace(old, loss_sharded=True, batch=PRESETS["70b"].batch_size)
    assert estimate(new).total < 64 * GIB  # the preset now: sharded logits, one sequence


@pytest.mark.parametrize("machine", facility_profiles())
@pytest.mark.parametrize("workload", ["llama3_8b", "llama3_70b"])
def test_the_presets_fit_and_the_script_says_by_how_much(cli, isolated, machine, workload):
    result = cli("render", machine, workload, "-A", "MYPROJ")
    assert result.code == 0, result.err
    line = next(x for x in result.out.splitlines() if x.startswith("# Memory per device"))
    total, device = line.split(": ")[1].split(" GiB of ")
    assert 0 < float(total) <= float(device.split()[0]), line


def test_dry_run_shows_the_estimate(cli, isolated):
    result = cli("submit", "aurora", "llama3_8b", "-A", "MYPROJ", "--dry-run")
    assert result.code == 0 and "# Memory per device (estimate, +-25%): " in result.out


def test_a_plan_that_cannot_fit_is_refused_with_its_numbers_and_what_fits(cli, isolated,
                                                                          monkeypatch):
    result = cli("submit", "polaris", "llama3_70b", "-A", "MYPROJ", "--set", "batch_size=8")
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert "memory: llama3_70b needs an estimated " in result.err
    assert "above the 40 GiB of one cuda device; it fits with --set batch_size=1 (" in result.err
    assert not (isolated.parent / "home").exists() or not list((isolated.parent).rglob("jobs.db"))
    monkeypatch.setenv("MMM_ORCH_MEMORY_CHECK", "0")  # the estimate is an estimate
    shown = cli("render", "polaris", "llama3_70b", "-A", "MYPROJ", "--set", "batch_size=8")
    assert shown.code == 0 and "GiB of 40" in shown.out
