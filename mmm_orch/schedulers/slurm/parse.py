"""Pure parsers for Slurm command output (sbatch, squeue, sacct, scontrol), across versions.

JSON layouts drift: 21.08 gives strings and ints, 23.11+ lists of states and {set, number}
objects. Text formats are read by '|' or key=value, never by column position.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mmm_orch.schedulers.states import (
    JobState,
    JobStatus,
    LiveQueue,
    OpenJob,
    Reading,
    stated_count,
    stated_walltime,
)
from mmm_orch.walltime import duration

_STATES = {
    JobState.PENDING: {
        "PENDING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
        "CONFIGURING",
        "POWER_UP_NODE",
    },
    JobState.RUNNING: {
        "RUNNING",
        "COMPLETING",
        "STAGE_OUT",
        "SIGNALING",
        "RESIZING",
        "SUSPENDED",
        "STOPPED",
        "UPDATE_DB",
    },
    JobState.COMPLETED: {"COMPLETED"},
    JobState.FAILED: {
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "SPECIAL_EXIT",
        "LAUNCH_FAILED",
    },
    JobState.CANCELLED: {"CANCELLED", "REVOKED"},
    JobState.TIMEOUT: {"TIMEOUT"},
}
_BY_NAME = {name: state for state, names in _STATES.items() for name in names}

# Controller or database busy/unreachable: retry with backoff. Anything else is permanent.
TRANSIENT_ERRORS = re.compile(
    r"Socket timed out|Communication (connection )?failure|Unable to contact slurm controller|"
    r"Connection timed out|Connection refused|Resource temporarily unavailable|"
    r"Problem talking to the database|slurm_persist_conn_open",
    re.I,
)
# Of those, the ones that prove sbatch never got a job to the controller: no connection at all,
# or the controller's own "try again" refusal. A timeout after sending is not among them.
UNSENT_ERRORS = re.compile(
    r"Unable to contact slurm controller \(connect failure\)|Connection refused|"
    r"Resource temporarily unavailable",
    re.I,
)
# sbatch's refusal: its error words, and status 1 (SLURM_EXIT_ERROR, when a site sets another,
# only makes a refusal look ambiguous: the record then waits for `status`); or an option it does
# not take (a directive of the script), refused as it parses them, before asking the controller
# anything: status 255 and getopt's words.
REFUSAL = re.compile(
    r"^sbatch: ((error|fatal): |unrecognized option |invalid option |option .* "
    r"requires an argument)",
    re.M,
)
REFUSAL_CODES = frozenset({1, 255})
# A refusal for a job-count limit: the QOS's or association's MaxSubmitJobs (live test cluster:
# "sbatch: error: QOSMaxSubmitJobPerUserLimit"; tests/fixtures/slurm).
OVER_LIMIT = re.compile(r"MaxSubmitJob\w*Limit")
# The job carries its submission tag as its comment (`#SBATCH --comment=...`).
TAG_PREFIX = "mmm-orch:"


def tag_comment(tag: str) -> str:
    return TAG_PREFIX + tag


def ids_with_comment(text: str, comment: str) -> list[str]:
    """Job ids from `squeue --format=%i|%k` lines whose comment is `comment`."""
    ids = []
    for line in text.splitlines():
        job_id, sep, value = line.strip().partition("|")
        if sep and value.strip() == comment and job_id.strip():
            ids.append(job_id.strip())
    return ids


def slurm_state(text: object) -> JobState:
    """Map 'RUNNING', 'CANCELLED by 54386' or ['FAILED'] (23.11+) onto JobState."""
    names = text if isinstance(text, list) else [text]
    for name in names:
        word = str(name).strip().split(" ", 1)[0].rstrip("+").upper()
        if word in _BY_NAME:
            return _BY_NAME[word]
    return JobState.UNKNOWN


def parse_sbatch(stdout: str) -> str:
    """The job id from `sbatch --parsable` ('123;cluster'), plain or site-wrapped sbatch output."""
    for line in stdout.splitlines():
        line = line.strip()
        match = re.fullmatch(r"(\d+)(?:;\S+)?", line) or re.fullmatch(
            r"Submitted batch job (\d+)(?: on cluster \S+)?", line
        )
        if match:
            return match.group(1)
    raise ValueError(f"no job id in sbatch output: {stdout.strip()[:200]!r}")


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """'2:0' -> (2, None); '0:9' -> (None, 9): Slurm writes exit status, then killing signal."""
    code, _, signal = (text or "").partition(":")
    if not code.isdigit():
        return None, None
    sig = int(signal) if signal.isdigit() else 0
    return (None, sig) if sig else (int(code), None)


def _number(value: Any) -> int | None:
    """Ints as 21.08 writes them, or {"set": true, "number": N} as 23.11+ does."""
    if isinstance(value, dict):
        return value.get("number") if value.get("set") else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _json_exit(value: Any) -> tuple[int | None, int | None]:
    if isinstance(value, dict):
        signal = value.get("signal") or {}
        sig = _number(signal.get("id") if isinstance(signal, dict) else None)
        if sig:
            return None, sig
        return _number(value.get("return_code")), None
    return _number(value), None


def parse_squeue_json(text: str) -> dict[str, JobStatus]:
    out = {}
    for job in json.loads(text).get("jobs", []):
        native = job.get("job_state")
        code, sig = _json_exit(job.get("exit_code"))
        state = slurm_state(native)
        out[str(job["job_id"])] = JobStatus(
            native_id=str(job["job_id"]),
            state=state,
            native_state=_label(native),
            exit_code=code if state.terminal else None,
            signal=sig if state.terminal else None,
            reason=_reason(job.get("state_reason")),
        )
    return out


def parse_sacct_json(text: str) -> dict[str, JobStatus]:
    out = {}
    for job in json.loads(text).get("jobs", []):
        raw = job.get("state")
        native = raw.get("current") if isinstance(raw, dict) else raw
        state = slurm_state(native)
        code, sig = _json_exit(job.get("exit_code"))
        derived, dsig = _json_exit(job.get("derived_exit_code"))
        if (
            state is JobState.FAILED and not code and not sig
        ):  # contradictory 0: trust a step, or say unknown
            code, sig = derived or None, dsig
        reason = _reason(raw.get("reason")) if isinstance(raw, dict) else ""
        out[str(job["job_id"])] = JobStatus(
            native_id=str(job["job_id"]),
            state=state,
            native_state=_label(native),
            exit_code=code if state.terminal else None,
            signal=sig,
            reason=reason,
        )
    return out


def parse_sacct_parsable(text: str, fields: list[str] | None = None) -> dict[str, JobStatus]:
    """`sacct -P [-n] -o JobIDRaw,State,ExitCode[,DerivedExitCode,...]`; with a header when
    `fields` is None. Steps (ID.batch, ID.0) refine the job's row: a step that failed or ran out
    of memory is the reason, and its exit code stands in for a job-level 0."""
    lines = [line for line in text.splitlines() if line.strip()]
    if fields is None:
        fields, lines = lines[0].split("|"), lines[1:]
    col = {name.lower(): i for i, name in enumerate(fields)}
    jobs: dict[str, dict[str, str]] = {}
    steps: dict[str, list[dict[str, str]]] = {}
    for line in lines:
        row = dict(zip(col, line.split("|"), strict=False))  # a short line: the fields it has
        row["id"] = row.get("jobidraw") or row.get("jobid") or ""
        base, dot, _ = row["id"].partition(".")
        if dot:
            steps.setdefault(base, []).append(row)
        else:
            jobs[base] = row
    out = {}
    for job_id, row in jobs.items():
        state = slurm_state(row.get("state", ""))
        code, sig = parse_exit_code(row.get("exitcode", ""))
        derived, _ = parse_exit_code(row.get("derivedexitcode", ""))
        reason = ""
        for step in steps.get(job_id, []):
            step_state = slurm_state(step.get("state", ""))
            if step_state in (JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT):
                reason = reason or f"step {step['id']}: {step['state']}"
        if (
            state is JobState.FAILED and not code and not sig
        ):  # contradictory 0: trust a step, or say unknown
            code = derived or None
        out[job_id] = JobStatus(
            native_id=job_id,
            state=state,
            native_state=row.get("state", ""),
            exit_code=code if state.terminal else None,
            signal=sig if state.terminal else None,
            reason=reason,
            started_at=None if _never_ran(row) else epoch(row.get("start")),
            ended_at=epoch(row.get("end")),
            nodes=_count(row.get("allocnodes")),
            elapsed=_seconds(row.get("elapsedraw")),
        )
    return out


def _count(text: Any) -> int | None:
    """A whole number of a text field (sacct -P, scontrol), None where it is not one."""
    return int(text) if isinstance(text, str) and text.isdigit() else None


def _seconds(text: Any) -> float | None:
    number = _count(text)
    return float(number) if number is not None else None


def _never_ran(row: dict[str, str]) -> bool:
    """A job cancelled while pending: Slurm gives it a Start (the time of the cancel, equal to
    its End) but no nodes (AllocNodes 0, NodeList "None assigned")."""
    return row.get("allocnodes") == "0"


def parse_scontrol_show_job(text: str) -> dict[str, JobStatus]:
    """`scontrol show job [-o]`: every record, multi-line or one-line (-o), starts with JobId=."""
    records = re.split(r"(?m)^(?=JobId=)", text)
    out = {}
    for record in records:
        fields = dict(re.findall(r"(?:^|\s)([A-Za-z_]+)=(\S*)", record))
        if "JobId" not in fields:
            continue
        state = slurm_state(fields.get("JobState", ""))
        code, sig = parse_exit_code(fields.get("ExitCode", ""))
        reason = fields.get("Reason", "")
        out[fields["JobId"]] = JobStatus(
            native_id=fields["JobId"],
            state=state,
            native_state=fields.get("JobState", ""),
            exit_code=code if state.terminal else None,
            signal=sig if state.terminal else None,
            reason="" if reason == "None" else reason,
            started_at=epoch(fields.get("StartTime")) if state is not JobState.PENDING else None,
            ended_at=epoch(fields.get("EndTime")) if state.terminal else None,
            nodes=_count(fields.get("NumNodes")) if state.terminal else None,
            elapsed=duration(fields.get("RunTime")) if state.terminal else None,
        )
    return out


def _label(native: Any) -> str:
    return ",".join(native) if isinstance(native, list) else str(native or "")


def _reason(value: Any) -> str:
    return "" if value in (None, "None") else str(value)


# Queries run with SLURM_TIME_FORMAT=%s (QUERY_ENV), so every time is epoch seconds, whatever the
# cluster's time zone; "Unknown", "None" or "N/A" mean no time yet.
QUERY_ENV = {"SLURM_TIME_FORMAT": "%s"}


def epoch(value: Any) -> float | None:
    text = str(value or "").strip()
    return float(text) if text.isdigit() and int(text) > 0 else None


# squeue's fixed format: job id, long state name, start time, reason; '|' never occurs in the
# first three and the reason comes last.
SQUEUE_FORMAT = "%A|%T|%S|%r"
SACCT_FIELDS = [
    "JobIDRaw",
    "State",
    "ExitCode",
    "DerivedExitCode",
    "Start",
    "End",
    "AllocNodes",
    "ElapsedRaw",
]
ACCOUNTING_DISABLED = re.compile(r"accounting storage is disabled", re.I)
INVALID_JOB_ID = re.compile(r"Invalid job id specified", re.I)


def parse_squeue_format(text: str) -> dict[str, JobStatus]:
    """`squeue --noheader --format=SQUEUE_FORMAT`. A pending job's %S is a forecast, not a start."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 3)
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        job_id, native, start, reason = parts
        state = slurm_state(native)
        out[job_id] = JobStatus(
            native_id=job_id,
            state=state,
            native_state=native,
            reason=_reason(reason),
            started_at=epoch(start) if state is not JobState.PENDING else None,
        )
    return out


# squeue's format for queue counts: id, partition, QOS, state, user, account.
OPEN_JOBS_FORMAT = "--format=%i|%P|%q|%T|%u|%a"
# States of a job that has started (squeue(1) JOB STATE CODES).
STARTED_STATES = frozenset(
    {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}
)


def open_jobs(text: str, user: str) -> list[OpenJob]:
    """squeue lines in OPEN_JOBS_FORMAT, as queue counts see them: partition and QOS, whether
    the job started, whose it is and its account. A job array's pending tasks are one line."""
    jobs = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6:
            continue
        job_id, partition, qos, state, owner, account = fields
        jobs.append(
            OpenJob(
                native_id=job_id,
                names=frozenset({partition, qos}) - {""},
                running=state in STARTED_STATES,
                mine=owner == user,
                account=account,
            )
        )
    return jobs


# sacctmgr's QOS fields for job limits: (field, per, counts) (sacctmgr(1) "QOS ... LIMITS").
QOS_LIMITS = (
    ("MaxSubmitPU", "user", "any"),
    ("MaxJobsPU", "user", "running"),
    ("MaxJobsAccruePU", "user", "eligible"),
    ("MaxSubmitPA", "project", "any"),
    ("MaxJobsPA", "project", "running"),
    ("MaxJobsAccruePA", "project", "eligible"),
)
QOS_FORMAT = "format=Name,MaxWall,MaxTRESPerJob," + ",".join(f for f, _, _ in QOS_LIMITS)


def parse_partitions(text: str) -> list[LiveQueue]:
    """`scontrol show partition --oneliner`: each partition's node and walltime bounds (0 or
    UNLIMITED: none), its partition QOS named as a destination; a value that is not what Slurm
    writes is named in the partition's `unreadable`."""
    out = []
    for line in text.splitlines():
        fields = dict(word.partition("=")[::2] for word in line.split() if "=" in word)
        if "PartitionName" not in fields:
            continue
        reading = Reading()
        qos = fields.get("QoS", "N/A")
        out.append(
            LiveQueue(
                name=fields["PartitionName"],
                kind="partition",
                min_nodes=_bound(reading, "MinNodes", fields.get("MinNodes"), floor=1),
                max_nodes=_bound(reading, "MaxNodes", fields.get("MaxNodes")),
                max_walltime=_walltime(reading, "MaxTime", fields.get("MaxTime")),
                destinations=() if qos in ("N/A", "") else (qos,),
                unreadable=tuple(reading.unreadable),
            )
        )
    return out


def parse_qos(text: str) -> list[LiveQueue]:
    """`sacctmgr --noheader --parsable2 show qos` with QOS_FORMAT: each QOS's job limits, its
    walltime bound and its node bound (MaxTRESPerJob node=N); a value that is not what Slurm
    writes is named in the QOS's `unreadable`."""
    out = []
    for line in text.splitlines():
        values = line.split("|")
        if len(values) != 3 + len(QOS_LIMITS) or not values[0]:
            continue
        name, wall, tres, *counts = values
        tres_fields = dict(item.partition("=")[::2] for item in tres.split(",") if "=" in item)
        reading = Reading()
        limits = frozenset(
            (jobs, per, kind)
            for value, (field, per, kind) in zip(counts, QOS_LIMITS, strict=True)
            if (jobs := reading.read(field, value or None, stated_count)) is not None
        )
        # Not all of them read: none, rather than some that would seem to differ.
        limits_read = not reading.unreadable
        out.append(
            LiveQueue(
                name=name,
                kind="qos",
                max_nodes=_bound(reading, "MaxTRESPerJob.node", tres_fields.get("node")),
                max_walltime=_walltime(reading, "MaxWall", wall),
                limits=limits if limits_read else None,
                unreadable=tuple(reading.unreadable),
            )
        )
    return out


def _bound(reading: Reading, field: str, value: str | None, floor: int = 0) -> int | None:
    """A node bound, None where Slurm sets none (UNLIMITED, or at most `floor`)."""
    if value in (None, "", "UNLIMITED"):
        return None
    bound = reading.read(field, value, stated_count)
    return bound if bound is not None and bound > floor else None


def _walltime(reading: Reading, field: str, value: str | None) -> int | None:
    """A walltime bound, None where Slurm sets none (UNLIMITED)."""
    return None if value in (None, "", "UNLIMITED") else reading.read(field, value, stated_walltime)
