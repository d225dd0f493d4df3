"""What every scheduler module shares: the submission protocol that never loses or duplicates a
job, the job handles its verbs take, and what some of them can do besides (grant an allocation,
list their queues). Commands run through mmm_orch.hosts.transport (argument lists, never a shell
string, with bounded retries); scheduler_for (schedulers/__init__.py) picks the kind."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from mmm_orch.dataclass_code import dataclass
from mmm_orch.errors import (
    MmmError,
    OverLimit,
    SchedulerError,
    SchedulerUnavailable,
    SubmissionRefused,
    SubmissionUnconfirmed,
    Unreachable,
)
from mmm_orch.hosts.transport import CommandResult, Retry, Runner, run_command
from mmm_orch.schedulers.states import JobStatus, LiveQueue, OpenJob

# A job's submit time is the scheduler's clock, its record's the submitter's: a tag lookup that
# starts at the record's time allows for this much skew.
FIND_SLACK_S = 120


@dataclass(frozen=True)
class Submission:
    """What a scheduler needs to submit one rendered script, and to find it again by its tag."""

    script: Path
    workdir: str
    job_dir: Path
    log_path: Path
    walltime: int
    name: str = ""
    tag: str = ""
    submitted_at: float = 0.0  # when the record was made: a tag lookup need not look earlier
    # What the launcher passes on to the ranks to save and stop (USR1 through srun and mpiexec):
    # the local executor sends it to the launch first when the job is cancelled.
    stop_signal: str = "TERM"
    # The local executor only: the process the job belongs to (a `launch` in the foreground,
    # holding the allocation); the job is stopped as a cancel would stop it once that process
    # ends, however it ends (0: none, the job lives on its own).
    held_by: int = 0


@dataclass(frozen=True)
class JobRef:
    """A submitted job as the scheduler verbs see it."""

    native_id: str
    job_dir: Path


class CommandScheduler:
    """A batch scheduler driven by its commands: the profile's command names over `defaults`,
    run through `runner` (here or on a login node) with the scheduler's own transient errors
    retried and `query_env` set for its queries.

    `transient` errors are worth another try; of those, `unsent` ones prove that the request
    never reached the scheduler (connection refused). A refusal is the submit command's
    `refusal_codes` exit status with its `refusal` words on stderr; with `over_limit` words
    too, it was for a job-count limit (OverLimit). Anything else (a timeout, a
    dropped connection, a command killed by a signal, silent, or with another status) is
    ambiguous: the scheduler may have taken the job, so submit looks for the job's tag before it
    tries again."""

    defaults: dict[str, str] = {}
    transient: re.Pattern[str]
    unsent: re.Pattern[str]
    transient_codes: frozenset[int] = frozenset()
    refusal: re.Pattern[str]
    refusal_codes: frozenset[int]
    over_limit: re.Pattern[str] = re.compile(r"(?!)")  # none unless the scheduler says
    query_env: dict[str, str] = {}

    def __init__(self, commands: dict[str, str], runner: Runner):
        given = {k: v for k, v in commands.items() if v}
        # A profile that names its submit command by path finds the others in the same place.
        where = os.path.dirname(given.get("submit", ""))
        self.cmd = {**{k: os.path.join(where, v) for k, v in self.defaults.items()}, **given}
        self.runner = runner
        self.submit_command = self.cmd["submit"]

    def _run(self, argv: list[str], purpose: str, cwd: str | None = None) -> CommandResult:
        """`purpose` is "submit" (also cancel) or "query": it picks the retry budget and env."""
        return run_command(
            self.runner,
            argv,
            self.transient,
            Retry.from_env(purpose),
            cwd=cwd,
            transient_codes=self.transient_codes,
            env=self.query_env if purpose == "query" else None,
        )

    # Each scheduler module provides these four.
    def submit_argv(self, submission: Submission) -> list[str]:
        raise NotImplementedError

    def parse_submit(self, stdout: str) -> str:
        raise NotImplementedError

    def find(self, submission: Submission) -> list[str] | None:
        """Native ids of the jobs that carry the submission's tag; None when the scheduler
        could not be asked."""
        raise NotImplementedError

    def cancel(self, job: JobRef) -> None:
        raise NotImplementedError

    def open_jobs(self, account: str | None) -> list[OpenJob]:
        """The unfinished jobs of this user, and of project `account` when given, as the
        facility's job limits count them; SchedulerError when the scheduler cannot say."""
        raise NotImplementedError

    def user(self) -> str:
        """Who the scheduler sees submitting (on a login node over SSH: the remote account)."""
        result = self._run(["id", "-un"], "query")
        if result.returncode != 0 or not result.stdout.strip():
            raise SchedulerError(f"id -un: {result.message or 'no user name'}")
        return result.stdout.strip()

    def submit(self, submission: Submission) -> str:
        """Submit exactly once: the native id, or SubmissionRefused / Unreachable (nothing
        submitted), or any other error (the scheduler may have the job)."""
        retry = Retry.from_env("submit")
        start, delay = time.monotonic(), retry.first_delay
        argv = self.submit_argv(submission)
        maybe_sent = False  # an earlier attempt may have reached the scheduler
        last = ""
        while True:
            left = retry.deadline - (time.monotonic() - start)
            # Never try again while the scheduler may have the job and cannot say whether it does.
            found = self.find(submission) if maybe_sent else []
            if found:
                native_id = found[0]
                break
            if found is not None:
                try:
                    outcome = self._submit_once(
                        argv, submission, max(1.0, min(retry.timeout, left))
                    )
                except SubmissionRefused as exc:
                    if not maybe_sent:
                        raise
                    # The refusal answers this attempt only (a limit may count the first job).
                    raise SubmissionUnconfirmed(
                        f"{exc}; an earlier attempt may have reached the scheduler: `mmm-orch "
                        "status` will find the job by its tag"
                    ) from None
                if isinstance(outcome, str):
                    native_id = outcome
                    break
                sent, last = outcome
                maybe_sent = maybe_sent or sent
            if time.monotonic() - start + delay > retry.deadline:
                if maybe_sent:
                    time.sleep(min(delay, retry.first_delay))
                    if found := self.find(submission):  # one last look before giving up
                        native_id = found[0]
                        break
                    raise SubmissionUnconfirmed(
                        f"{argv[0]}: no clear answer within {retry.deadline:g}s ({last}); the "
                        "scheduler may have the job: `mmm-orch status` will find it by its tag"
                    )
                raise Unreachable(f"{argv[0]} failed for {time.monotonic() - start:.0f}s: {last}")
            time.sleep(delay)
            delay = min(delay * 2, retry.max_delay)
        if maybe_sent:
            self._drop_duplicates(submission, native_id)
        return native_id

    def _submit_once(
        self, argv: list[str], submission: Submission, timeout: float
    ) -> str | tuple[bool, str]:
        """The native id, or (whether the request may have reached the scheduler, why not);
        raises SubmissionRefused when the scheduler refused the job."""
        try:
            result = self.runner.run(argv, cwd=submission.workdir, timeout=timeout)
        except subprocess.TimeoutExpired:
            return True, f"no answer within {timeout:.0f}s"
        except FileNotFoundError:
            raise SubmissionRefused(
                f"{argv[0]}: command not found (is this the machine's login node?)"
            ) from None
        except Unreachable as exc:
            return False, str(exc)
        except SchedulerUnavailable as exc:  # the connection dropped while the command ran
            return True, str(exc)
        if result.returncode == 0:
            try:
                return self.parse_submit(result.stdout)
            except ValueError as exc:
                return True, str(exc)
        text = result.stderr + result.stdout
        if self.transient.search(text) or result.returncode in self.transient_codes:
            return not self.unsent.search(text), result.message
        # Only the scheduler's own refusal proves it has no job: the command ended by itself with
        # its refusal status and words. Killed by a signal (a negative status here, 128+N through
        # a shell), silent, or with another status, it may have been taken already.
        if result.returncode in self.refusal_codes and self.refusal.search(result.stderr):
            refused = OverLimit if self.over_limit.search(result.stderr) else SubmissionRefused
            raise refused(f"{argv[0]}: {result.message}")
        return True, (
            f"{argv[0]} ended with status {result.returncode} and no refusal "
            f"({result.message or 'no message'})"
        )

    def _drop_duplicates(self, submission: Submission, keep: str) -> None:
        """After an ambiguous attempt, a retry may have made a second copy: cancel any other job
        with this tag, so that one submit is one job."""
        for native_id in self.find(submission) or []:
            if native_id != keep:
                try:
                    self.cancel(JobRef(native_id, submission.job_dir))
                except MmmError as exc:  # job `keep` exists: never let this read as a refusal
                    raise SchedulerError(
                        f"job {keep} was submitted, but its copy {native_id} "
                        f"could not be cancelled: {exc}"
                    ) from None


class Scheduler(Protocol):
    submit_command: str  # what must be on PATH to submit from here ('' for none)

    def submit(self, submission: Submission) -> str: ...
    def find(self, submission: Submission) -> list[str] | None: ...
    def query(self, jobs: Sequence[JobRef]) -> dict[str, JobStatus]: ...
    def cancel(self, job: JobRef) -> None: ...
    def open_jobs(self, account: str | None) -> list[OpenJob]: ...
    def directive_path(self, path: str) -> str: ...


@runtime_checkable
class Allocating(Protocol):
    """A scheduler that grants an allocation to work in (`launch --allocate`)."""

    allocate_needs_terminal: bool  # its allocating command wants a terminal, even for a command

    def allocate_argv(
        self,
        account: str | None,
        walltime_hms: str,
        directives: list[str],
        command: list[str] | None = None,
        name: str = "",
        tag: str = "",
    ) -> list[str]: ...


@runtime_checkable
class ListsQueues(Protocol):
    """A scheduler that lists its queues' configuration (what `machines check` compares)."""

    def queue_config(self) -> list[LiveQueue]: ...


def check_directive_path(path: str, scheduler: str) -> None:
    """Refuse what no directive can carry: line breaks and other control characters, and
    characters outside printable ASCII (PBS rejects them; a log path must survive both)."""
    bad = sorted({c for c in path if not (" " <= c <= "~")})
    if bad:
        raise MmmError(
            f"path {path!r} cannot go into a {scheduler} directive: it contains "
            f"{', '.join(repr(c) for c in bad)}; use a path of printable ASCII characters "
            "(set XDG_STATE_HOME or --db to another place)"
        )
