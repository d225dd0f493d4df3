"""Hang protection for a launch: run it, pass its output through, and end it when no training
step completed for too long. A rank stuck in a collective otherwise holds every node until the
walltime.

    python -m mmm_orch.watchdog --first-step-timeout 1800 --step-timeout 900 -- 'srun ... python -m ...'

Progress is a `step=N` field on an output line (what the trainers print on rank 0). On a hang it
prints `[mmm-orch] hung: ...`, sends SIGTERM to the launch's process group (trainers checkpoint on
it), SIGKILL after a grace period, and exits 124. Signals the scheduler sends before the walltime
(TERM, USR1, INT) are passed on to the launch.
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import signal
import subprocess
import sys
import time

from mmm_orch.procgroup import signal_group, stop_group

STEP = re.compile(rb"(?:^|[\s,\]])step=(\d+)")
HUNG_EXIT = 124
HUNG_MARKER = "[mmm-orch] hung:"
# After the launch exits, how long processes it left behind may keep its output open before
# they are ended: a stray child must not hold the allocation until the walltime.
LINGER = 5.0



def watch(command: str, first_step_timeout: float, step_timeout: float, grace: float = 30.0) -> int:
    # A process group of its own, so that a hang stops all of the launch; the same session, so
    # that a PBS MoM (which signals the job's session at the walltime) still reaches it.
    process = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, preexec_fn=os.setpgrp)

    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signum, lambda signum, _frame: signal_group(process.pid, signum))

    assert process.stdout is not None
    os.set_blocking(process.stdout.fileno(), False)
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    out = sys.stdout.buffer
    started = last_progress = time.monotonic()
    last_step: int | None = None
    exited_at: float | None = None
    pending = b""
    while True:
        for _ in selector.select(timeout=1.0):
            chunk = process.stdout.read()
            if chunk is None:  # spurious wake-up
                continue
            if not chunk:  # EOF: every writer closed the pipe
                selector.unregister(process.stdout)
                return process.wait()
            out.write(chunk)
            out.flush()
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if match := STEP.search(line):
                    last_step, last_progress = int(match[1]), time.monotonic()
        now = time.monotonic()
        if exited_at is None and process.poll() is not None:
            exited_at = now
        if exited_at is not None:
            if now - exited_at > LINGER:
                print(f"[mmm-orch] watchdog: the launch exited ({process.returncode}) but processes "
                      f"it started still hold its output after {LINGER:.0f}s; ending them", flush=True)
                signal_group(process.pid, signal.SIGKILL)
                return process.returncode
            continue
        limit, since = ((step_timeout, last_progress) if last_step is not None
                        else (first_step_timeout, started))
        if now - since > limit:
            what = (f"no step completed in {limit:.0f}s after step {last_step}" if last_step is not None
                    else f"no first step within {limit:.0f}s of launch")
            print(f"{HUNG_MARKER} {what}; last_step={last_step if last_step is not None else 'none'}; "
                  f"stopping the launch (SIGTERM, SIGKILL after {grace:.0f}s)", flush=True)
            stop_group(process, grace)
            for _ in selector.select(timeout=1.0):  # what the ranks said while stopping
                out.write(process.stdout.read() or b"")
                out.flush()
            return HUNG_EXIT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmm_orch.watchdog", description=__doc__.split("\n\n")[0])
    parser.add_argument("--first-step-timeout", type=float, required=True, metavar="SECONDS")
    parser.add_argument("--step-timeout", type=float, required=True, metavar="SECONDS")
    parser.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                        help="after SIGTERM, before SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the launch line")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if len(command) != 1:
        parser.error("give the launch line as one argument after --")
    return watch(command[0], args.first_step_timeout, args.step_timeout, args.grace)


if __name__ == "__main__":
    sys.exit(main())
