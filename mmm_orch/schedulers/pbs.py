"""PBS Pro / OpenPBS: qsub, qstat -f -F json -x (history included), qdel."""

from __future__ import annotations

from typing import Sequence

from mmm_orch.schedulers import pbs_parse as parse
from mmm_orch.schedulers.base import CommandScheduler, JobRef, SchedulerError, Submission
from mmm_orch.schedulers.states import JobState, JobStatus


class PbsScheduler(CommandScheduler):
    defaults = {"submit": "qsub", "query": "qstat", "cancel": "qdel"}
    transient = parse.TRANSIENT_ERRORS
    transient_codes = parse.TRANSIENT_EXIT_CODES
    query_env = parse.QUERY_ENV

    def submit_argv(self, submission: Submission) -> list[str]:
        return [self.cmd["submit"], str(submission.script)]

    def query_argv(self, ids: list[str]) -> list[str]:
        return [self.cmd["query"], "-f", "-F", "json", "-x", *ids]

    def cancel_argv(self, job: JobRef) -> list[str]:
        return [self.cmd["cancel"], job.native_id]

    def submit(self, submission: Submission) -> str:
        result = self._run(self.submit_argv(submission), "submit", cwd=submission.workdir)
        if result.returncode != 0:
            raise SchedulerError(f"{self.cmd['submit']}: {result.message}")
        return parse.parse_qsub(result.stdout)

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


def statuses_for(ids: list[str], returncode: int, stdout: str, message: str) -> dict[str, JobStatus]:
    """Answer for every requested id from one qstat run. 153 (some ids unknown) and 35 (finished,
    no history) still carry the other jobs on stdout; unknown ids are UNKNOWN, never done."""
    if returncode not in (0, parse.QSTAT_UNKNOWN_JOB, parse.QSTAT_JOB_FINISHED):
        raise SchedulerError(f"qstat: {message}")
    try:
        reported = parse.parse_qstat_json(stdout)
    except ValueError as exc:
        raise SchedulerError(f"qstat: {exc}") from None
    out = {}
    for job_id in ids:
        match = next((s for native, s in reported.items() if parse.same_job(native, job_id)), None)
        out[job_id] = match or JobStatus(
            native_id=job_id, state=JobState.UNKNOWN, native_state="",
            reason="qstat does not know it (job history off or expired)")
    return out
