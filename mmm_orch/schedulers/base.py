"""What every scheduler module shares: running its commands (argument lists, never a shell
string) with bounded retries, the errors they raise, and the job handles its verbs take."""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from mmm_orch.errors import MmmError
from mmm_orch.schedulers.states import JobStatus


class SchedulerError(MmmError):
    """The scheduler refused (bad partition, over a limit, ...): its own message, exit code 2."""


class SchedulerUnavailable(MmmError):
    """The scheduler could not be reached within the retry budget."""

    exit_code = 3


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def message(self) -> str:
        """The command's own words: stderr, else stdout, as one line."""
        text = (self.stderr.strip() or self.stdout.strip()).replace("\n", " | ")
        return text[:500]


class Runner(Protocol):
    """Runs a scheduler command here or on a login node (the SSH runner has the same shape);
    `env` adds variables for that command only."""

    def run(self, argv: Sequence[str], *, cwd: str | None = None, timeout: float = 30,
            env: dict[str, str] | None = None) -> CommandResult:
        ...


class LocalRunner:
    def run(self, argv: Sequence[str], *, cwd: str | None = None, timeout: float = 30,
            env: dict[str, str] | None = None) -> CommandResult:
        proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True,
                              errors="replace", timeout=timeout, stdin=subprocess.DEVNULL,
                              env={**os.environ, **env} if env else None)
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


@dataclass(frozen=True)
class Retry:
    """Bounded exponential backoff; `deadline` caps the time spent on all attempts together."""

    attempts: int = 5
    first_delay: float = 1.0
    max_delay: float = 8.0
    deadline: float = 60.0
    timeout: float = 30.0  # one command

    @classmethod
    def from_env(cls, purpose: str) -> Retry:
        """Defaults per purpose; MMM_ORCH_RETRY_DEADLINE shortens or lengthens the budget."""
        base = cls() if purpose == "submit" else cls(attempts=3, deadline=12.0, timeout=15.0)
        deadline = os.environ.get("MMM_ORCH_RETRY_DEADLINE")
        if deadline:
            from dataclasses import replace

            base = replace(base, deadline=float(deadline))
        return base


def run_command(runner: Runner, argv: Sequence[str], transient: re.Pattern[str], retry: Retry,
                *, cwd: str | None = None, transient_codes: frozenset[int] = frozenset(),
                env: dict[str, str] | None = None) -> CommandResult:
    """Run until the command answers with something other than a transient failure.

    Returns the result whatever its exit code (the caller knows which codes mean what); raises
    SchedulerUnavailable when every attempt within the budget timed out or was transient.
    """
    start = time.monotonic()
    delay = retry.first_delay
    last = ""
    for attempt in range(1, retry.attempts + 1):
        remaining = retry.deadline - (time.monotonic() - start)
        try:
            result = runner.run(argv, cwd=cwd, timeout=max(1.0, min(retry.timeout, remaining)),
                                env=env)
        except subprocess.TimeoutExpired:
            last = f"no answer within {retry.timeout:g}s"
        except FileNotFoundError:
            raise SchedulerError(f"{argv[0]}: command not found (is this the machine's login node?)")
        else:
            if result.returncode == 0 or not (
                    transient.search(result.stderr) or transient.search(result.stdout)
                    or result.returncode in transient_codes):
                return result
            last = result.message
        if attempt == retry.attempts or time.monotonic() - start + delay > retry.deadline:
            break
        time.sleep(delay)
        delay = min(delay * 2, retry.max_delay)
    raise SchedulerUnavailable(
        f"{argv[0]} failed {attempt} time(s) in {time.monotonic() - start:.0f}s: {last}")


@dataclass(frozen=True)
class Submission:
    """What a scheduler needs to submit one rendered script."""

    script: Path
    workdir: str
    job_dir: Path
    log_path: Path
    walltime: int


@dataclass(frozen=True)
class JobRef:
    """A submitted job as the scheduler verbs see it."""

    native_id: str
    job_dir: Path


class CommandScheduler:
    """A batch scheduler driven by its commands: the profile's command names over `defaults`,
    run through `runner` (here or on a login node) with the scheduler's own transient errors
    retried and `query_env` set for its queries."""

    defaults: dict[str, str] = {}
    transient: re.Pattern[str]
    transient_codes: frozenset[int] = frozenset()
    query_env: dict[str, str] = {}

    def __init__(self, commands: dict[str, str], runner: Runner):
        self.cmd = {**self.defaults, **{k: v for k, v in commands.items() if v}}
        self.runner = runner
        self.submit_command = self.cmd["submit"]

    def _run(self, argv: list[str], purpose: str, cwd: str | None = None) -> CommandResult:
        """`purpose` is "submit" (also cancel) or "query": it picks the retry budget and env."""
        return run_command(self.runner, argv, self.transient, Retry.from_env(purpose), cwd=cwd,
                           transient_codes=self.transient_codes,
                           env=self.query_env if purpose == "query" else None)


class Scheduler(Protocol):
    submit_command: str  # what must be on PATH to submit from here ('' for none)

    def submit(self, submission: Submission) -> str: ...
    def query(self, jobs: Sequence[JobRef]) -> dict[str, JobStatus]: ...
    def cancel(self, job: JobRef) -> None: ...


def scheduler_for(kind: str, commands: dict[str, str], runner: Runner | None = None) -> Scheduler:
    """The scheduler module for a profile's `scheduler.kind`, with the profile's command names."""
    runner = runner or LocalRunner()
    if kind == "slurm":
        from mmm_orch.schedulers.slurm import SlurmScheduler

        return SlurmScheduler(commands, runner)
    if kind == "pbs":
        from mmm_orch.schedulers.pbs import PbsScheduler

        return PbsScheduler(commands, runner)
    if kind == "local":
        from mmm_orch.schedulers.local import LocalScheduler

        return LocalScheduler()
    raise MmmError(f"scheduler kind {kind!r} is not supported: expected slurm, pbs or local")
