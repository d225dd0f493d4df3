"""No scheduler: run the job script on this computer, detached, under a supervisor process
(supervisor.py) that survives the CLI, enforces the walltime and records the exit code."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeGuard

import psutil

from mmm_orch.errors import SchedulerError, SubmissionRefused
from mmm_orch.injob.protocol import CANCEL_SENT_FILE, RESULT_FILE, SUPERVISOR_FILE
from mmm_orch.schedulers.base import JobRef, Submission
from mmm_orch.schedulers.local.supervisor import CANCEL_SIGNALS, GRACE_S
from mmm_orch.schedulers.states import JobState, JobStatus, OpenJob

if TYPE_CHECKING:
    from mmm_orch.hosts.transport import Runner


def _holder(pid: int) -> str:
    """`pid:start time` of the process holding the job ('' for none): the start time tells the
    process from a later one given the same pid."""
    return f"{pid}:{psutil.Process(pid).create_time()}" if pid else ""


class LocalScheduler:
    submit_command = ""  # runs here, always

    def __init__(self, commands: dict[str, str] | None = None, runner: Runner | None = None):
        """Made as every kind's Scheduler is; it runs the script itself, here: it uses no command
        names, and no runner to send them through."""

    def submit(self, submission: Submission) -> str:
        """Start the supervisor detached. Its pid and start time (supervisor.json: how the job is
        found from its directory) are written here at once and by the supervisor first thing,
        so the job is found even if this process is killed the instant after starting it, and
        a pack starts its points without waiting for each supervisor's start-up."""
        # The supervisor starts with the cancel signals blocked (a child inherits this thread's
        # mask); it unblocks them once it can handle them (supervisor.CANCEL_SIGNALS).
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, CANCEL_SIGNALS)
        try:
            with open(submission.log_path, "ab") as log:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "mmm_orch.schedulers.local.supervisor",
                        str(submission.job_dir),
                        str(submission.script),
                        str(submission.walltime),
                        submission.stop_signal,
                        _holder(submission.held_by),
                    ],
                    cwd=submission.workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        try:
            started = psutil.Process(proc.pid).create_time()
        except psutil.Error:  # (gone and reaped already: it could not even start)
            raise SubmissionRefused(
                f"the local supervisor exited ({proc.poll()}) before starting "
                f"the job; see {submission.log_path}"
            ) from None
        partial = submission.job_dir / f".{SUPERVISOR_FILE}.{os.getpid()}"  # (its own: .tmp)
        partial.write_text(
            json.dumps(
                {
                    "pid": proc.pid,
                    "create_time": started,
                    "started_at": time.time(),  # until the supervisor says (its own clock)
                    "host": socket.gethostname(),
                }
            )
        )
        partial.replace(submission.job_dir / SUPERVISOR_FILE)
        return str(proc.pid)

    def find(self, submission: Submission) -> list[str]:
        info = _supervisor_info(JobRef("", submission.job_dir))
        return [str(info["pid"])] if info else []

    @staticmethod
    def directive_path(path: str) -> str:
        return path  # no directives: the supervisor opens the log itself

    def query(self, jobs: Sequence[JobRef]) -> dict[str, JobStatus]:
        return {job.native_id: self._status(job) for job in jobs}

    def _status(self, job: JobRef) -> JobStatus:
        supervisor = _supervisor_info(job)
        # No queue: it starts at once (by its own clock once it runs; supervisor.supervise).
        started = supervisor.get("started_at", supervisor["create_time"]) if supervisor else None
        # Whether it lives, asked before the result is read: the supervisor writes the result and
        # then exits, so one found gone has left its result. In the other order, a job ending
        # between the two reads would read as vanished, and a terminal state is never asked again.
        alive = not _elsewhere(supervisor) and _live(supervisor) is not None
        result_file = job.job_dir / RESULT_FILE
        if result_file.exists():
            result = json.loads(result_file.read_text())
            if result["cancelled"]:
                state, native = JobState.CANCELLED, "cancelled"
            elif result["timed_out"]:
                state, native = JobState.TIMEOUT, "walltime exceeded"
            elif result["exit_code"] == 0:
                state, native = JobState.COMPLETED, "exited 0"
            else:
                state, native = JobState.FAILED, "exited non-zero"
            return JobStatus(
                native_id=job.native_id,
                state=state,
                native_state=native,
                # (a cancelled job has no exit code of its own, as Slurm and PBS record it; the
                # script's, its trap's 143, stays in the result file)
                exit_code=None if result["cancelled"] else result["exit_code"],
                signal=result["signal"],
                started_at=started,
                ended_at=result["ended_at"],
                elapsed=result["ended_at"] - started if started else None,
            )
        if alive:
            return JobStatus(
                native_id=job.native_id,
                state=JobState.RUNNING,
                native_state="running",
                started_at=started,
            )
        if _elsewhere(supervisor):  # a launch on a compute node, seen from the login node
            return JobStatus(
                native_id=job.native_id,
                state=JobState.UNKNOWN,
                native_state="on " + supervisor["host"],
                reason=f"runs on {supervisor['host']}: its end is read from its result file there",
            )
        # Ended by a cancel, which writes its result once the rest of the job is gone too.
        if (job.job_dir / CANCEL_SENT_FILE).exists():
            return JobStatus(
                native_id=job.native_id,
                state=JobState.CANCELLED,
                native_state="cancelled",
                started_at=started,
                reason="cancelled: the supervisor ended before recording it",
            )
        return JobStatus(
            native_id=job.native_id,
            state=JobState.FAILED,
            native_state="vanished",
            reason="the supervisor ended without recording an exit code "
            "(killed, or the computer restarted)",
        )

    def open_jobs(self, account: str | None) -> list[OpenJob]:
        return []  # no queues here, so no job limits to count against

    def cancel(self, job: JobRef) -> None:
        """SIGTERM to the supervisor, which stops the job's process group (TERM, then KILL after
        the grace time); anything still alive from the tree afterwards is killed here."""
        supervisor = _supervisor_info(job)
        if _elsewhere(supervisor):
            raise SchedulerError(
                f"local job {job.native_id} runs on {supervisor['host']}: cancel "
                "it there (or end the allocation it runs in)"
            )
        proc = _live(supervisor)
        if proc is None:
            raise SchedulerError(f"local job {job.native_id} is not running")
        tree = [proc, *proc.children(recursive=True)]
        # Said before the signal: a supervisor that ends without its result (killed below, past
        # its grace) reads as cancelled, not vanished, to whoever looks before this writes one.
        (job.job_dir / CANCEL_SENT_FILE).touch()
        proc.send_signal(signal.SIGTERM)
        alive = _wait_ended(tree, 2 * GRACE_S + 5)  # the stop signal's grace, then TERM's
        for leftover in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                leftover.kill()
        if not (job.job_dir / RESULT_FILE).exists():
            tmp = job.job_dir / (RESULT_FILE + ".tmp")
            tmp.write_text(
                json.dumps(
                    {
                        "exit_code": None,
                        "signal": signal.SIGKILL,
                        "cancelled": True,
                        "timed_out": False,
                        "ended_at": time.time(),
                    }
                )
            )
            os.replace(tmp, job.job_dir / RESULT_FILE)


def _wait_ended(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Up to `timeout` s for `procs` to end; those still running. A zombie has ended: its
    parent reaps it when it will (the supervisor's may be a sweep or a notebook that lives on)."""
    deadline = time.monotonic() + timeout
    alive = procs
    while alive and time.monotonic() < deadline:
        _, alive = psutil.wait_procs(alive, timeout=0.2)
        alive = [proc for proc in alive if _running(proc)]
    return alive


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _supervisor_info(job: JobRef) -> dict | None:
    """What submit recorded of the supervisor: its pid and start time."""
    try:
        return json.loads((job.job_dir / SUPERVISOR_FILE).read_text())
    except (OSError, ValueError):
        return None


def _elsewhere(info: dict | None) -> TypeGuard[dict]:
    """The supervisor runs on another computer (sharing the job's directory): its pid means
    nothing here."""
    if not info:
        return False
    return info.get("host", socket.gethostname()) != socket.gethostname()


def _live(info: dict | None) -> psutil.Process | None:
    """The live supervisor process, checked by start time so a reused pid never matches."""
    if info is None:
        return None
    try:
        proc = psutil.Process(info["pid"])
        if (
            abs(proc.create_time() - info["create_time"]) > 1
            or proc.status() == psutil.STATUS_ZOMBIE
        ):
            return None
        return proc
    except psutil.Error:
        return None
