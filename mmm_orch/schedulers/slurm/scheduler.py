"""Slurm: sbatch, squeue (live), sacct (final state and exit code), scontrol (no accounting, and
the exact exit code of a failed job)."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Sequence

from mmm_orch.errors import MmmError, SchedulerError, SchedulerUnavailable
from mmm_orch.hosts.transport import CommandResult
from mmm_orch.schedulers.base import (
    FIND_SLACK_S,
    CommandScheduler,
    JobRef,
    Submission,
    check_directive_path,
)
from mmm_orch.schedulers.slurm import parse
from mmm_orch.schedulers.states import JobState, JobStatus, LiveQueue, OpenJob


class SlurmScheduler(CommandScheduler):
    defaults = {
        "submit": "sbatch",
        "query": "squeue",
        "cancel": "scancel",
        "accounting": "sacct",
        "control": "scontrol",
        "allocate": "salloc",
        "accounts": "sacctmgr",
    }

    allocate_needs_terminal = False

    def allocate_argv(
        self,
        account: str | None,
        walltime_hms: str,
        directives: list[str],
        command: list[str] | None = None,
        name: str = "",
        tag: str = "",
    ) -> list[str]:
        """An interactive allocation with the job's directives: salloc takes sbatch's options;
        with `command`, salloc runs it here, inside the allocation, instead of a shell; with
        `name` and `tag`, the job carries them as a batch job does (found again by find())."""
        named = [f"--job-name={name}", f"--comment={parse.tag_comment(tag)}"] if tag else []
        return [
            self.cmd["allocate"],
            *(["-A", account] if account else []),
            *named,
            *directives,
            "-t",
            walltime_hms,
            *(command or []),
        ]

    transient = parse.TRANSIENT_ERRORS
    unsent = parse.UNSENT_ERRORS
    refusal = parse.REFUSAL
    refusal_codes = parse.REFUSAL_CODES
    over_limit = parse.OVER_LIMIT
    query_env = parse.QUERY_ENV

    def submit_argv(self, submission: Submission) -> list[str]:
        return [self.cmd["submit"], "--parsable", str(submission.script)]

    def parse_submit(self, stdout: str) -> str:
        return parse.parse_sbatch(stdout)

    def find(self, submission: Submission) -> list[str] | None:
        """The jobs with the submission's name whose comment is its tag: squeue (this user's
        pending, running and recently ended jobs), then, when it shows none, sacct from the
        record's time on (a job that ended before the controller's MinJobAge forgot it). Each
        reads a bounded set, the controller's jobs or that time window, never the whole
        accounting history."""
        comment = parse.tag_comment(submission.tag)
        live = self._look(
            [
                self.cmd["query"],
                "--me",
                "--noheader",
                "--states=all",
                f"--name={submission.name}",
                "--format=%i|%k",
            ]
        )
        if live is None or live.returncode != 0:
            return None
        found = parse.ids_with_comment(live.stdout, comment)
        if found or not self.cmd.get("accounting") or not submission.submitted_at:
            return found
        since = time.strftime(
            "%Y-%m-%dT%H:%M:%S", time.gmtime(submission.submitted_at - FIND_SLACK_S)
        )
        ended = self._look(
            [
                self.cmd["accounting"],
                "--noheader",
                "--parsable2",
                "--allocations",
                f"--name={submission.name}",
                f"--starttime={since}",
                "--format=JobID,Comment",
            ],
            {"TZ": "UTC"},
        )
        if ended is None:
            return None
        if ended.returncode != 0:
            return [] if parse.ACCOUNTING_DISABLED.search(ended.message) else None
        return parse.ids_with_comment(ended.stdout, comment)

    def _look(self, argv: list[str], env: dict[str, str] | None = None) -> CommandResult | None:
        """One try of a lookup (submit's loop does the retrying); None: no answer."""
        try:
            return self.runner.run(argv, timeout=15, env=env)
        except (subprocess.TimeoutExpired, SchedulerUnavailable):
            return None

    @staticmethod
    def directive_path(path: str) -> str:
        """A path as one #SBATCH argument: double-quoted (sbatch honours quotes, and a backslash
        escapes the next character), with % doubled (Slurm expands %j and friends in --output).
        A backslash cannot be carried: Slurm then skips all expansion and drops it."""
        check_directive_path(path, "Slurm")
        if "\\" in path:
            raise MmmError(
                f"path {path!r} cannot go into a Slurm directive: Slurm drops '\\' "
                "from output paths; use a path without backslashes"
            )
        return '"' + path.replace("%", "%%").replace('"', '\\"') + '"'

    def query(self, jobs: Sequence[JobRef]) -> dict[str, JobStatus]:
        """One squeue call for all jobs; one sacct call (or one scontrol) for those squeue no
        longer lists or lists as finished. A job found nowhere is UNKNOWN, never done."""
        ids = [job.native_id for job in jobs]
        if not ids:
            return {}
        live = self._run(
            [
                self.cmd["query"],
                "--noheader",
                f"--format={parse.SQUEUE_FORMAT}",
                f"--jobs={','.join(ids)}",
            ],
            "query",
        )
        if live.returncode == 0:
            found = parse.parse_squeue_format(live.stdout)
        elif parse.INVALID_JOB_ID.search(live.stderr):
            found = {}  # none of the ids is known to the controller any more
        else:
            raise SchedulerError(f"{self.cmd['query']}: {live.message}")
        final = [i for i in ids if i not in found or found[i].state.terminal]
        if final:
            found.update(self._final_states(final))
        return {
            i: found.get(i)
            or JobStatus(
                native_id=i,
                state=JobState.UNKNOWN,
                native_state="",
                reason="not in squeue, sacct or scontrol",
            )
            for i in ids
        }

    def _final_states(self, ids: list[str]) -> dict[str, JobStatus]:
        if self.cmd.get("accounting"):
            result = self._run(
                [
                    self.cmd["accounting"],
                    "--noheader",
                    "--parsable2",
                    f"--format={','.join(parse.SACCT_FIELDS)}",
                    f"--jobs={','.join(ids)}",
                ],
                "query",
            )
            if result.returncode == 0:
                return self._exact_exit_codes(
                    parse.parse_sacct_parsable(result.stdout, parse.SACCT_FIELDS)
                )
            if not parse.ACCOUNTING_DISABLED.search(result.message):
                raise SchedulerError(f"{self.cmd['accounting']}: {result.message}")
        # No accounting: the controller remembers finished jobs for MinJobAge (300 s by default).
        result = self._run([self.cmd["control"], "--oneliner", "show", "job"], "query")
        if result.returncode != 0:
            raise SchedulerError(f"{self.cmd['control']}: {result.message}")
        wanted = set(ids)
        return {
            i: s for i, s in parse.parse_scontrol_show_job(result.stdout).items() if i in wanted
        }

    def _exact_exit_codes(self, final: dict[str, JobStatus]) -> dict[str, JobStatus]:
        """sacct before Slurm 25.11 subtracts 128 from an exit code of 128 or more (143 reads 15,
        137 reads 9; Slurm commit 831571cb84). The controller's record is exact while it keeps a
        finished job (MinJobAge, 300 s by default), so a failed job's code is read there too."""
        for job_id, status in final.items():
            if status.state is not JobState.FAILED:
                continue
            result = self._run([self.cmd["control"], "--oneliner", "show", "job", job_id], "query")
            exact = parse.parse_scontrol_show_job(result.stdout).get(job_id)
            if result.returncode == 0 and exact and exact.state.terminal and exact.exit_code:
                final[job_id] = dataclasses.replace(status, exit_code=exact.exit_code)
        return final

    def open_jobs(self, account: str | None) -> list[OpenJob]:
        """squeue of the user's jobs, and of the project's: pending, running and suspended."""
        user = self.user()
        jobs: dict[str, OpenJob] = {}  # a job of the user's in the project is listed twice
        for selector in [f"--user={user}"], *([[f"--account={account}"]] if account else []):
            result = self._run(
                [self.cmd["query"], "--noheader", parse.OPEN_JOBS_FORMAT, *selector], "query"
            )
            if result.returncode != 0:
                raise SchedulerError(f"{self.cmd['query']}: {result.message}")
            for job in parse.open_jobs(result.stdout, user):
                jobs.setdefault(job.native_id, job)
        return list(jobs.values())

    def queue_config(self) -> list[LiveQueue]:
        """The partitions' bounds (scontrol) and the QOS's limits (sacctmgr)."""
        partitions = self._run([self.cmd["control"], "show", "partition", "--oneliner"], "query")
        if partitions.returncode != 0:
            raise SchedulerError(f"scontrol show partition: {partitions.message}")
        qos = self._run(
            [self.cmd["accounts"], "--noheader", "--parsable2", "show", "qos", parse.QOS_FORMAT],
            "query",
        )
        if qos.returncode != 0:
            raise SchedulerError(f"sacctmgr show qos: {qos.message}")
        return parse.parse_partitions(partitions.stdout) + parse.parse_qos(qos.stdout)

    def cancel(self, job: JobRef) -> None:
        result = self._run([self.cmd["cancel"], job.native_id], "submit")
        if result.returncode != 0:
            raise SchedulerError(f"{self.cmd['cancel']}: {result.message}")
