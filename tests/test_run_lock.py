"""The run directory's guard where flock fails (runtime/run_claim.py): the claim file keeps a
second run out, and a claim is taken over only once its holder is known to have ended.

No file system whose flock fails can be made here: tmpfs, ext4 and overlay all grant it, and
there is no libfuse to build a FUSE one that refuses locks (a FUSE file system without lock
support gets the kernel's local locks, which succeed). So flock's failure is injected at the
flock call alone, as a Lustre client mounted `noflock` answers it (ENOSYS); what is under test,
the claim files, runs for real on this file system, against real holder processes."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmm_orch.runtime import run_claim

HOST = socket.gethostname()
# A run that holds its claim (with a working flock of its own) until it is killed.
HOLDER = (
    "import sys, time; from pathlib import Path; from mmm_orch.runtime import run_claim; "
    "why = run_claim.hold(Path(sys.argv[1]), run_claim.this_process(), 0, "
    "lambda text: None); "
    "print(why or 'held', flush=True); time.sleep(120)"
)


@pytest.fixture
def no_flock(monkeypatch):
    """flock refused as on a Lustre mount without it (the call alone: see the module's note)."""

    def refuse(fd, operation):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(run_claim.fcntl, "flock", refuse)


def _hold(run: Path, me: run_claim.Holder, wait_s: float = 0.0, ended=lambda s, j: False):
    said: list[str] = []
    return run_claim.hold(run, me, wait_s, said.append, ended), said


def _other(host: str, scheduler: str = "", job: str = "") -> run_claim.Holder:
    return run_claim.Holder(host, 4321, 1_700_000_000.0, scheduler, job)


def _claims(run: Path) -> list[str]:
    return sorted(name for name in os.listdir(run) if name.startswith(".claim-"))


def test_where_flock_fails_a_live_run_keeps_the_next_out_until_its_process_is_gone(
    tmp_path, no_flock
):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        why, said = _hold(run, run_claim.this_process())
        assert why == (
            f"run directory {run} is in use by another run (host {HOST}, pid {holder.pid}, its "
            f"claim {run / '.claim-1'}); give this run another --run-name, or remove that claim "
            "once you know that run has ended"
        )
        assert _claims(run) == [".claim-1"]
    finally:
        holder.send_signal(signal.SIGKILL)  # no release: its claim stays, its process goes
        holder.wait()
    why, said = _hold(run, run_claim.this_process())
    assert why == ""
    assert said == [
        f"[runtime] run directory {run} held by its claim .claim-2 alone: flock on "
        ".lock failed (Function not implemented), as on a Lustre mount without flock"
    ]
    assert _claims(run) == [".claim-2"]
    claim = json.loads((run / ".claim-2").read_text())
    assert (claim["host"], claim["pid"]) == (HOST, os.getpid())


def test_a_claim_released_as_its_run_ends_is_taken_by_the_next_run(tmp_path, no_flock):
    run = tmp_path / "run"
    run.mkdir()
    assert _hold(run, _other("nid000001", "pbs", "101.aurora"))[0] == ""
    run_claim.release()
    assert _claims(run) == [".claim-1", ".claim-1.released"]
    # Another host, another job: the release says it ended; nobody is asked.
    asked = []
    why = run_claim.hold(
        run,
        _other("nid000002", "pbs", "102.aurora"),
        0,
        print,
        lambda *job: asked.append(job) or False,
    )
    assert why == "" and asked == [] and _claims(run) == [".claim-2"]


def test_a_claim_from_another_host_is_taken_only_once_its_scheduler_says_its_job_ended(
    tmp_path, no_flock
):
    run = tmp_path / "run"
    run.mkdir()
    assert _hold(run, _other("nid000001", "slurm", "4242"))[0] == ""
    me = _other("nid000002", "slurm", "4343")
    asked = []

    def running(scheduler, job):
        asked.append((scheduler, job))
        return False

    why, _ = _hold(run, me, ended=running)
    assert "in use by another run (slurm job 4242, host nid000001, pid 4321" in why
    assert asked == [("slurm", "4242")] and _claims(run) == [".claim-1"]
    why, _ = _hold(run, me, ended=lambda scheduler, job: (scheduler, job) == ("slurm", "4242"))
    assert why == "" and _claims(run) == [".claim-2"]


def test_a_holder_nothing_here_can_judge_is_never_taken_over(tmp_path, no_flock):
    """On another host outside any job, or an earlier launch of this very job that is no
    relaunch (two job steps naming one run): in use."""
    run = tmp_path / "run"
    run.mkdir()
    assert _hold(run, _other("workstation-a"))[0] == ""
    why, _ = _hold(run, _other("workstation-b"), ended=lambda *job: True)
    assert "in use by another run (host workstation-a, pid 4321" in why
    run_claim.release()

    assert _hold(run, _other("nid000001", "slurm", "77"))[0] == ""
    why, _ = _hold(run, _other("nid000002", "slurm", "77"), ended=lambda *job: True)
    assert "in use by another run (slurm job 77, host nid000001" in why
    assert _claims(run) == [".claim-2"]  # (the released one cleared as it was taken)


def test_a_relaunch_of_the_same_job_takes_its_earlier_launch_s_claim_after_its_wait(
    tmp_path, no_flock
):
    """Failover relaunches on other nodes once its launcher returned, after the wait it is given
    (MMM_RUN_LOCK_WAIT) for the earlier ranks: the earlier rank 0, on a lost node, never
    released its claim."""
    run = tmp_path / "run"
    run.mkdir()
    assert _hold(run, _other("nid000001", "slurm", "77"))[0] == ""
    started = time.monotonic()
    why, said = _hold(run, _other("nid000003", "slurm", "77"), wait_s=1.0)
    assert why == "" and time.monotonic() - started >= 1.0
    assert said[0] == (
        f"[runtime] run directory {run} is still claimed by slurm job 77, host "
        "nid000001, pid 4321; waiting up to 1s for it to stop"
    )
    assert _claims(run) == [".claim-2"]


def test_a_claim_that_is_no_claim_of_the_runtime_s_is_refused_unread(tmp_path, no_flock):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / ".claim-1")  # read, it would hang the run
    why, _ = _hold(run, run_claim.this_process())
    assert why.startswith(f"{run / '.claim-1'} is not a claim this runtime wrote (NotReadable)")
    os.unlink(run / ".claim-1")

    (run / ".claim-3").write_text("{not json")
    why, _ = _hold(run, run_claim.this_process())
    assert (
        why == f"run directory {run} is in use by another run (a run that is starting, "
        f"its claim {run / '.claim-3'}); give this run another --run-name, or remove "
        "that claim once you know that run has ended"
    )
    old = time.time() - 60  # one that stays unwritten is no claim being made
    os.utime(run / ".claim-3", (old, old))
    why, _ = _hold(run, run_claim.this_process())
    assert why.startswith(
        f"{run / '.claim-3'} is not a claim this runtime wrote (JSONDecodeError); remove it once"
    )
    assert _claims(run) == [".claim-3"]  # nothing taken, nothing removed


@pytest.mark.slow
def test_a_trainer_where_flock_fails_is_refused_a_run_directory_in_use(tmp_path):
    """The trainer itself (runtime/loop.run_dir), its flock refused as above, against a live
    holder of the run directory: exit 2, one line."""
    out = tmp_path / "out"
    (out / "run").mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out / "run")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        trainer = (
            "import errno, fcntl, os, runpy, sys\n"
            "def refuse(fd, operation): raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))\n"
            "fcntl.flock = refuse\n"
            "sys.argv = ['llama3', '--tiny', '--steps', '2', '--output-dir', sys.argv[1], "
            "'--run-name', 'run']\n"
            "runpy.run_module('mmm_orch.trainers.llama3', run_name='__main__', alter_sys=True)\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", trainer, str(out)],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "error:" in line]
    assert errors == [
        f"[runtime] error: run directory {out / 'run'} is in use by another run "
        f"(host {HOST}, pid {holder.pid}, its claim {out / 'run' / '.claim-1'}); "
        "give this run another --run-name, or remove that claim once you know "
        "that run has ended"
    ], errors
    assert not (out / "run" / "metrics.jsonl").exists()


def test_a_run_directory_that_cannot_be_claimed_is_refused_in_one_line(tmpfs):
    """A read-only one, and one whose file system has no room for the claim (out of inodes):
    refused, no claim left behind."""
    me = run_claim.this_process()
    read_only = tmpfs("ro", "ro")
    assert run_claim.hold(read_only, me, 0, print) == (
        f"cannot open {read_only / '.lock'}: Read-only file system"
    )
    full = tmpfs("full", "nr_inodes=2")  # the directory and its .lock
    assert run_claim.hold(full, me, 0, print) == (
        f"cannot claim the run directory {full}: No space left on device"
    )
    assert os.listdir(full) == [".lock"]
