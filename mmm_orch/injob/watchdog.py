"""The launch's guard: run it, pass its output through, end it when it hangs, and stop it in time
to checkpoint before the walltime.

    python -m mmm_orch.injob.watchdog --first-step-timeout 1800 --step-timeout 900 \\
        [--walltime-end EPOCH --margin 120 --stop-signal USR1] -- 'srun ... python -m ...'

Hang: progress is a `step=N` field on an output line (what the trainers print on rank 0). With
no step for too long it prints `[mmm-orch] hung: ...`, sends SIGTERM to the launch's process
group, SIGKILL after a grace period, and exits 124.

Walltime: at `walltime-end` minus the margin it sends the launch the stop signal once (the
trainers save at the end of the current step on all ranks and exit 75). The margin is raised to
at least twice the longest checkpoint save seen so far (trainers print `save_s=` with every save),
because the scheduler's own SIGTERM comes with only seconds before its SIGKILL (Slurm's KillWait,
PBS's kill_delay). If the trainers then saved, it prints `[mmm-orch] checkpointed before the
walltime: step=N` and exits 75, whatever the launcher passed through. Signals the scheduler
sends (TERM, USR1, INT) are passed on to the launch.

Its end: how the launch ended (exit code, why, the last step, the checkpoint to resume from) goes
to the job's outcome file (protocol.OUTCOME_FILE) in the job's directory, found from the job's log
it writes to; `mmm-orch status` reads it before the log.

A failed rank: srun returns 128 + the highest signal among its tasks, so when it terminates the
others after one exited non-zero (--kill-on-bad-exit) it returns 143 and the rank's own code is
lost; torchrun returns 1 for any failure. The watchdog exits with the code the launcher reported
for the first rank that exited non-zero.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import selectors
import signal
import subprocess
import sys
import time

from mmm_orch.injob import files, protocol, rendezvous
from mmm_orch.injob.deadline import Deadline
from mmm_orch.injob.procgroup import signal_group, stop_group

# srun's report of how tasks ended (Slurm src/srun/launch.c, _task_finish): "n1: task 0: Exited
# with exit code 3", "n2: task 1: Killed", "n1: task 1: Terminated", "...: Out Of Memory".
TASK_ENDED = re.compile(rb"^srun: error: \S+: tasks? [\d,-]+: (?:Exited with exit code (\d+))?")
# torchrun returns 1 for any failed worker; its summary names the first one's own code (torch
# distributed/elastic/multiprocessing/errors: "Root Cause (first observed failure):", then
# "  exitcode  : 3 (pid: 9772)").
ROOT_CAUSE = b"Root Cause (first observed failure)"
ROOT_CAUSE_EXIT = re.compile(rb"^\s*exitcode\s*:\s*(-?\d+)")
# After the launch exits, how long processes it left behind may keep its output open before
# they are ended: a stray child must not hold the allocation until the walltime.
LINGER = 5.0
STOPS = (signal.SIGTERM, signal.SIGINT)  # from the scheduler: qdel, scancel, the walltime


class Launch:
    """The launch and what its output said so far."""

    def __init__(self, command: str, progress: str = "step"):
        # A process group of its own, so that a hang stops all of the launch; the same session,
        # so that a PBS MoM (which signals the job's session at the walltime) still reaches it.
        self.process = subprocess.Popen(
            ["bash", "-c", command],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=os.setpgrp,
        )
        self.started = self.last_progress = time.monotonic()
        self.last_step: int | None = None
        self.longest_save = 0.0
        self.saved_step: int | None = None  # the last checkpoint's step
        self.task_reported = False  # srun has reported how a task ended
        self.first_rank_exit: int | None = None  # ...and that first task exited with this code
        self.root_cause = False  # torchrun's failure summary reached its first failure
        self.lines: collections.deque[str] = collections.deque(maxlen=2000)  # the output's end
        self.code: int | None = None
        self.hung = self.checkpointed = self.stopped_for_walltime = False
        self.hung_reason = ""  # what the watchdog saw when it ended a hang
        self.received: list[int] = []  # signals the scheduler sent (passed on to the launch)
        self.port_in_use = False  # a rank could not bind the rendezvous port before step 1
        # What counts as progress besides step=N: any line (`output`), or lines matching a pattern.
        self.progress = progress
        self._progress_line = (
            None
            if progress == "step"
            else re.compile(rb"\S")
            if progress == "output"
            else re.compile(progress.encode())
        )
        self.progressed = False  # a line counted as progress came
        self._pending = b""

    @property
    def rendezvous_refused(self) -> bool:
        """It failed before its first step because the rendezvous port was taken: a launch
        fault to retry on another port."""
        return (
            self.code != 0
            and self.port_in_use
            and self.last_step is None
            and not self.hung
            and not self.received
            and not self.stopped_for_walltime
        )

    def feed(self, chunk: bytes) -> None:
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for line in lines:
            self.lines.append(line.decode(errors="replace"))
            if match := protocol.STEP_BYTES.search(line):
                # The furthest step reported: ranks that each print theirs interleave.
                step = max(int(match[1]), self.last_step or 0)
                self.last_step, self.last_progress = step, time.monotonic()
            elif self._progress_line is not None and self._progress_line.search(line):
                self.progressed, self.last_progress = True, time.monotonic()
            if match := protocol.SAVED_BYTES.search(line):
                self.saved_step = int(match[1])
                self.longest_save = max(self.longest_save, float(match[2]))
            if self.last_step is None and rendezvous.PORT_IN_USE.search(
                line.decode(errors="replace")
            ):
                self.port_in_use = True
            if not self.task_reported and (match := TASK_ENDED.search(line)):
                self.task_reported = True
                self.first_rank_exit = int(match[1]) if match[1] else None  # None: killed
            if ROOT_CAUSE in line:
                self.root_cause = True
            elif (
                self.root_cause
                and not self.task_reported
                and (match := ROOT_CAUSE_EXIT.match(line))
            ):
                self.task_reported = True
                self.first_rank_exit = int(match[1]) if int(match[1]) > 0 else None  # < 0: a signal


def watch(
    command: str,
    first_step_timeout: float,
    step_timeout: float,
    grace: float = 30.0,
    walltime_end: float | None = None,
    margin: float = 0.0,
    stop_signal: int = signal.SIGUSR1,
    progress: str = "step",
) -> int:
    return _code(
        run_bound(
            command,
            first_step_timeout,
            step_timeout,
            grace,
            walltime_end,
            margin,
            stop_signal,
            progress=progress,
        )
    )


def _code(launch: Launch) -> int:
    return launch.code if launch.code is not None else 1


def resumable_step(seen: int | None) -> int | None:
    """The checkpoint a resume starts from: the run's newest complete one where the job names its
    run directory, else the last save the launch printed (`seen`)."""
    run_dir = os.environ.get(protocol.RUN_DIR_VAR)
    latest = protocol.latest_step(run_dir) if run_dir else None
    return latest if latest is not None else seen


def outcome(launch: Launch) -> files.Outcome:
    """How the launch ended, for the job's outcome file: the watchdog's own stop of a hang, then
    the scheduler's stop (a save it caused included, and a launcher that exits 0 once its ranks
    were stopped: MPICH's mpiexec does), then a success."""
    code = _code(launch)
    stops = [signal.Signals(s).name for s in launch.received if s in STOPS]
    if launch.hung:
        why, detail = files.WHY_HUNG, launch.hung_reason
    elif stops:
        why, detail = files.WHY_STOPPED, f"stopped by {stops[0]}"
    elif code == 0:
        why, detail = files.WHY_COMPLETED, "the launch finished"
    elif launch.checkpointed or code == protocol.EXIT_CHECKPOINTED:
        why, detail = files.WHY_CHECKPOINTED, "saved a checkpoint before the walltime"
    else:
        why, detail = files.WHY_FAILED, f"the launch exited {code}"
    return files.Outcome(
        code, why, detail, launch.last_step, resumable_step(launch.saved_step), time.time()
    )


def run_bound(command: str, *args, **kwargs) -> Launch:
    """run(), relaunched on a fresh MASTER_PORT while the rendezvous could not bind its port
    (another job or attempt on the node holds it), at most rendezvous.TRIES launches."""
    for tries in range(1, rendezvous.TRIES + 1):
        launch = run(command, *args, **kwargs, relaunchable=tries < rendezvous.TRIES)
        if not launch.rendezvous_refused or tries == rendezvous.TRIES:
            return launch
        port = rendezvous.free_port()
        protocol.say(
            protocol.RENDEZVOUS,
            f" port {os.environ.get('MASTER_PORT', '?')} was in use "
            f"before the first step; relaunching on port {port} "
            f"({tries}/{rendezvous.TRIES - 1})",
        )
        os.environ["MASTER_PORT"] = str(port)
    raise AssertionError("unreachable: the last try always returns")


def run(
    command: str,
    first_step_timeout: float,
    step_timeout: float,
    grace: float = 30.0,
    walltime_end: float | None = None,
    margin: float = 0.0,
    stop_signal: int = signal.SIGUSR1,
    *,
    relaunchable: bool = False,
    progress: str = "step",
) -> Launch:
    """Run the launch to its end; the Launch says how it ended (`code`, `hung`,
    `checkpointed`) and what it printed last. `relaunchable`: a rank that cannot bind the
    rendezvous port ends the launch at once (the other ranks would wait for it until their
    timeout where the launcher does not end them, as MPICH's Hydra does not)."""
    deadline = Deadline(walltime_end, margin) if walltime_end is not None else None
    return _Guard(
        Launch(command, progress), first_step_timeout, step_timeout, grace, deadline, stop_signal
    ).run(relaunchable)


class _Guard:
    """One launch watched: its output passed through, its hang or walltime acted on."""

    def __init__(
        self,
        launch: Launch,
        first_step_timeout: float,
        step_timeout: float,
        grace: float,
        deadline: Deadline | None,
        stop_signal: int,
    ):
        self.launch, self.process = launch, launch.process
        self.first_step_timeout, self.step_timeout, self.grace = (
            first_step_timeout,
            step_timeout,
            grace,
        )
        self.deadline, self.stop_signal = deadline, stop_signal
        self.exited_at: float | None = None
        self.stop_sent_after: int | None = None  # the checkpoint step seen when the stop was sent
        self.out = sys.stdout.buffer
        for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(signum, self._pass_on)
        assert self.process.stdout is not None
        self.stdout = self.process.stdout
        os.set_blocking(self.stdout.fileno(), False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.stdout, selectors.EVENT_READ)

    def _pass_on(self, signum: int, _frame) -> None:
        self.launch.received.append(signum)
        signal_group(self.process.pid, signum)

    def run(self, relaunchable: bool) -> Launch:
        launch, process = self.launch, self.process
        while True:
            if self._read_until_eof():
                return self._finish(process.wait())
            now = time.monotonic()
            if self.exited_at is None and process.poll() is not None:
                self.exited_at = now
            if (
                relaunchable
                and self.exited_at is None
                and launch.port_in_use
                and launch.last_step is None
            ):
                protocol.say(
                    protocol.RENDEZVOUS,
                    f" a rank could not bind port "
                    f"{os.environ.get('MASTER_PORT', '?')}; stopping the launch",
                )
                stop_group(process, self.grace)
                launch.code = process.returncode or 1
                return launch
            if self.exited_at is not None:
                if now - self.exited_at > LINGER:
                    protocol.say(
                        protocol.WATCHDOG,
                        f" the launch exited ({process.returncode}) "
                        f"but processes it started still hold its output after "
                        f"{LINGER:.0f}s; ending them",
                    )
                    signal_group(process.pid, signal.SIGKILL)
                    return self._finish(process.returncode)
                continue
            if self.deadline is not None and self.stop_sent_after is None:
                self._stop_before_walltime()
            seen = launch.last_step is not None or launch.progressed
            limit, since = (
                (self.step_timeout, launch.last_progress)
                if seen
                else (self.first_step_timeout, launch.started)
            )
            if self.stop_sent_after is None and now - since > limit:
                return self._hung(limit)

    def _read_until_eof(self) -> bool:
        """Pass on what the launch printed within a second; True at the end of its output."""
        stdout = self.stdout
        for _ in self.selector.select(timeout=1.0):
            chunk = stdout.read()
            if chunk is None:  # spurious wake-up
                continue
            if not chunk:  # EOF: every writer closed the pipe
                self.selector.unregister(stdout)
                return True
            self.out.write(chunk)
            self.out.flush()
            self.launch.feed(chunk)
        return False

    def _stop_before_walltime(self) -> None:
        launch, deadline = self.launch, self.deadline
        if deadline is None or not deadline.stop_due(launch.longest_save):
            return
        needed = deadline.stop_margin(launch.longest_save)
        why = (
            f"2 x the longest save, {launch.longest_save:.1f}s"
            if needed > deadline.margin
            else "the workload's margin"
        )
        step = launch.last_step if launch.last_step is not None else "none"
        protocol.say(
            protocol.WALLTIME_STOP,
            f"{time.time():.3f} walltime in "
            f"{max(deadline.left(), 0):.0f}s: asking the trainers to save a checkpoint "
            f"and stop (margin {needed:.0f}s: {why}; step {step})",
        )
        self.stop_sent_after = launch.saved_step if launch.saved_step is not None else -1
        signal_group(self.process.pid, self.stop_signal)

    def _hung(self, limit: float) -> Launch:
        launch, process = self.launch, self.process
        if launch.progress != "step" and launch.last_step is None:
            kind = "output" if launch.progress == "output" else f"line matching {launch.progress!r}"
            what = (
                f"no {kind} in {limit:.0f}s"
                if launch.progressed
                else f"no {kind} within {limit:.0f}s of launch"
            )
        elif launch.last_step is not None:
            what = f"no step completed in {limit:.0f}s after step {launch.last_step}"
        else:
            what = f"no first step within {limit:.0f}s of launch"
        launch.hung_reason = (
            f"{what}; last_step={launch.last_step if launch.last_step is not None else 'none'}"
        )
        verdict = (
            f"{protocol.HUNG} {launch.hung_reason}; "
            f"stopping the launch (SIGTERM, SIGKILL after {self.grace:.0f}s)"
        )
        print(verdict, flush=True)
        launch.lines.append(verdict)  # what follows is the launcher's answer to this stop
        stop_group(process, self.grace)
        for _ in self.selector.select(timeout=1.0):  # what the ranks said while stopping
            chunk = self.stdout.read() or b""
            self.out.write(chunk)
            self.out.flush()
            launch.feed(chunk + b"\n")
        launch.code, launch.hung = protocol.EXIT_HUNG, True
        return launch

    def _finish(self, code: int) -> Launch:
        launch, stop_sent_after = self.launch, self.stop_sent_after
        saved_since = launch.saved_step is not None and launch.saved_step != stop_sent_after
        # Exit 75 after a save: the trainers saved on a stop, this one's or the scheduler's own
        # early signal (Slurm's --signal reaches the ranks, not the watchdog, and may come first).
        saved_on_a_stop = launch.saved_step is not None and code == protocol.EXIT_CHECKPOINTED
        launch.code = code
        if (stop_sent_after is not None and saved_since) or saved_on_a_stop:
            protocol.say(
                protocol.CHECKPOINTED,
                f" step={launch.saved_step}; continue with "
                f"--resume (exit {protocol.EXIT_CHECKPOINTED}; the launch returned {code})",
            )
            launch.code, launch.checkpointed = protocol.EXIT_CHECKPOINTED, True
        elif (
            (code > 128 or (code == 1 and launch.root_cause))
            and launch.first_rank_exit
            and not launch.received
            and stop_sent_after is None
        ):
            protocol.say(
                protocol.WATCHDOG,
                f" a rank exited with code {launch.first_rank_exit} "
                f"first; the launch returned {code} after ending the others: exit "
                f"{launch.first_rank_exit}",
            )
            launch.code = launch.first_rank_exit
        launch.stopped_for_walltime = stop_sent_after is not None
        return launch


def add_options(parser: argparse.ArgumentParser) -> None:
    """The watchdog's options; failover takes the same ones for the watchdog of each attempt."""
    option = protocol.OPTIONS
    parser.add_argument(option["first_step_timeout"], type=float, required=True, metavar="SECONDS")
    parser.add_argument(option["step_timeout"], type=float, required=True, metavar="SECONDS")
    parser.add_argument(
        option["grace"],
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="after SIGTERM, before SIGKILL",
    )
    parser.add_argument(
        option["walltime_end"],
        type=float,
        metavar="EPOCH",
        help="when the scheduler ends the job (seconds since 1970)",
    )
    parser.add_argument(
        option["margin"],
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="stop this long before the walltime end (raised to 2 x the longest save)",
    )
    parser.add_argument(
        option["stop_signal"],
        default="USR1",
        metavar="NAME",
        help="what the launch gets to save and stop (USR1 passes srun and mpiexec)",
    )
    parser.add_argument(
        option["progress"],
        default="step",
        metavar="step|output|REGEX",
        help="what counts as progress: a step=N field, any line, or a pattern",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mmm_orch.injob.watchdog", description=(__doc__ or "").split("\n\n")[0]
    )
    add_options(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the launch line")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if len(command) != 1:
        parser.error("give the launch line as one argument after --")
    launch = run_bound(
        command[0],
        args.first_step_timeout,
        args.step_timeout,
        args.grace,
        args.walltime_end,
        args.margin,
        signal.Signals[f"SIG{args.stop_signal}"],
        progress=args.progress,
    )
    files.write_outcome(outcome(launch))  # beside the job's log; none where there is none
    return _code(launch)


if __name__ == "__main__":
    sys.exit(main())
