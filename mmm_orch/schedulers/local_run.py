"""The supervisor of one local job: `python -m mmm_orch.schedulers.local_run JOB_DIR SCRIPT WALLTIME`.

Started detached (own session) by LocalScheduler.submit, so it outlives the CLI. It runs the job
script in a process group of its own, enforces the walltime, forwards a cancel (SIGTERM) to the
whole group, and writes result.json (exit code, and whether it was cancelled or timed out).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from mmm_orch.procgroup import stop_group

GRACE_S = 10  # between SIGTERM and SIGKILL, like Slurm's KillWait
RESULT = "result.json"


def supervise(job_dir: Path, script: str, walltime: float) -> int:
    outcome = {"cancelled": False, "timed_out": False}
    proc = subprocess.Popen([script], start_new_session=True, stdin=subprocess.DEVNULL)

    def on_cancel(signum, frame):
        outcome["cancelled"] = True
        raise InterruptedError

    signal.signal(signal.SIGTERM, on_cancel)
    signal.signal(signal.SIGINT, on_cancel)
    deadline = time.monotonic() + walltime
    try:
        while proc.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                outcome["timed_out"] = True
                print(f"[mmm-orch] walltime of {walltime:.0f}s exceeded: stopping the job", flush=True)
                break
            try:
                proc.wait(min(left, 1.0))
            except subprocess.TimeoutExpired:
                pass
    except InterruptedError:
        print("[mmm-orch] cancelled: stopping the job", flush=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if proc.poll() is None:
        stop_group(proc, GRACE_S)
    code = proc.returncode
    result = {"exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None,
              **outcome, "ended_at": time.time()}
    tmp = job_dir / (RESULT + ".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(job_dir / RESULT)
    return 0


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])))
