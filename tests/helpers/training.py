"""Trainings the tests start on this host themselves (torchrun, mpiexec or one process; not a
scheduler's job), in turns across the workers, and what they leave: a trainer's launch, its step
records, the checks of a launch that trained to its end, and a run stopped by SIGTERM."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The trainings the tests start on this host themselves (torchrun and its ranks, not a
# scheduler's job) are CPU-bound: more than two at once on CI's 2 cores only slow each other, and
# with them the live tests' jobs, whose walltimes and deadlines do not wait. They take turns, two
# at a time across the workers (one alone left the other workers idle behind it at the end of the
# suite); the wait for a turn is no part of a run's own timeout.
TRAINING_TURNS = [Path(tempfile.gettempdir()) / f"mmm-orch-tests-training-{os.getuid()}-{slot}.lock"
                  for slot in range(2)]


@contextlib.contextmanager
def training_turn():
    """Held while one training runs: the first of the TRAINING_TURNS free."""
    while True:
        for path in TRAINING_TURNS:
            with open(path, "a") as turn:
                try:
                    fcntl.flock(turn, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                yield
                return
        time.sleep(0.5)


def run_training(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run of a CPU-bound training on this host, in its turn."""
    with training_turn():
        return subprocess.run(argv, **kwargs)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a launch's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(trainer: str, args: list[str], ranks: int, launcher: str, out: Path,
           timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The trainer `trainer` with `args` on `ranks` ranks, started by `launcher` (torchrun,
    mpiexec, or none: one process), its run in `out`/run, in its training turn."""
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


def run_steps(run_dir: str | Path) -> list[dict]:
    """The step records of a run's metrics.jsonl (`run_dir`: the run's own directory)."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "step"]


def steps(out: Path) -> list[dict]:
    """The step records of the run that `launch` made in `out`."""
    return run_steps(out / "run")


def assert_ran(proc: subprocess.CompletedProcess, out: Path, ranks: int) -> None:
    """The launch trained to its end on `ranks` ranks: exit 0, every step's loss and time
    logged, the world size in the metrics' header, and the first step announced by rank 0 only
    (however many ranks write to the launch's output)."""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    records = steps(out)
    assert records and all(r["loss"] > 0 and r["dt"] > 0 for r in records)
    header = json.loads((out / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert header["event"] == "config" and header["config"]["world_size"] == ranks
    assert proc.stdout.count("[mmm-orch] first_step=") == 1, proc.stdout[-2000:]


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


def checked_under_fake_tensors(*layouts: tuple[str, list[str], int]) -> list[dict]:
    """trainers/verify.py's report of each (trainer: a module of mmm_orch.trainers, its
    options, world size) on this CPU, in fp32 as the CPU runs the trainers, all in one Python:
    what --verify runs for a plan."""
    requests = [{"trainer": f"mmm_orch.trainers.{trainer}", "argv": argv, "world_size": world,
                 "ranks_per_node": world, "dtype": "fp32", "attention": "fused",
                 "device": {"flops": None, "memory_bandwidth": None, "network_bandwidth": None}}
                for trainer, argv, world in layouts]
    proc = run_training([sys.executable, "-m", "mmm_orch.trainers.verify"],
                        input=json.dumps(requests), capture_output=True, text=True, timeout=900,
                        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)
