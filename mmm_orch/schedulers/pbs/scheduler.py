"""PBS Pro / OpenPBS: qsub, qstat -f -F json -x (history included), qdel, qselect."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from mmm_orch.errors import MmmError, SchedulerError, SchedulerUnavailable
from mmm_orch.schedulers.base import (
    FIND_SLACK_S,
    CommandScheduler,
    JobRef,
    Submission,
    check_directive_path,
)
from mmm_orch.schedulers.pbs import parse
from mmm_orch.schedulers.states import JobState, JobStatus, LiveQueue, OpenJob


class PbsScheduler(CommandScheduler):
    defaults = {"submit": "qsub", "query": "qstat", "cancel": "qdel", "select": "qselect"}

    # qsub -I wants a terminal for its standard input and output, even to run a command.
    allocate_needs_terminal = True

    def allocate_argv(
        self,
        account: str | None,
        walltime_hms: str,
        directives: list[str],
        command: list[str] | None = None,
        name: str = "",
        tag: str = "",
    ) -> list[str]:
        """An interactive allocation with the job's directives: qsub -I (PBS Pro qsub(1B)); with
        `command`, the job runs it (`-- executable args`) instead of a shell, as salloc would:
        with this environment (-V) and in this directory (a PBS job starts in $HOME); with
        `name` and `tag`, the job carries them as a batch job does (found again by find())."""
        here = (
            ["-V", "--", "/bin/sh", "-c", 'cd "$PBS_O_WORKDIR" && exec "$@"', "sh", *command]
            if command
            else []
        )
        named = ["-N", name, "-v", f"{parse.TAG_VARIABLE}={tag}"] if tag else []
        return [
            self.cmd["submit"],
            "-I",
            *(["-A", account] if account else []),
            *named,
            *directives,
            "-l",
            f"walltime={walltime_hms}",
            *here,
        ]

    transient = parse.TRANSIENT_ERRORS
    unsent = parse.UNSENT_ERRORS
    transient_codes = parse.TRANSIENT_EXIT_CODES
    refusal = parse.REFUSAL
    refusal_codes = parse.REFUSAL_CODES
    over_limit = parse.OVER_LIMIT
    query_env = parse.QUERY_ENV

    def submit_argv(self, submission: Submission) -> list[str]:
        return [self.cmd["submit"], str(submission.script)]

    def parse_submit(self, stdout: str) -> str:
        return parse.parse_qsub(stdout)

    def query_argv(self, ids: list[str]) -> list[str]:
        return [self.cmd["query"], "-f", "-F", "dsv", "-x", *ids]

    def cancel_argv(self, job: JobRef) -> list[str]:
        return [self.cmd["cancel"], job.native_id]

    def find(self, submission: Submission) -> list[str] | None:
        """Jobs with the submission's name created since it was recorded (qselect, finished ones
        included) whose environment carries its tag (`#PBS -v MMM_ORCH_TAG=...`). The creation
        time bounds the lookup by the recent jobs of that name, whatever the history's length."""
        argv = [self.cmd["select"], "-x", "-N", submission.name]
        if submission.submitted_at:
            argv += ["-t", f"c.ge.{parse.qselect_time(submission.submitted_at - FIND_SLACK_S)}"]
        try:
            named = self.runner.run(argv, timeout=15, env=self.query_env)
            if named.returncode != 0:
                return None
            ids = named.stdout.split()
            if not ids:
                return []
            result = self.runner.run(self.query_argv(ids), timeout=15, env=self.query_env)
        except (subprocess.TimeoutExpired, SchedulerUnavailable):
            return None
        if result.returncode not in (0, parse.QSTAT_UNKNOWN_JOB, parse.QSTAT_JOB_FINISHED):
            return None
        return parse.ids_with_tag(parse.load_qstat_dsv(result.stdout), submission.tag)

    def open_jobs(self, account: str | None) -> list[OpenJob]:
        """qselect the user's jobs (and the project's), then one qstat of them all; without -x,
        only jobs not finished."""
        user = self.user()
        ids: list[str] = []
        for selector in ["-u", user], *([["-A", account]] if account else []):
            result = self._run([self.cmd["select"], *selector], "query")
            if result.returncode != 0:
                raise SchedulerError(f"{self.cmd['select']}: {result.message}")
            ids += [i for i in result.stdout.split() if i not in ids]
        if not ids:
            return []
        result = self._run([self.cmd["query"], "-f", "-F", "dsv", *ids], "query")
        if result.returncode not in (0, parse.QSTAT_UNKNOWN_JOB, parse.QSTAT_JOB_FINISHED):
            raise SchedulerError(f"qstat: {result.message}")
        return parse.open_jobs(result.stdout, user)

    def queue_config(self) -> list[LiveQueue]:
        """Every queue's bounds and job limits: qstat -Q -f -F json."""
        result = self._run([self.cmd["query"], "-Q", "-f", "-F", "json"], "query")
        if result.returncode != 0:
            raise SchedulerError(f"qstat -Q: {result.message}")
        try:
            return parse.parse_queues(result.stdout)
        except ValueError as exc:
            raise SchedulerError(f"qstat -Q -f -F json: unreadable output ({exc})") from None

    @staticmethod
    def directive_path(path: str) -> str:
        """A path as one #PBS argument, double-quoted (qsub's directive reader honours quotes);
        an absolute path keeps its ':' (qsub reads a host only before a first '/'). qsub accepts
        a path with '"' or '\\', but the live server's MoM then cannot start the job and holds it
        ("too many failed attempts to run"), so those are refused here."""
        check_directive_path(path, "PBS")
        if bad := sorted(set(path) & {'"', "\\"}):
            raise MmmError(
                f"path {path!r} cannot go into a PBS directive: PBS accepts "
                f"{' and '.join(map(repr, bad))} in -o and then cannot start the job; "
                "use another directory (XDG_STATE_HOME or --db)"
            )
        return f'"{path}"'

    def query(self, jobs: Sequence[JobRef]) -> dict[str, JobStatus]:
        ids = [job.native_id for job in jobs]
        if not ids:
            return {}
        result = self._run(self.query_argv(ids), "query")
        return statuses_for(ids, result.returncode, result.stdout, result.message)

    def cancel(self, job: JobRef) -> None:
        result = self._run(self.cancel_argv(job), "submit")
        if result.returncode != 0:
            raise SchedulerError(f"{self.cmd['cancel']}: {result.message}")


def statuses_for(
    ids: list[str], returncode: int, stdout: str, message: str
) -> dict[str, JobStatus]:
    """Answer for every requested id from one qstat run. 153 (some ids unknown) and 35 (finished,
    no history) still carry the other jobs on stdout; unknown ids are UNKNOWN, never done."""
    if returncode not in (0, parse.QSTAT_UNKNOWN_JOB, parse.QSTAT_JOB_FINISHED):
        raise SchedulerError(f"qstat: {message}")
    reported = parse.parse_qstat_dsv(stdout)
    out = {}
    for job_id in ids:
        match = next((s for native, s in reported.items() if parse.same_job(native, job_id)), None)
        out[job_id] = match or JobStatus(
            native_id=job_id,
            state=JobState.UNKNOWN,
            native_state="",
            reason="qstat does not know it (job history off or expired)",
        )
    return out
