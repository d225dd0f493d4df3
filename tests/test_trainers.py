"""The trainers on CPU with gloo, tiny configurations, started by torchrun and by MPICH mpiexec."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.training import (
    assert_ran,
    free_port,
    launch,
    run_training,
    sigterm_llama3_after,
    steps,
    training_turn,
)

# Each trainer is launched where its code differs, the checks of a launch (assert_ran) made in
# the tests that launch it anyway: on several ranks under torchrun, the uninterrupted run of the
# stop test (every trainer); on one rank (no FSDP, a process group on an in-memory store), the
# one-rank test (fsdp, vit), the 2x2-mesh test (fsdp_tp, one process) and the bf16 test (llama3);
# on 4 ranks, the mesh test and the layouts' runs (test_pipeline); under mpiexec, once (the
# ranks' variables are read by the runtime, the same for every trainer).


@pytest.fixture(scope="session")
def mpich(request):
    if shutil.which("mpiexec") is None:
        if os.geteuid() != 0:
            pytest.skip("MPICH mpiexec NOT INSTALLED: the mpiexec launch tests need it "
                        "(scripts/slurm-cluster.sh up installs it as root, as CI does)")
        request.getfixturevalue("slurm_cluster")  # its setup installs mpich
    version = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True).stdout
    assert "HYDRA" in version, version


ONE_RANK = {  # the trainers whose one-rank run no other test makes: a short one
    "fsdp": ["--tiny", "--epochs", "1", "--train-samples", "64", "--batch-size", "8"],
    "vit": ["--tiny", "--steps", "3"],
}


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ONE_RANK)
def test_a_trainer_runs_on_one_rank(trainer, tmp_path):
    """A world of one rank (torchrun's, with one): no FSDP, a process group on an in-memory
    store."""
    proc = launch(trainer, ONE_RANK[trainer], 1, "torchrun", tmp_path / "out")
    assert_ran(proc, tmp_path / "out", 1)


@pytest.mark.slow
def test_the_ranks_mpiexec_starts_find_their_places_and_train_together(mpich, tmp_path):
    """MPICH's Hydra names the ranks in its PMI variables, not torchrun's: the runtime reads
    rank, size and local rank from them, and the two ranks meet and train as one run."""
    proc = launch("llama3", ["--tiny", "--steps", "3"], 2, "mpiexec", tmp_path / "out")
    assert_ran(proc, tmp_path / "out", 2)


@pytest.mark.slow
def test_fsdp_tp_2x2_mesh_matches_one_process(tmp_path):
    """dp=2 x tp=2 (4 ranks, batch 4 per dp rank) against 1 process with the global batch of 8,
    same seed and data, fp32: the parallel layout changes nothing but summation order."""
    common = ["--tiny", "--steps", "6", "--dtype", "fp32"]
    mesh = launch("fsdp_tp", [*common, "--tp", "2", "--batch-size", "4"], 4, "torchrun", tmp_path / "a")
    single = launch("fsdp_tp", [*common, "--tp", "1", "--batch-size", "8"], 1, "none", tmp_path / "b")
    assert_ran(mesh, tmp_path / "a", 4)
    assert_ran(single, tmp_path / "b", 1)
    a = [r["loss"] for r in steps(tmp_path / "a")]
    b = [r["loss"] for r in steps(tmp_path / "b")]
    assert len(a) == len(b) == 6
    # Tolerance: fp32 all-reduces sum in a different order than one matmul does; 1e-4 is
    # ~1000x the observed difference and far below any real layout bug (those move the loss
    # by 1e-2 or more from step 1).
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4, (a, b)
    assert a[0] != a[-1]


ONE_RANK_PRECISION = r"""
import json, sys, torch
from torch.distributed.tensor import DTensor
from mmm_orch.runtime import device, dist as runtime_dist
from mmm_orch.runtime.loop import mesh
from mmm_orch.runtime.options import parse
from mmm_orch.trainers.llama3 import Config, build_model, resolve
cfg = parse(Config, sys.argv[1:])
args, batch_size, seq_len, _, ac = resolve(cfg)
# The layout under bf16, on any CPU: one without native bf16 math would compute in fp32.
device._cpu_has_bf16 = lambda: True
rt = runtime_dist.setup()
model, _, forward, _ = build_model(cfg, args, seq_len, ac, rt, mesh(rt))
params = list(model.parameters())
kept = {"sharded": any(isinstance(p, DTensor) for p in params),
        "kept": sorted({str(p.dtype) for p in params})}
computed = []
model.layers["0"].attention.wq.register_forward_hook(lambda m, i, o: computed.append(o.dtype))
with forward.precision():
    model(torch.zeros(1, 8, dtype=torch.long), hidden_only=True)
if rt.is_main:
    print(json.dumps({**kept, "computed": str(computed[0])}))
runtime_dist.teardown()
"""


@pytest.mark.slow
def test_one_rank_computes_in_bf16_over_fp32_parameters_and_resumes_on_two_and_back(tmp_path):
    """A world of one rank has no FSDP (torchtitan's layout for one device; on an H200 FSDP's
    copies took 13% of a compiled step): fp32 parameters, bf16 products under autocast. Two
    ranks shard bf16 copies of them. A checkpoint of either layout resumes on the other: one
    run goes from one rank to two (from its step 4) and back to one (from the two ranks' step 8),
    each part against the curve of the layout it resumed from."""
    script = tmp_path / "precision.py"
    script.write_text(ONE_RANK_PRECISION)
    seen = {}
    for ranks in (1, 2):
        proc = run_training(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             f"--nproc-per-node={ranks}", str(script), "--tiny", "--dtype", "bf16"],
            capture_output=True, text=True, timeout=240,
            env={**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())})
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen[ranks] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen[1] == {"sharded": False, "kept": ["torch.float32"], "computed": "torch.bfloat16"}
    assert seen[2] == {"sharded": True, "kept": ["torch.float32"], "computed": "torch.bfloat16"}

    args = ["--tiny", "--dtype", "bf16", "--steps", "12", "--checkpoint-every", "4",
            "--global-batch", "8", "--batch-size", "4"]
    out = tmp_path / "out"
    assert_ran(launch("llama3", args, 1, "none", out), out, 1)
    curve = {r["step"]: r["loss"] for r in steps(out)}
    for ranks, step in ((2, 4), (1, 8)):  # step 8: saved by the two ranks' run (it replaced one's)
        (out / "run" / "checkpoints" / "latest").write_text(f"step-{step}")
        resumed = launch("llama3", [*args, "--resume"], ranks, "torchrun" if ranks > 1 else "none",
                         out)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        lines = (out / "run" / "metrics.jsonl").read_text().splitlines()
        resume_at = max(i for i, line in enumerate(lines) if '"event": "resume"' in line)
        after = [r for r in map(json.loads, lines[resume_at:]) if r["event"] == "step"]
        assert [r["step"] for r in after] == list(range(step + 1, 13))
        # The same samples and weights; bf16 rounds the two layouts' products apart a little.
        for record in after:
            assert abs(record["loss"] - curve[record["step"]]) < 0.02, (ranks, record)
        curve.update({r["step"]: r["loss"] for r in after})


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_and_exits_75(tmp_path):
    """One process stopped by SIGTERM itself (no launcher between): it saves and exits 75. (A
    resume from such a save: the stop test.)"""
    out = tmp_path / "out"
    proc = sigterm_llama3_after(out, "step", 3)
    metrics, stderr = out / "run" / "metrics.jsonl", proc.stderr
    assert proc.returncode == 75, stderr[-3000:]  # checkpointed, not finished
    saved = [json.loads(line) for line in metrics.read_text().splitlines()
             if '"event": "checkpoint"' in line]
    assert len(saved) == 1 and saved[0]["reason"] == "signal" and saved[0]["save_s"] > 0
    stopped_at = saved[0]["step"]
    assert (out / "run" / "checkpoints" / "latest").read_text() == f"step-{stopped_at}"


def caught(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (the SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(mask >> (signum - 1) & 1)


@pytest.mark.slow
def test_a_stop_signal_during_startup_is_kept_until_the_first_step(tmp_path):
    """A walltime warning that comes before torch has even loaded (a slow start: a loaded node,
    or minutes of imports at scale) does not kill the rank: the run does step 1, saves, exits 75,
    so a chain link that started late still makes progress."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "mmm_orch.trainers.llama3", "--tiny",
                             "--steps", "100000", "--output-dir", str(out), "--run-name", "run"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 30
    while not caught(proc.pid, signal.SIGUSR1):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
        time.sleep(0.005)
    maps = Path(f"/proc/{proc.pid}/maps").read_text()
    proc.send_signal(signal.SIGUSR1)
    assert "libtorch" not in maps  # the signal came before torch loaded
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 75, stderr[-3000:]
    metrics = (out / "run" / "metrics.jsonl").read_text().splitlines()
    saved = [r for r in map(json.loads, metrics) if r["event"] == "checkpoint"]
    assert [(r["step"], r["reason"]) for r in saved] == [(1, "signal")]
    assert [r["step"] for r in steps(out)] == [1]


@pytest.mark.slow
def test_llama3_learns_from_a_pretokenized_token_file(tmp_path):
    import array

    tokens = array.array("H", [(7 * i) % 256 for i in range(200_000)])  # uint16 stream
    path = tmp_path / "tokens.bin"
    path.write_bytes(tokens.tobytes())
    proc = launch("llama3", ["--tiny", "--steps", "30", "--warmup-steps", "5",
                             "--data-path", str(path), "--token-dtype", "uint16"], 2, "torchrun",
                  tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [r["loss"] for r in steps(tmp_path / "out")]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5


def test_token_file_windows_and_dp_slices():
    import torch

    from mmm_orch.runtime.data import SyntheticTokens, batch_indices

    assert batch_indices(3, 1, 4, 2).tolist() == [28, 29, 30, 31]
    data = SyntheticTokens(256, 16, seed=1)
    rank0, rank1 = (data.batch(batch_indices(0, r, 4, 2))[0] for r in (0, 1))
    assert not torch.equal(rank0, rank1)  # distinct per data-parallel rank
    assert torch.equal(rank0, data.batch(batch_indices(0, 0, 4, 2))[0])  # same in a TP group
    inputs, labels = data.batch(torch.arange(2))
    assert torch.equal(inputs[:, 1:], labels[:, :-1])


@pytest.mark.slow
def test_fsdp_reads_real_idx_files(tmp_path):
    import random

    def idx(path: Path, dims: list[int], data: bytes) -> None:
        path.write_bytes(struct.pack(">HBB", 0, 8, len(dims)) + struct.pack(f">{len(dims)}I", *dims) + data)

    rng = random.Random(0)
    data_dir = tmp_path / "mnist"
    data_dir.mkdir()
    for prefix, count in (("train", 96), ("t10k", 40)):
        labels = bytes(rng.randrange(10) for _ in range(count))
        images = bytes(min(255, 25 * label + rng.randrange(30)) for label in labels for _ in range(784))
        idx(data_dir / f"{prefix}-images-idx3-ubyte", [count, 28, 28], images)
        idx(data_dir / f"{prefix}-labels-idx1-ubyte", [count], labels)
    proc = launch("fsdp", ["--data-dir", str(data_dir), "--epochs", "2", "--batch-size", "8",
                           "--test-batch-size", "16"], 2, "torchrun", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    epochs = [json.loads(line) for line in
              (tmp_path / "out" / "run" / "metrics.jsonl").read_text().splitlines()
              if '"event": "epoch"' in line]
    assert len(epochs) == 2
    assert len(steps(tmp_path / "out")) == 2 * (96 // 16)


def test_unknown_and_mistyped_options_are_errors(capsys):
    """(A trainer process's exit 2 on a bad option: test_runtime_hostile.)"""
    from mmm_orch.runtime.options import parse
    from mmm_orch.trainers import llama3

    for args in (["--no-such-option", "1"], ["--steps", "many"]):
        with pytest.raises(SystemExit) as stopped:
            parse(llama3.Config, ["--tiny", *args])
        assert stopped.value.code == 2 and "error:" in capsys.readouterr().err


def test_tiny_changes_defaults_and_given_options_win():
    from mmm_orch.runtime.options import parse
    from mmm_orch.trainers import fsdp, fsdp_tp

    assert parse(fsdp.Config, []).train_samples == 60000
    assert parse(fsdp.Config, ["--tiny"]).train_samples == 512
    given = parse(fsdp.Config, ["--tiny", "--train-samples", "64"])
    assert (given.train_samples, given.test_batch_size) == (64, 128)
    shaped = parse(fsdp_tp.Config, ["--tiny", "--dim", "96", "--batch-size", "2"])
    assert (shaped.dim, shaped.n_layers, shaped.batch_size) == (96, 2, 2)
    # A tiny dict given to parse adds to (and wins over) the options' own tiny values.
    extra = parse(fsdp.Config, ["--tiny"], tiny={"test_batch_size": 64})
    assert (extra.train_samples, extra.test_batch_size) == (512, 64)


def test_peak_flops_table_and_the_flops_count():
    from mmm_orch.runtime.flops import peak_flops, transformer_flops_per_token

    # Device names as torch reports them; variants before their family.
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA A100-SXM4-40GB") == 312e12
    assert peak_flops("AMD Instinct MI250X") == 191.5e12  # one GCD
    assert peak_flops("Intel(R) Data Center GPU Max 1550") == 419.5e12  # one tile
    assert peak_flops("cpu") is None
    # The 8b and 70b presets have Meta's published parameter counts (built on the meta device).
    import torch

    from mmm_orch.models.llama3.args import PRESETS
    from mmm_orch.models.llama3.model import Transformer

    counts = {}
    for name in ("8b", "70b"):
        with torch.device("meta"):
            counts[name] = Transformer(PRESETS[name].model).count_params()
    assert counts["8b"][0] == 8_030_261_248 and counts["70b"][0] == 70_553_706_496
    # Llama 3 8B at 8192 tokens: 6 x 7.50e9 non-embedding parameters + 12.9e9 for attention.
    per_token = transformer_flops_per_token(*counts["8b"], 32, 32, 128, 8192)
    assert per_token == 57_914_449_920


@pytest.mark.slow
def test_llama3_compile_with_tp_and_activation_checkpointing(tmp_path):
    """torch.compile around a checkpointed TP block fails in AOT autograd (a DeviceMesh among
    the saved tensors), so blocks are compiled first and checkpointed around; the result must
    still train like the eager run."""
    common = ["--tiny", "--tp", "2", "--steps", "5", "--dtype", "fp32"]
    compiled = launch("llama3", [*common, "--compile", "--ac", "full"], 2, "torchrun", tmp_path / "c")
    eager = launch("llama3", [*common, "--ac", "none"], 2, "torchrun", tmp_path / "e")
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    assert eager.returncode == 0, eager.stderr[-3000:]
    a, b = ([r["loss"] for r in steps(tmp_path / d)] for d in ("c", "e"))
    assert len(a) == len(b) == 5
    assert a[0] == pytest.approx(b[0], abs=1e-4)  # same weights, same batch
    assert max(abs(x - y) for x, y in zip(a, b)) < 0.02, (a, b)  # Adam amplifies tiny differences


def assert_learned(proc: subprocess.CompletedProcess, out: Path, trainer: str) -> None:
    """The loss of a run on learnable data fell (its last 5 steps against its first 5); fsdp's
    test loss fell too, and each epoch was reported."""
    losses = [r["loss"] for r in steps(out)]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.3, (first, last)
    if trainer == "fsdp":
        epochs = [json.loads(line) for line in
                  (out / "run" / "metrics.jsonl").read_text().splitlines()
                  if '"event": "epoch"' in line]
        assert len(epochs) > 1 and epochs[-1]["test_loss"] < epochs[0]["test_loss"], epochs
        assert "[epoch] epoch=2 train_loss=" in proc.stdout and "test_acc=" in proc.stdout


STOP_AND_RESUME = {
    # trainer (-variant): arguments of a run long enough to be stopped in the middle, its last step
    "fsdp": (["--tiny", "--epochs", "3", "--train-samples", "256", "--batch-size", "16"], 24),
    "fsdp_tp": (["--tiny", "--steps", "24"], 24),
    "vit": (["--tiny", "--steps", "24"], 24),
    "llama3": (["--tiny", "--steps", "24", "--warmup-steps", "6"], 24),
    "llama3-pp2": (["--tiny", "--steps", "24", "--warmup-steps", "6", "--pp", "2",
                    "--global-batch", "4", "--batch-size", "1"], 24),
}


@pytest.mark.slow
@pytest.mark.parametrize("trainer", sorted(STOP_AND_RESUME))
def test_stop_signal_saves_exits_75_and_the_resumed_run_matches_an_uninterrupted_one(trainer, tmp_path):
    """What a walltime stop does to every trainer: the stop signal (SIGTERM through torchrun, as
    the local executor's watchdog sends it; SIGUSR1 through srun and mpiexec) saves at the end of
    the current step on every rank and exits 75; --resume then continues with the same data, the
    same learning-rate schedule and so the same losses as a run that was never stopped. That
    run is also the trainer's on several ranks under torchrun, and on learnable data."""
    args, last = STOP_AND_RESUME[trainer]
    trainer = trainer.split("-")[0]
    reference = tmp_path / "reference"
    reference.mkdir()
    uninterrupted = launch(trainer, args, 2, "torchrun", reference / "out")
    assert_ran(uninterrupted, reference / "out", 2)
    assert_learned(uninterrupted, reference / "out", trainer)
    expected = {r["step"]: r for r in steps(reference / "out")}
    assert sorted(expected) == list(range(1, last + 1))

    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port())}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        env.pop(key, None)
    with training_turn():
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc-per-node=2", "-m", f"mmm_orch.trainers.{trainer}", *args,
                                 "--output-dir", str(out), "--run-name", "run"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        metrics = out / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 180
        while not (metrics.exists() and metrics.read_text().count('"event": "step"') >= 4):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # torchrun passes it on to its workers
        _, stderr = proc.communicate(timeout=120)
    saved = [json.loads(line) for line in metrics.read_text().splitlines()
             if '"event": "checkpoint"' in line]
    assert len(saved) == 1 and saved[0]["reason"] == "signal", stderr[-3000:]
    stopped_at = saved[0]["step"]
    assert 4 <= stopped_at < last
    assert [r["step"] for r in steps(out)] == list(range(1, stopped_at + 1))

    resumed = launch(trainer, [*args, "--resume"], 2, "torchrun", out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = steps(out)
    assert [r["step"] for r in got] == list(range(1, last + 1))  # each step once, in order
    for record in got:
        want = expected[record["step"]]
        assert abs(record["loss"] - want["loss"]) < 1e-4, (record, want)
        if "lr" in want:
            assert abs(record["lr"] - want["lr"]) < 1e-12, (record, want)
