"""The ranks of a run on this one node, started as `torchrun --standalone` starts them, without
importing torch: torchrun's own import costs every launch two CPU-seconds before a rank runs
(a laptop's every run, and every local job of the test suite).

    python -m mmm_orch.injob.ranks --nproc-per-node=2 -m mmm_orch.trainers.fsdp ...
    python -m mmm_orch.injob.ranks --nproc-per-node=2 --no-python my_program args

Each rank gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, the group's
and role's, MASTER_ADDR, MASTER_PORT), and OMP_NUM_THREADS=1 where more than one rank shares the
node and none was set, as torchrun does. MASTER_PORT is the job's where it has one (the watchdog
gives a fresh one after a refused bind: injob/rendezvous.py), else a free port of this host;
rank 0 holds the rendezvous there. The signals the launch gets are passed on to every rank. The
first rank that fails ends the others (SIGTERM, then SIGKILL after GRACE_S) and the launch ends
with its exit code (128 + the signal for a rank that was killed), said in one line.

The standard library only: it runs in the job's Python.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from mmm_orch.injob import rendezvous

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
GRACE_S = 15.0  # the other ranks' time to end after the first failed, before SIGKILL
USAGE = "usage: python -m mmm_orch.injob.ranks --nproc-per-node=N [--no-python] COMMAND..."


def parse(argv: list[str]) -> tuple[int, list[str]]:
    """The ranks per node and the command, from torchrun's spelling of them (--standalone and
    --nnodes=1 are what this launcher is, and accepted as such)."""
    ranks, python, at = 0, True, 0
    while at < len(argv) and argv[at].startswith("--"):
        option, _, value = argv[at].partition("=")
        if option == "--nproc-per-node" and value.isdigit():
            ranks = int(value)
        elif option == "--no-python" and not value:
            python = False
        elif (option, value) not in (("--standalone", ""), ("--nnodes", "1")):
            raise SystemExit(f"{USAGE}\nnot an option of this launcher: {argv[at]}")
        at += 1
    command = argv[at:]
    if ranks < 1 or not command:
        raise SystemExit(USAGE)
    return ranks, command if not python else [sys.executable, "-u", *command]


def rank_env(rank: int, ranks: int, port: str) -> dict[str, str]:
    env = dict(os.environ)
    if ranks > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    for name in ("RANK", "LOCAL_RANK", "ROLE_RANK"):
        env[name] = str(rank)
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE"):
        env[name] = str(ranks)
    env.update(
        GROUP_RANK="0",
        GROUP_WORLD_SIZE="1",
        ROLE_NAME="default",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
        TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0",
        TORCHELASTIC_RUN_ID="none",
    )
    return env


def run(argv: list[str] | None = None) -> int:
    ranks, command = parse(sys.argv[1:] if argv is None else argv)
    port = os.environ.get("MASTER_PORT") or str(rendezvous.free_port())
    started = [subprocess.Popen(command, env=rank_env(r, ranks, port)) for r in range(ranks)]

    def forward(signum: int, _frame: object) -> None:
        for proc in started:
            if proc.poll() is None:
                proc.send_signal(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    while True:
        codes = [proc.poll() for proc in started]
        # (rank, its exit code) of the first to fail; None while none has
        failed = next(((r, c) for r, c in enumerate(codes) if c not in (None, 0)), None)
        if failed is not None or None not in codes:
            break
        time.sleep(0.05)
    if failed is None:
        return 0
    for proc in started:  # the first failure ends the run: the others are stopped
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + GRACE_S
    for proc in started:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    rank, code = failed
    how = f"exited with code {code}" if code >= 0 else "was killed"
    code = code if code >= 0 else 128 - code
    print(f"ranks: rank {rank} {how} first: exit {code}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(run())
