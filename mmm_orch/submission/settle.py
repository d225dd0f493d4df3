"""Settling a submission that was cut off. A `submitting` record whose submitter is gone (killed,
or its machine rebooted) is found by its tag in the scheduler, or by the id the job wrote into its
log, and gets its native id; once the scheduler answers that it has no such job and no submit
command can still be running, the record and its directories are removed (a run from the
backlog goes back to its place there instead). `status` settles
them (progress/refresh.py), so every job started is recorded exactly once."""

from __future__ import annotations

import json
import posixpath
import shutil
import socket
import time
from pathlib import Path

import psutil

from mmm_orch.hosts import Host, host_for
from mmm_orch.hosts.transport import Retry
from mmm_orch.injob import protocol
from mmm_orch.records.db import JobDB
from mmm_orch.records.dbfile import jobs_root_for
from mmm_orch.records.record import JobRecord
from mmm_orch.schedulers import scheduler_for
from mmm_orch.schedulers.base import Submission
from mmm_orch.submission.submit import copy_keeper, record_copy


def submitter_alive(text: str) -> bool | None:
    """Whether the process that wrote a `submitting` record still runs (None: another host)."""
    try:
        info = json.loads(text)
    except ValueError:
        return False
    if info.get("host") != socket.gethostname():
        return None
    try:
        return abs(psutil.Process(info["pid"]).create_time() - info["started"]) < 1
    except (psutil.Error, KeyError, TypeError):
        return False


def forget(db: JobDB, record: JobRecord) -> None:
    """Remove the record of a submission the scheduler never took, and its directories."""
    db.delete(record.id)
    host_for(record.remote).run(["rm", "-rf", "--", record.job_dir], timeout=30)
    shutil.rmtree(_local_dir(db, record), ignore_errors=True)


def _local_dir(db: JobDB, record: JobRecord) -> Path:
    """The job's directory beside the database (the twin of a remote job's one)."""
    return jobs_root_for(db.path) / posixpath.basename(record.job_dir)


def job_id_from_log(host: Host, log_path: str) -> str | None:
    """The scheduler's id the job wrote at its start (protocol.JOB_START ... job=ID)."""
    head = host.read_from(log_path, 0, 8192)
    for line in (head or b"").decode(errors="replace").splitlines():
        if match := protocol.JOB_ID.search(line):
            return match[1] if match[1] != "local" else None
    return None


def reconcile(db: JobDB, record: JobRecord) -> str | None:
    """Settle a `submitting` record whose submitter is gone: the job's native id when the
    scheduler (or the job's own log) shows it, or the record removed once the scheduler answered
    that it has no such job and no submit command can still be running. Returns a warning, or
    None."""
    alive = submitter_alive(record.submitter)
    if alive:
        return None
    # A dead submitter's scheduler command may outlive it by one command timeout; a submitter on
    # another host may be anywhere in its retries.
    retry = Retry.from_env("submit")
    grace = retry.timeout + 10 if alive is False else retry.deadline + 60
    host = host_for(record.remote)
    scheduler = scheduler_for(record.scheduler, record.commands, host)
    found = scheduler.find(
        Submission(
            script=Path(record.script_path),
            workdir=record.submit_dir,
            job_dir=Path(record.job_dir),
            log_path=Path(record.log_path),
            walltime=0,
            name=record.name,
            tag=record.tag,
            submitted_at=record.submitted_at,
        )
    )
    if found is None:
        return f"job {record.id}: still submitting (the scheduler could not be asked)"
    if not found and (from_log := job_id_from_log(host, record.log_path)):
        found = [from_log]
    if found:
        # The copy first, as submit does: a `status` killed between the two leaves the record
        # `submitting`, and the next one writes both again.
        whole = db.get(record.id, events=False)
        if whole is not None:
            copy_keeper(_local_dir(db, record), record_copy(whole))(found[0])
        db.accepted(record.id, found[0], "found by its tag after an interrupted submission")
        return None
    if time.time() - record.submitted_at < grace:
        return None  # a submitter on another host, or its scheduler command, may still be at it
    if record.waited_since is not None:  # a run from the backlog: back to its place there
        db.backlog.requeue(record.id, "back in the backlog: its submission was interrupted")
        return (
            f"job {record.id} back in the backlog: its submission was interrupted before "
            f"{record.scheduler} took it (no job carries its tag {record.tag})"
        )
    forget(db, record)
    return (
        f"job {record.id} removed: its submission was interrupted before "
        f"{record.scheduler} took it (no job carries its tag {record.tag})"
    )
