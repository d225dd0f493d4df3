"""The trainers on CPU with gloo, tiny configurations, started by torchrun and by MPICH mpiexec."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_training, training_turn

TRAINERS = {
    # trainer: (tiny arguments for a short launch check, arguments for a learning run)
    "fsdp": (["--tiny", "--epochs", "1", "--train-samples", "64", "--batch-size", "8"],
             ["--tiny", "--epochs", "2"]),
    "fsdp_tp": (["--tiny", "--steps", "3"], ["--tiny", "--steps", "40"]),
    "vit": (["--tiny", "--steps", "3"], ["--tiny", "--steps", "30"]),
    "llama3": (["--tiny", "--steps", "3"], ["--tiny", "--steps", "40", "--warmup-steps", "5"]),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(trainer: str, args: list[str], ranks: int, launcher: str, out: Path,
           timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    module = ["-m", f"mmm_orch.trainers.{trainer}"]
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ranks}", *module]
    elif launcher == "mpiexec":
        cmd = [shutil.which("mpiexec") or "mpiexec", "-n", str(ranks), sys.executable, *module]
    else:
        cmd = [sys.executable, *module]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(free_port()), **(env or {})}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
                "SLURM_NTASKS", "MASTER_ADDR"):
        env.pop(key, None)
    return run_training([*cmd, *args, "--output-dir", str(out), "--run-name", "run"],
                        capture_output=True, text=True, timeout=timeout, env=env, cwd=out.parent)


def steps(out: Path) -> list[dict]:
    lines = (out / "run" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "step"]


@pytest.fixture(scope="session")
def mpich(request):
    if shutil.which("mpiexec") is None:
        if os.geteuid() != 0:
            pytest.skip("MPICH mpiexec NOT INSTALLED: the mpiexec launch tests need it "
                        "(scripts/slurm-cluster.sh up installs it as root, as CI does)")
        request.getfixturevalue("slurm_cluster")  # its setup installs mpich
    version = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True).stdout
    assert "HYDRA" in version, version


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "mpiexec"])
@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_every_trainer_runs_under_every_launcher(trainer, ranks, launcher, tmp_path, request):
    if launcher == "mpiexec":
        request.getfixturevalue("mpich")
    args = TRAINERS[trainer][0] + (["--tp", "2" if ranks > 1 else "1"] if trainer == "fsdp_tp" else [])
    proc = launch(trainer, args, ranks, launcher, tmp_path / "out")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    records = steps(tmp_path / "out")
    assert records and all(r["loss"] > 0 and r["dt"] > 0 for r in records)
    config = json.loads((tmp_path / "out" / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert config["event"] == "config" and config["config"]["world_size"] == ranks
    assert "[mmm-orch] first_step=" in proc.stdout
    assert proc.stdout.count("[mmm-orch] first_step=") == 1  # rank 0 only


@pytest.mark.slow
@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_loss_falls_on_learnable_data(trainer, tmp_path):
    args = TRAINERS[trainer][1] + (["--tp", "2"] if trainer == "fsdp_tp" else [])
    proc = launch(trainer, args, 2, "torchrun", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = [r["loss"] for r in steps(tmp_path / "out")]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.3, (first, last)
    if trainer == "fsdp":
        epochs = [json.loads(line) for line in
                  (tmp_path / "out" / "run" / "metrics.jsonl").read_text().splitlines()
                  if '"event": "epoch"' in line]
        assert len(epochs) == 2 and epochs[1]["test_loss"] < epochs[0]["test_loss"]
        assert "[epoch] epoch=2 train_loss=" in proc.stdout and "test_acc=" in proc.stdout


@pytest.mark.slow
def test_fsdp_tp_2x2_mesh_matches_one_process(tmp_path):
    """dp=2 x tp=2 (4 ranks, batch 4 per dp rank) against 1 process with the global batch of 8,
    same seed and data, fp32: the parallel layout changes nothing but summation order."""
    common = ["--tiny", "--steps", "6", "--dtype", "fp32"]
    mesh = launch("fsdp_tp", [*common, "--tp", "2", "--batch-size", "4"], 4, "torchrun", tmp_path / "a")
    single = launch("fsdp_tp", [*common, "--tp", "1", "--batch-size", "8"], 1, "none", tmp_path / "b")
    assert mesh.returncode == 0 and single.returncode == 0, mesh.stderr[-3000:] + single.stderr[-3000:]
    a = [r["loss"] for r in steps(tmp_path / "a")]
    b = [r["loss"] for r in steps(tmp_path / "b")]
    assert len(a) == len(b) == 6
    # Tolerance: fp32 all-reduces sum in a different order than one matmul does; 1e-4 is
    # ~1000x the observed difference and far below any real layout bug (those move the loss
    # by 1e-2 or more from step 1).
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4, (a, b)
    assert a[0] != a[-1]


@pytest.mark.slow
def test_llama3_resume_continues_the_loss_curve(tmp_path):
    out = tmp_path / "out"
    args = ["--tiny", "--steps", "16", "--checkpoint-every", "8"]
    full = launch("llama3", args, 2, "torchrun", out)
    assert full.returncode == 0, full.stderr[-3000:]
    reference = {r["step"]: r["loss"] for r in steps(out)}
    # Go back to the step-8 checkpoint and continue from there.
    (out / "run" / "checkpoints" / "latest").write_text("step-8")
    resumed = launch("llama3", [*args, "--resume"], 2, "torchrun", out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "[resume] step=8" in resumed.stdout
    lines = (out / "run" / "metrics.jsonl").read_text().splitlines()
    resume_at = next(i for i, line in enumerate(lines) if '"event": "resume"' in line)
    after = [r for r in map(json.loads, lines[resume_at:]) if r["event"] == "step"]
    assert [r["step"] for r in after] == list(range(9, 17))
    for record in after:
        assert abs(record["loss"] - reference[record["step"]]) < 1e-5, record


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
    ranks shard bf16 copies of them. A checkpoint of either layout resumes on the other."""
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

    args = ["--tiny", "--dtype", "bf16", "--steps", "8", "--checkpoint-every", "4",
            "--global-batch", "8", "--batch-size", "4"]
    for first, then in ((1, 2), (2, 1)):
        out = tmp_path / f"{first}-{then}"
        full = launch("llama3", args, first, "torchrun", out)
        assert full.returncode == 0, full.stderr[-3000:]
        reference = {r["step"]: r["loss"] for r in steps(out)}
        (out / "run" / "checkpoints" / "latest").write_text("step-4")
        resumed = launch("llama3", [*args, "--resume"], then, "torchrun", out)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        lines = (out / "run" / "metrics.jsonl").read_text().splitlines()
        resume_at = next(i for i, line in enumerate(lines) if '"event": "resume"' in line)
        after = [r for r in map(json.loads, lines[resume_at:]) if r["event"] == "step"]
        assert [r["step"] for r in after] == [5, 6, 7, 8]
        # The same samples and weights; bf16 rounds the two layouts' products apart a little.
        for record in after:
            assert abs(record["loss"] - reference[record["step"]]) < 0.02, (first, then, record)


def sigterm_llama3_after(out: Path, event: str, count: int, args: list[str] = ()) -> \
        subprocess.CompletedProcess:
    """One llama3 process (tiny, endless) stopped by SIGTERM once its metrics hold `count`
    records of `event`, and how it ended."""
    proc = subprocess.Popen([sys.executable, "-m", "mmm_orch.trainers.llama3", "--tiny",
                             "--steps", "100000", *args, "--output-dir", str(out), "--run-name",
                             "run"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    metrics = out / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count(f'"event": "{event}"') >= count):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_and_exits_cleanly_then_resumes(tmp_path):
    out = tmp_path / "out"
    proc = sigterm_llama3_after(out, "step", 3)
    metrics, stderr = out / "run" / "metrics.jsonl", proc.stderr
    assert proc.returncode == 75, stderr[-3000:]  # checkpointed, not finished
    saved = [json.loads(line) for line in metrics.read_text().splitlines()
             if '"event": "checkpoint"' in line]
    assert len(saved) == 1 and saved[0]["reason"] == "signal" and saved[0]["save_s"] > 0
    stopped_at = saved[0]["step"]
    assert (out / "run" / "checkpoints" / "latest").read_text() == f"step-{stopped_at}"
    resumed = launch("llama3", ["--tiny", "--steps", str(stopped_at + 2), "--resume"], 1, "none", out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["step"] for r in steps(out)][-2:] == [stopped_at + 1, stopped_at + 2]


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


@pytest.mark.slow
def test_unknown_and_mistyped_options_are_errors(tmp_path):
    for args in (["--no-such-option", "1"], ["--steps", "many"]):
        proc = launch("llama3", ["--tiny", *args], 1, "none", tmp_path / "out")
        assert proc.returncode == 2 and "error:" in proc.stderr


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

    from mmm_orch.model_shapes import PRESETS
    from mmm_orch.trainers.models.llama import Transformer

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
    same learning-rate schedule and so the same losses as a run that was never stopped."""
    args, last = STOP_AND_RESUME[trainer]
    trainer = trainer.split("-")[0]
    reference = tmp_path / "reference"
    reference.mkdir()
    assert launch(trainer, args, 2, "torchrun", reference / "out").returncode == 0
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
