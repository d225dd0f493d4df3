"""Pure parsers for PBS Pro / OpenPBS command output (qsub, qstat -f -F json -x).

qstat's JSON is known to be invalid at times (bare number-like environment values, duplicate
keys) and qstat's exit code mixes "some ids unknown" (153) with output for the others.
"""

from __future__ import annotations

import calendar
import json
import re
import time
from typing import Any

from mmm_orch.schedulers.states import JobState, JobStatus

# PBS job_state letters (PBS Professional Reference Guide, "Job States").
_STATES = {
    "Q": JobState.PENDING, "H": JobState.PENDING, "W": JobState.PENDING, "T": JobState.PENDING,
    "M": JobState.PENDING, "R": JobState.RUNNING, "B": JobState.RUNNING, "E": JobState.RUNNING,
    "S": JobState.RUNNING, "U": JobState.RUNNING, "X": JobState.COMPLETED,
}
WALLTIME_EXCEEDED = -29  # JOB_EXEC_KILL_WALLTIME, seen in recorded ALCF history for walltime kills
SIGNAL_OFFSET = 256  # Exit_status > 256: killed by signal (status - 256)

# qstat/qsub exit codes and texts: 35 = finished (query with -x), 153 = unknown job id.
QSTAT_JOB_FINISHED = 35
QSTAT_UNKNOWN_JOB = 153
TRANSIENT_ERRORS = re.compile(
    r"cannot connect to host|all reserved ports in use|Invalid credential|Connection refused|"
    r"premature end of message|Communication failure|Connection timed out", re.I)
TRANSIENT_EXIT_CODES = frozenset({162, 171, 183})
# Of those, the ones that prove qsub never reached the server.
UNSENT_ERRORS = re.compile(r"cannot connect to (host|server)|Connection refused", re.I)
TAG_VARIABLE = "MMM_ORCH_TAG"  # `#PBS -v MMM_ORCH_TAG=...`: the job's submission tag
# qstat prints times in its own time zone: queries run in UTC so that they read the same anywhere.
QUERY_ENV = {"TZ": "UTC"}

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


# Known ways qstat writes invalid JSON (tests/fixtures/pbs/qstat_json_invalid_fragments.txt):
# bare number-like values ("foo":005, .123, 123., -00), unescaped quotes inside a value, and
# backslashes that are no JSON escape. qstat writes one "key":value per line, so lines are mended.
_BARE_NUMBERISH = re.compile(r'(":\s*)(-?\.\d+|-?\d+\.(?!\d)|-?0\d+(?:\.\d+)?|-?00+(?:\.\d+)?)(\s*[,}\n])')
_STRING_VALUE_LINE = re.compile(r'^(\s*"[^"]*":\s*")(.*)("\s*,?\s*)$')
_BAD_ESCAPE = re.compile(r'\\(?!["\\/bfnrtu])')


def _mend_line(line: str) -> str:
    line = _BAD_ESCAPE.sub(r"\\\\", line)
    if match := _STRING_VALUE_LINE.match(line):
        head, value, tail = match.groups()
        line = head + re.sub(r'(?<!\\)"', r'\"', value) + tail
    return line


def load_qstat_json(text: str) -> dict[str, Any]:
    """qstat -F json output as a dict, mending what qstat is known to get wrong; text before the
    document (OpenPBS 23 prints a -u table first) is skipped."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    start = re.search(r"^\{", text, re.M)
    body = text[start.start():] if start else text
    mended = "\n".join(_mend_line(line) for line in _BARE_NUMBERISH.sub(r'\1"\2"\3', body).splitlines())
    try:
        return json.loads(mended)
    except json.JSONDecodeError as exc:
        raise ValueError(f"qstat printed JSON that cannot be read even after repair: {exc}") from None


def pbs_state(job: dict[str, Any]) -> tuple[JobState, int | None, int | None]:
    """(state, exit code, signal) of one qstat job record."""
    letter = str(job.get("job_state", ""))
    if letter != "F":
        return _STATES.get(letter, JobState.UNKNOWN), None, None
    status = job.get("Exit_status")
    if status is None:  # deleted before it ever ran
        return JobState.CANCELLED, None, None
    status = int(status)
    if status == 0:
        return JobState.COMPLETED, 0, None
    if status == WALLTIME_EXCEEDED:
        return JobState.TIMEOUT, None, None
    if status > SIGNAL_OFFSET:
        signal = status - SIGNAL_OFFSET
        return (JobState.CANCELLED if signal == 15 else JobState.FAILED), None, signal  # qdel sends TERM
    return JobState.FAILED, status, None


def utc_time(value: Any) -> float | None:
    """A qstat time such as 'Sat Dec  3 20:25:38 2022', read as UTC (see QUERY_ENV)."""
    try:
        return float(calendar.timegm(time.strptime(" ".join(str(value).split()), "%a %b %d %H:%M:%S %Y")))
    except ValueError:
        return None


def parse_qstat_json(text: str) -> dict[str, JobStatus]:
    data = load_qstat_json(text.strip() or "{}")
    out = {}
    for job_id, job in (data.get("Jobs") or {}).items():
        state, code, signal = pbs_state(job)
        out[job_id] = JobStatus(native_id=job_id, state=state,
                                native_state=str(job.get("job_state", "")), exit_code=code,
                                signal=signal, reason=str(job.get("comment", "")),
                                started_at=utc_time(job["stime"]) if "stime" in job else None,
                                ended_at=utc_time(job["obittime"]) if state.terminal and "obittime" in job else None)
    return out


def ids_with_tag(text: str, tag: str) -> list[str]:
    """Ids of the jobs in qstat -f -F json output whose Variable_List carries `tag`."""
    data = load_qstat_json(text.strip() or "{}")
    found = []
    for job_id, job in (data.get("Jobs") or {}).items():
        variables = job.get("Variable_List") or {}
        if isinstance(variables, str):  # older servers: "A=1,B=2"
            variables = dict(item.partition("=")[::2] for item in variables.split(","))
        if str(variables.get(TAG_VARIABLE, "")) == tag:
            found.append(job_id)
    return found
