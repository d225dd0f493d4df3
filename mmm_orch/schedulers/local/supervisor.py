"""The supervisor of one local job:
`python -m mmm_orch.schedulers.local.supervisor JOB_DIR SCRIPT WALLTIME [STOP_SIGNAL [HOLDER]]`.

Started detached (own session) by LocalScheduler.submit, so it outlives the CLI. It records its
own pid first (supervisor.json: how the job is found again), runs the job script in a process
group of its own, enforces the walltime, and on a cancel (SIGTERM; one sent while it starts up
waits, blocked, until it can handle it) or at the walltime stops the job the way a batch
scheduler does: SIGTERM to every process of the job, SIGKILL to what is left after GRACE_S. It
waits for all of them, not only the script, so a trainer still writing its checkpoint is not
killed because the shell above it already returned. Then it writes result.json (exit code, and
whether it was cancelled or timed out).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from mmm_orch.hosts.transport import subreaper
from mmm_orch.injob.deadline import Deadline
from mmm_orch.injob.protocol import PREFIX, RESULT_FILE, SUPERVISOR_FILE

GRACE_S = 10  # between SIGTERM and SIGKILL, like Slurm's KillWait and PBS's kill_delay
# A cancel. LocalScheduler.submit starts the supervisor with these blocked, so that one sent while
# it starts up (the record says running from its start) waits for supervise to handle it rather
# than killing it before it could stop the job and record how it ended.
CANCEL_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def stop_job(script: subprocess.Popen, grace: float) -> None:
    """SIGTERM to every process of the job (each once, including ones that appear meanwhile),
    then SIGKILL to those still alive after `grace` s; returns when none is left."""
    me = psutil.Process()
    signalled: set[int] = set()

    def signal_all(signum: int) -> list[psutil.Process]:
        if signum == signal.SIGKILL or not signalled:  # the script's group: once per signal
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(script.pid, signum)
        tree = me.children(recursive=True)
        for proc in tree:
            if signum == signal.SIGKILL or proc.pid not in signalled:
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(signum)
                signalled.add(proc.pid)
        return tree

    def wait_for(tree: list[psutil.Process], timeout: float) -> None:
        # The script is reaped by its Popen, which keeps its exit status (psutil's wait would
        # reap it first, and Popen would then say 0); the rest by psutil (this process is the
        # job's subreaper: an orphan of the job is a child here).
        others = [proc for proc in tree if proc.pid != script.pid]
        if others:
            psutil.wait_procs(others, timeout=timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            script.wait(0 if others else timeout)

    deadline = time.monotonic() + grace
    while tree := signal_all(signal.SIGTERM):
        wait_for(tree, 0.2)
        if time.monotonic() > deadline:
            left = me.children(recursive=True)
            print(
                f"{PREFIX} {len(left)} process(es) still running {grace:.0f}s after SIGTERM: "
                "SIGKILL",
                flush=True,
            )
            wait_for(signal_all(signal.SIGKILL), 5)
            break
    script.wait()


def ask_the_launch_to_stop(script: subprocess.Popen, stop_signal: int, grace: float) -> None:
    """The launcher's own stop signal to each launch the script started (a process group of its
    own, made by the watchdog), then up to `grace` s for the job to end. srun passes USR1 on to
    every rank where a SIGTERM would make it kill them (inside an allocation no scheduler signals
    the ranks themselves); the trainers save and exit."""
    me = psutil.Process()
    for proc in me.children(recursive=True):
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(proc.pid) == proc.pid and proc.pid != script.pid:
                os.killpg(proc.pid, stop_signal)
    with contextlib.suppress(subprocess.TimeoutExpired):
        script.wait(grace)


def _ended(holder: str) -> bool:
    """Whether the process `pid:start time` has ended ('' is no process: never)."""
    if not holder:
        return False
    pid, started = holder.split(":")
    try:
        process = psutil.Process(int(pid))
        # (start times are read against the boot time, which psutil reads again each time:
        # a stepped clock moves them a little, as submission/settle.submitter_alive allows too)
        return (
            abs(process.create_time() - float(started)) >= 1
            or process.status() == psutil.STATUS_ZOMBIE
        )
    except psutil.NoSuchProcess:
        return True


def _start(script: str) -> subprocess.Popen:
    """The job script, in a session of its own, getting the cancel signals as any job does (its
    trap handles SIGTERM) where this process still has them blocked."""
    return subprocess.Popen(
        [script],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, CANCEL_SIGNALS),
    )


def supervise(
    job_dir: Path, script: str, walltime: float, stop_signal: int = signal.SIGTERM, holder: str = ""
) -> int:
    """`holder`: the process the job belongs to (`pid:start time`, a launch in the foreground);
    its end, however it comes (a SIGKILL, the allocation's end), stops the job as a cancel."""
    me = psutil.Process()
    # The start by this clock, as the result's end is: psutil's create_time counts from the boot
    # time, which the kernel gives in whole seconds, so it can read up to 1 s early (a point of
    # a pack would seem to start before the one whose nodes it took had ended). create_time
    # stays what identifies the process.
    _write_json(
        job_dir / SUPERVISOR_FILE,
        {
            "pid": me.pid,
            "create_time": me.create_time(),
            "started_at": time.time(),
            "host": socket.gethostname(),
        },
    )
    # The job's subreaper: processes whose parent exits (the job script, torchrun) come here
    # instead of to init, so the job's whole tree stays visible (not Linux: what stays attached).
    subreaper(True)
    outcome = {"cancelled": False, "timed_out": False}
    proc = _start(script)

    def on_cancel(signum, frame):
        outcome["cancelled"] = True
        raise InterruptedError

    for signum in CANCEL_SIGNALS:
        signal.signal(signum, on_cancel)
    deadline = Deadline.after(walltime)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, CANCEL_SIGNALS)  # a cancel sent so far: now
        while proc.poll() is None:
            if deadline.passed():
                outcome["timed_out"] = True
                print(
                    f"{PREFIX} walltime of {walltime:.0f}s exceeded: stopping the job", flush=True
                )
                break
            if _ended(holder):
                outcome["cancelled"] = True
                print(f"{PREFIX} the launch holding the job ended: stopping the job", flush=True)
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(min(deadline.left(), 1.0))
    except InterruptedError:
        print(f"{PREFIX} cancelled: stopping the job", flush=True)
    for signum in CANCEL_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if outcome["cancelled"] and stop_signal != signal.SIGTERM and proc.poll() is None:
        ask_the_launch_to_stop(proc, stop_signal, GRACE_S)
    if proc.poll() is None or psutil.Process().children(recursive=True):
        stop_job(proc, GRACE_S)
    code = proc.returncode
    _write_json(
        job_dir / RESULT_FILE,
        {
            "exit_code": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            **outcome,
            "ended_at": time.time(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(
        supervise(
            Path(sys.argv[1]),
            sys.argv[2],
            float(sys.argv[3]),
            signal.Signals[f"SIG{sys.argv[4]}"] if len(sys.argv) > 4 else signal.SIGTERM,
            sys.argv[5] if len(sys.argv) > 5 else "",
        )
    )
