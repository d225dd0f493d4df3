"""Pure parsers for PBS Pro / OpenPBS command output (qsub, qstat -f -F dsv -x).

qstat's exit code mixes "some ids unknown" (153) with output for the others; its JSON output is
not used for jobs: it is invalid at times (tests/fixtures/pbs/qstat_json_invalid_fragments.txt)
and, on current OpenPBS, holds only the first of several requested jobs.
"""

from __future__ import annotations

import calendar
import json
import re
import time
from typing import Any

from mmm_orch.errors import shown
from mmm_orch.injob.protocol import EXIT_STOPPED_BY_TERM
from mmm_orch.schedulers.states import (
    MOST_DIGITS,
    JobState,
    JobStatus,
    LiveQueue,
    OpenJob,
    Reading,
    stated_count,
    stated_walltime,
)
from mmm_orch.walltime import duration

# PBS job_state letters (PBS Professional Reference Guide, "Job States").
_STATES = {
    "Q": JobState.PENDING,
    "H": JobState.PENDING,
    "W": JobState.PENDING,
    "T": JobState.PENDING,
    "M": JobState.PENDING,
    "R": JobState.RUNNING,
    "B": JobState.RUNNING,
    "E": JobState.RUNNING,
    "S": JobState.RUNNING,
    "U": JobState.RUNNING,
    "X": JobState.COMPLETED,
}
WALLTIME_EXCEEDED = -29  # JOB_EXEC_KILL_WALLTIME, seen in recorded ALCF history for walltime kills
SIGNAL_OFFSET = 256  # Exit_status > 256: killed by signal (status - 256)

# qstat/qsub exit codes and texts: 35 = finished (query with -x), 153 = unknown job id.
QSTAT_JOB_FINISHED = 35
QSTAT_UNKNOWN_JOB = 153
TRANSIENT_ERRORS = re.compile(
    r"cannot connect to host|all reserved ports in use|Invalid credential|Connection refused|"
    r"premature end of message|Communication failure|Connection timed out",
    re.I,
)
TRANSIENT_EXIT_CODES = frozenset({162, 171, 183})
# Of those, the ones that prove qsub never reached the server.
UNSENT_ERRORS = re.compile(r"cannot connect to (host|server)|Connection refused", re.I)
# qsub's refusal: the server's message after "qsub: ", and pbs_errno's low byte as the status
# (153, 170, 188, ...: 128 and more too). "Error (N) submitting job" is what qsub says with no
# message from the server (a connection dropped after the commit among others): not a refusal.
REFUSAL = re.compile(r"^qsub: (?!Error \(\d+\) submitting job)", re.M)
REFUSAL_CODES = frozenset(range(1, 256))
# A refusal for a job-count limit, max_queued's (live test server, exit 38: "qsub: would exceed
# queue generic's per-user limit"; ALCF-UG known-issues.md quotes the same).
OVER_LIMIT = re.compile(r"^qsub: would exceed .*per-\w+ limit", re.M)
TAG_VARIABLE = "MMM_ORCH_TAG"  # `#PBS -v MMM_ORCH_TAG=...`: the job's submission tag
# qstat prints times in its own time zone: queries run in UTC so that they read the same anywhere.
QUERY_ENV = {"TZ": "UTC"}


def qselect_time(epoch: float) -> str:
    """A time for `qselect -t`, [[CC]YY]MMDDhhmm[.SS], which it reads in its TZ (QUERY_ENV)."""
    return time.strftime("%Y%m%d%H%M.%S", time.gmtime(max(epoch, 0)))


_JOB_ID = re.compile(r"^\d+(\[\d*\])?(\.[A-Za-z0-9][\w.-]*)?$")


def parse_qsub(stdout: str) -> str:
    """The full job id qsub prints, e.g. 123.pbs-server-01.hostmgmt.cm.example.gov or 8738.pbs02."""
    for line in stdout.splitlines():
        if _JOB_ID.match(line.strip()):
            return line.strip()
    raise ValueError(f"no job id in qsub output: {stdout.strip()[:200]!r}")


def same_job(a: str, b: str) -> bool:
    """PBS ids compare by sequence number and the server's first label ('1.pbs' == '1.pbs.x.y')."""

    def key(job_id: str) -> tuple[str, str]:
        number, _, server = job_id.partition(".")
        return number, server.split(".", 1)[0]

    return key(a) == key(b)


# How a finished job ended, from its substate (src/include/job.h). The live server showed that a
# job deleted while running ends F with substate 91 and Exit_status 0, whether or not its script
# traps SIGTERM: Exit_status alone reads that as success.
SUBSTATE_TERMINATED = "91"  # deleted (qdel), running or not
# A qdel can also race the job's own end and leave substate 92 (seen on the live server): mmm-orch
# job scripts then exit protocol.EXIT_STOPPED_BY_TERM, which says the same.


def pbs_state(job: dict[str, Any]) -> tuple[JobState, int | None, int | None]:
    """(state, exit code, signal) of one qstat job record (DSV or JSON attributes)."""
    letter = str(job.get("job_state", ""))
    if letter != "F":
        return _STATES.get(letter, JobState.UNKNOWN), None, None
    status = job.get("Exit_status")
    if status is not None and int(status) == WALLTIME_EXCEEDED:
        return JobState.TIMEOUT, None, None
    if str(job.get("substate", "")) == SUBSTATE_TERMINATED or status is None:
        return JobState.CANCELLED, None, None  # deleted, running or before it ever ran
    status = int(status)
    if status == EXIT_STOPPED_BY_TERM:
        return JobState.CANCELLED, None, None
    if status == 0:
        return JobState.COMPLETED, 0, None
    if status > SIGNAL_OFFSET:  # older servers record a qdel as 256 + SIGTERM
        signal = status - SIGNAL_OFFSET
        return (JobState.CANCELLED if signal == 15 else JobState.FAILED), None, signal
    return JobState.FAILED, status, None


def _resource(job: dict[str, Any], group: str, name: str) -> Any:
    """`group.name` of a DSV record, or group[name] of a JSON one; None where absent."""
    nested = job.get(group)
    return nested.get(name) if isinstance(nested, dict) else job.get(f"{group}.{name}")


def _nodect(job: dict[str, Any]) -> int | None:
    """The nodes the job held: the vnodes of its exec_vnode (one per node on the facilities' and
    the test server's machines), else the hosts of its exec_host, else the nodect it asked for;
    None for a job that never ran (none of them, and no time used)."""
    vnodes = str(job.get("exec_vnode") or "")
    if vnodes:
        return len({part.strip("()").split(":")[0] for part in vnodes.split("+")})
    hosts = str(job.get("exec_host") or "")
    if hosts:
        return len({part.split("/")[0] for part in hosts.split("+")})
    if _resource(job, "resources_used", "walltime") is None:
        return None
    try:
        return int(_resource(job, "Resource_List", "nodect"))
    except (TypeError, ValueError):
        return None


def utc_time(value: Any) -> float | None:
    """A qstat time such as 'Sat Dec  3 20:25:38 2022', read as UTC (see QUERY_ENV)."""
    try:
        return float(
            calendar.timegm(time.strptime(" ".join(str(value).split()), "%a %b %d %H:%M:%S %Y"))
        )
    except ValueError:
        return None


def statuses(jobs: dict[str, dict[str, Any]]) -> dict[str, JobStatus]:
    """The status of each job record (job id -> attributes)."""
    out = {}
    for job_id, job in jobs.items():
        state, code, signal = pbs_state(job)
        out[job_id] = JobStatus(
            native_id=job_id,
            state=state,
            native_state=str(job.get("job_state", "")),
            exit_code=code,
            signal=signal,
            reason=str(job.get("comment", "")),
            started_at=utc_time(job["stime"]) if "stime" in job else None,
            ended_at=utc_time(job["obittime"]) if state.terminal and "obittime" in job else None,
            nodes=_nodect(job) if state.terminal else None,
            elapsed=duration(_resource(job, "resources_used", "walltime"))
            if state.terminal
            else None,
        )
    return out


# `qstat -f -F json ID1 ID2 ...` prints only the first job on this OpenPBS (23.06.06-85, seen on
# the live test server; openpbs#2672), so queries of several jobs read DSV: one line per job,
# `Job Id: ID|key=value|...`, with the delimiter and the escape character escaped by a backslash.
def _dsv_fields(line: str, delimiter: str = "|") -> list[str]:
    fields, current, chars = [], [], iter(line)
    for char in chars:
        if char == "\\":
            current.append(next(chars, ""))
        elif char == delimiter:
            fields.append("".join(current))
            current = []
        else:
            current.append(char)
    fields.append("".join(current))
    return fields


def load_qstat_dsv(text: str) -> dict[str, dict[str, Any]]:
    """`qstat -f -F dsv` output: job id -> {attribute: value} (resources as `Resource_List.x`)."""
    jobs: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.startswith("Job Id: "):
            continue
        head, *fields = _dsv_fields(line.rstrip("\n"))
        jobs[head.removeprefix("Job Id: ").strip()] = dict(
            field.partition("=")[::2] for field in fields if "=" in field
        )
    return jobs


def parse_qstat_dsv(text: str) -> dict[str, JobStatus]:
    return statuses(load_qstat_dsv(text))


def _variables(value: Any) -> dict[str, str]:
    """Variable_List as a mapping: JSON gives one; DSV and older servers give `A=1,B=2`."""
    if isinstance(value, dict):
        return {k: str(v) for k, v in value.items()}
    return dict(item.partition("=")[::2] for item in re.split(r"(?<!\\),", str(value or "")))


def ids_with_tag(jobs: dict[str, dict[str, Any]], tag: str) -> list[str]:
    """Ids of the jobs whose Variable_List carries the submission tag."""
    return [
        job_id
        for job_id, job in jobs.items()
        if _variables(job.get("Variable_List")).get(TAG_VARIABLE) == tag
    ]


# States of a job that has started (PBS Pro qstat(1B): running, exiting, array begun).
STARTED_STATES = frozenset("REB")


def open_jobs(text: str, user: str) -> list[OpenJob]:
    """`qstat -f -F dsv` of the user's and the project's unfinished jobs, as queue counts see
    them: the queue each is in, whether it started, whose it is and its account."""
    return [
        OpenJob(
            native_id=job_id,
            names=frozenset({job.get("queue", "")}) - {""},
            running=job.get("job_state", "") in STARTED_STATES,
            mine=job.get("Job_Owner", "").partition("@")[0] == user,
            account=job.get("Account_Name", ""),
        )
        for job_id, job in load_qstat_dsv(text).items()
        if job.get("job_state", "") not in ("F", "X", "M")
    ]


# A PBS limit's entities: each user, each project (PBS Pro Admin Guide, "Limits": u:, p:, g:, o:).
_LIMIT = re.compile(r"\[([up]):PBS_GENERIC=([^\]]*)\]")
_LIMIT_COUNTS = {"max_queued": "any", "queued_jobs_threshold": "queued", "max_run": "running"}


def parse_queues(text: str) -> list[LiveQueue]:
    """`qstat -Q -f -F json`: every queue with its node and walltime bounds, its per-user and
    per-project job limits (max_queued: any state; queued_jobs_threshold: queued; max_run:
    running) and a routing queue's destinations; a value that is not what PBS writes is named
    in the queue's `unreadable`. ValueError when the output is not that JSON at all."""
    try:
        # An integer past MOST_DIGITS stays text, to be named unreadable: int() refuses one
        # of over 4300 digits with a ValueError that would say nothing of where it was.
        data = json.loads(
            text, parse_int=lambda digits: int(digits) if len(digits) <= MOST_DIGITS else digits
        )
    except RecursionError:
        raise ValueError("nested too deeply") from None
    queues = data.get("Queue") if isinstance(data, dict) else None
    if not isinstance(queues, dict):
        raise ValueError("no Queue object")
    return [_queue(name, queue) for name, queue in queues.items()]


def _queue(name: str, queue: Any) -> LiveQueue:
    if not isinstance(queue, dict):
        return LiveQueue(name=name, kind="", limits=None, unreadable=(("", shown(queue)),))
    reading = Reading()
    read = reading.read
    low = read("resources_min", queue.get("resources_min"), _mapping) or {}
    high = read("resources_max", queue.get("resources_max"), _mapping) or {}
    limits = frozenset(
        (jobs, who, counts)
        for attribute, counts in _LIMIT_COUNTS.items()
        for who, jobs in read(attribute, queue.get(attribute), _limits) or ()
    )
    return LiveQueue(
        name=name,
        kind=(read("queue_type", queue.get("queue_type"), _text) or "").lower(),
        min_nodes=read("resources_min.nodect", low.get("nodect"), stated_count),
        max_nodes=read("resources_max.nodect", high.get("nodect"), stated_count),
        max_walltime=read("resources_max.walltime", high.get("walltime"), stated_walltime),
        # Not all of them read: none, rather than some that would seem to differ.
        limits=None if any(f in _LIMIT_COUNTS for f, _ in reading.unreadable) else limits,
        destinations=tuple(
            d
            for d in (
                read("route_destinations", queue.get("route_destinations"), _text) or ""
            ).split(",")
            if d
        ),
        unreadable=tuple(reading.unreadable),
    )


def _mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("not a text")
    return value


def _limits(value: Any) -> list[tuple[str, int]]:
    """A PBS limit's per-user and per-project entries, e.g. '[u:PBS_GENERIC=1] [p:...=10]', as
    (user|project, jobs); a bare number (an old-style limit on the whole queue) has none."""
    if isinstance(value, int) and not isinstance(value, bool):
        return []
    return [
        ("user" if who == "u" else "project", stated_count(jobs))
        for who, jobs in _LIMIT.findall(_text(value))
    ]
