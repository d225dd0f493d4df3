"""The use cases that read what a job left, under the CLI (timeline, startup, diagnose, logs)
and the Python API alike: each refreshes the job first, then reads its log or run directory (or
a log file given by name), and returns values; printing is the caller's."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmm_orch.config.failures import common_failures, machine_failures
from mmm_orch.errors import MmmError
from mmm_orch.hosts import host_for
from mmm_orch.injob import diagnose as signatures
from mmm_orch.injob import ends
from mmm_orch.progress import logs, startup
from mmm_orch.progress.endings import end_of
from mmm_orch.progress.refresh import refresh
from mmm_orch.records.db import JobDB
from mmm_orch.records.record import JobRecord
from mmm_orch.reporting import data
from mmm_orch.schedulers.states import JobState
from mmm_orch.usecases.following import check_known

# What the timeline says of a launch that ended without a first step.
NO_STEPS = startup.NO_STEPS
# The startup table groups runs by these (`mmm-orch startup`).
STARTUP_KEYS = ("machine", "workload", "nodes", "ranks")


def fresh(db: JobDB, record: JobRecord) -> JobRecord:
    """`record` as the scheduler has it now (terminal records are not asked again)."""
    refresh(db, [record])
    return db.get(record.id, events=False) or record


@dataclass(frozen=True)
class Timeline:
    record: JobRecord
    events: list[dict[str, Any]]  # event, at (epoch), gap_s (to the one before)
    startup_s: float | None  # job start to first step
    has_log: bool
    first_step_seen: bool
    launch_ended: bool


def timeline(db: JobDB, record: JobRecord) -> Timeline:
    record = fresh(db, record)
    text = logs.head_and_tail(host_for(record.remote), record.log_path) or ""
    markers = startup.parse_markers(text)
    rows = startup.timeline(record.submitted_at, markers, record.ended_at)
    return Timeline(
        record,
        rows,
        markers.startup_s,
        bool(text),
        markers.first_step is not None,
        markers.launch_end is not None,
    )


@dataclass(frozen=True)
class Diagnosis:
    record: JobRecord
    result: Any  # injob.diagnose.Diagnosis: the first failure, what came later, the fallout
    blamed: str  # the node remembered as bad because of it ("" = none)
    end: ends.End | None  # its end class, once it ended (None while it runs)

    @property
    def rerun_said(self) -> str:
        """What `rerun` would do after its end, in words ('' while it runs)."""
        return ends.rerun_words(self.end) if self.end is not None else ""


def diagnose(db: JobDB, record: JobRecord) -> Diagnosis:
    """The first known failure in the job's log (and the scheduler's own reason); a node that
    lost the job's ranks is remembered as bad, so that later jobs on the machine avoid it."""
    record = fresh(db, record)
    _has_run(record)
    host = host_for(record.remote)
    log = logs.head_and_tail(host, record.log_path, head=256 << 20, last=16 << 20)
    if log is None:
        raise MmmError(f"job {record.id} has no log yet ({record.state.value}): {record.log_path}")
    # The scheduler's own word (a PBS comment, a Slurm reason) can be the whole story.
    text = log + (f"\nscheduler: {record.reason}\n" if record.reason else "")
    failures = machine_failures(record.machine)
    result = signatures.diagnose(text, failures)
    first = result.first
    blamed = ""
    if first is not None and first.signature.node_fault and first.host:
        blamed = first.host
        db.bad_nodes.blame(record.machine, blamed, first.line, record.id)
    end = None
    if record.terminal:  # the whole log read: what the refresh classed from its ends, again
        end = end_of(record, record.state, record.reason, host, failures, text, result)
        db.ended(record.id, end)
    return Diagnosis(record, result, blamed, end)


def _has_run(record: JobRecord) -> None:
    """A packed point that never started has no log to read."""
    if record.state is JobState.NOT_STARTED:
        raise MmmError(
            f"job {record.id} never started ({record.reason}): it has no log; "
            "`mmm-orch rerun` of its pack job runs it"
        )


def log_text(
    record: JobRecord, tail: int | None = None, strip_ansi: bool = False
) -> tuple[str | None, int]:
    """The job's log so far (its last `tail` lines), and the offset it ends at; None before the
    job writes one."""
    _has_run(record)
    host = host_for(record.remote)
    end = host.size(record.log_path)
    if end is None:
        return None, 0
    if tail is not None:
        text, end = logs.tail(host, record.log_path, tail)
    else:
        text = host.read_from(record.log_path, 0, end) or b""
    return logs.clean(text, strip_ansi), end


def metrics(record: JobRecord) -> list[dict[str, Any]]:
    """The run's step records (metrics.jsonl), read as a report reads them: bounded, and rows
    that are not step records left out."""
    return data.collect([record])[0].steps


def read_log_file(name: str, head: int = 8 << 20) -> str:
    """A log given by its path: its start (and its last MiB when it is longer), read only from a
    regular file (a FIFO would block forever)."""
    try:
        mode = os.stat(name).st_mode
    except OSError as exc:
        why = "no such file" if isinstance(exc, FileNotFoundError) else exc.strerror
        raise MmmError(f"--log {name!r}: {why}") from None
    if not stat.S_ISREG(mode):
        raise MmmError(f"--log {name!r}: not a regular file (a directory, a FIFO or a device)")
    return logs.head_and_tail(host_for(""), name, head=head, last=1 << 20) or ""


def diagnose_file(name: str, machine: str | None) -> Any:
    """The first known failure in the log file `name`, with `machine`'s signatures (else the
    common ones): an injob.diagnose.Diagnosis."""
    check_known("machines", machine, None)
    signatures_known = machine_failures(machine) if machine else common_failures()
    return signatures.diagnose(read_log_file(name, 256 << 20), signatures_known)


def startup_of_files(names: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each log file's start-up (job start to first step), and their groups' medians."""
    rows = []
    for name in names:
        markers = startup.from_file_name(
            Path(name).name, startup.parse_markers(read_log_file(name))
        )
        rows.append(
            {
                "log": Path(name).name,
                "machine": "",
                "workload": "",
                "nodes": markers.nodes,
                "ranks": markers.ranks,
                "host": markers.host,
                "start": markers.job_start,
                "first_step": markers.first_step,
                "startup_s": markers.startup_s,
            }
        )
    return rows, startup.summarize(rows, STARTUP_KEYS)


def startup_of_jobs(
    db: JobDB | None, machine: str | None, workload: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each recorded job's start-up (of `machine`, `workload`), and their groups' medians."""
    check_known("machines", machine, db)
    check_known("workloads", workload, db)
    rows = []
    for record in db.list(machine=machine) if db is not None else []:
        if workload and record.workload != workload:
            continue
        markers = startup.parse_markers(
            logs.head_and_tail(host_for(record.remote), record.log_path) or ""
        )
        rows.append(
            {
                "job": record.id,
                "machine": record.machine,
                "workload": record.workload,
                "nodes": record.nodes,
                "ranks": record.ranks,
                "host": markers.host,
                "start": markers.job_start,
                "first_step": markers.first_step,
                "startup_s": markers.startup_s,
            }
        )
    return rows, startup.summarize(rows, STARTUP_KEYS)
