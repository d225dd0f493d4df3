"""request -> plan -> script -> record -> scheduler. The submission protocol, safe to interrupt at
any instant:

1. Everything that can be checked is checked first: the plan, the template and the job's Python
   (usecases.prepare), then here the database opens, the log path fits the scheduler's
   directive syntax, the work directory exists.
2. The job directory and script are written, then the record, in state `submitting`, with the
   tag the scheduler will show (Slurm comment, PBS variable) and who is submitting.
3. The scheduler is asked (schedulers/base.py: an ambiguous failure is resolved by looking for
   the tag before any retry). Refused in the scheduler's own words, or never sent: record and
   directory are removed. Accepted: the record's copy in the job directory (record.json, what
   `db recover` rebuilds from) is written with the native id, then the record gets it.
   Anything else (the submit command killed, timed out, cut off) leaves the record
   `submitting`, and its copy without an id unless this process was killed outright.

A process killed during 3 leaves a `submitting` record; the next `status` (settle.py) finds the
job by its tag (or by the id the job wrote at its start into its log) and writes the copy, or removes the
record once the scheduler says it has no such job. So every job started is recorded exactly
once.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from mmm_orch.config.failures import signatures_json
from mmm_orch.errors import MmmError, OverLimit, SubmissionRefused, Unreachable, one_line
from mmm_orch.hosts import Host, host_for
from mmm_orch.hosts.transport import Retry
from mmm_orch.injob import protocol
from mmm_orch.injob.protocol import RECORD_FILE
from mmm_orch.planning import Plan
from mmm_orch.records.db import JobDB, open_db
from mmm_orch.records.dbfile import jobs_root_for
from mmm_orch.records.record import JobRecord
from mmm_orch.rendering import render
from mmm_orch.schedulers import scheduler_for
from mmm_orch.schedulers.base import JobRef, Submission
from mmm_orch.schedulers.states import JobState


def git_commit(directory: str) -> str | None:
    """HEAD of the git work tree holding `directory`, with '-dirty' for uncommitted changes."""
    if not any((up / ".git").exists() for up in (Path(directory), *Path(directory).parents)):
        return None  # in no work tree: no git to start (a submit loop pays nothing for it)
    try:
        head = subprocess.run(
            ["git", "-C", directory, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", directory, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def new_tag() -> str:
    """Unique per submission, readable, and safe in any directive or path."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def submitter() -> str:
    """Who is submitting: host, pid and start time (a reused pid never matches). Found once per
    process (a fork is another process: the pid is the key)."""
    pid = os.getpid()
    if _submitter.get("pid") != pid:
        me = psutil.Process(pid)
        _submitter.update(
            pid=pid,
            text=json.dumps(
                {"host": socket.gethostname(), "pid": pid, "started": me.create_time()}
            ),
        )
    return _submitter["text"]


_submitter: dict[str, Any] = {}


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP while submitting: handled like Ctrl-C, so that the record is settled."""


def stop_signals() -> tuple[signal.Signals, ...]:
    """What stops mmm-orch as Ctrl-C does: SIGTERM, and SIGHUP unless this process was started
    to ignore it (`nohup mmm-orch launch ... &` lives on past the terminal, as it asked)."""
    hangup = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGTERM, *hangup)


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """In the main thread. A submit in another thread (the Python API) leaves signals to the
    program's own main thread: its record, written before the scheduler is asked, is then
    settled by the next refresh."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in stop_signals()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def write_record(directory: Path, values: dict[str, Any]) -> None:
    """The job's own copy of its record (what `mmm-orch db recover` rebuilds from), written once
    the submission's outcome is known: a rename over an existing copy flushes its data first on
    ext4, which costs milliseconds when the disk is busy."""
    tmp = directory / (RECORD_FILE + ".tmp")
    tmp.write_text(json.dumps(values))  # compact: Python's C encoder (indenting is 10x slower)
    tmp.replace(directory / RECORD_FILE)


def record_copy(record: JobRecord) -> dict[str, Any]:
    """What write_record keeps of a record read back from the database."""
    data = record.to_dict(full=True)
    del data["events"]
    return data


def _check_workdir(host: Host, plan: Plan) -> None:
    if not plan.launch.workdir_given:
        return
    result = host.run(["test", "-d", plan.launch.workdir], timeout=30)
    if result.returncode != 0:
        raise MmmError(
            f"--workdir {plan.launch.workdir!r} is invalid: no such directory"
            + (f" on {host.name}" if host.name != "local" else "")
        )


def submit(
    plan: Plan,
    db_file: Path,
    template: str | None = None,
    remote: str = "",
    links: dict[str, Any] | None = None,
    here: bool = False,
    backlog: bool = False,
) -> JobRecord:
    """Render, record and submit `plan` (here, or through the login node `remote`); see the
    module's docstring for the protocol. `links` are extra record fields (group, rerun).
    `here`: the script runs on this computer under the local executor's supervisor instead
    (`launch`, inside an allocation the scheduler already gave), held by this process: the job
    is stopped once it ends (nothing of it outlives the launch, nor so the allocation).
    `backlog`: rendered and recorded `waiting`, its copy written, not submitted: the backlog's
    mover submits it (submit_waiting, usecases/backlogs.py)."""
    Retry.from_env("submit")
    host = host_for(remote)
    home = host.home() if remote else ""  # connect first: a refused login leaves nothing here
    kind, commands = ("local", {}) if here else (plan.scheduler, plan.scheduler_commands)
    scheduler = scheduler_for(kind, commands, host)
    tag, local_dir, job_dir = job_dirs(plan, db_file, remote, home)
    log_directive = scheduler.directive_path(posixpath.join(job_dir, protocol.LOG_FILE))
    _check_workdir(host, plan)
    db = open_db(str(db_file), create=True)  # checked (and created) before anything is written

    created_here = host_for("").make_private_dir(str(local_dir))
    created_there = host.make_private_dir(job_dir) if remote else []
    job_id = None

    def undo() -> None:
        if job_id is not None:
            with contextlib.suppress(MmmError):  # else `status` removes it: no job has its tag
                db.delete(job_id)
        host.remove_tree(created_there)
        host_for("").remove_tree(created_here)

    try:
        # A remote job runs in its job directory unless --workdir named one there.
        plan = plan.placed(
            job_dir,
            tag,
            log_directive,
            job_dir if remote and not plan.launch.workdir_given else None,
        )
        script = render(plan, template)
        script_path = posixpath.join(job_dir, "job.sh")
        host.write_file(script_path, script, 0o700)
        values = {
            **record_values(plan, remote, script_path, script),
            **(links or {}),
            **({"scheduler": kind, "commands": commands} if here else {}),
            **({"state": JobState.WAITING.value, "waited_since": time.time()} if backlog else {}),
        }
        if (
            plan.placement.failover
        ):  # what the failover loop inside the job classifies failures with
            host.write_file(
                posixpath.join(job_dir, protocol.FAILURES_FILE),
                signatures_json(plan.machine),
                0o600,
            )
        with signals_as_interrupts():
            job_id = db.insert(**values)
    except OSError as exc:  # a full disk, a read-only place: nothing was asked of the scheduler
        undo()
        raise MmmError(f"cannot write the job's files in {job_dir}: {exc.strerror}") from None
    except BaseException:
        undo()
        raise

    keep = copy_keeper(local_dir, {"id": job_id, **values})
    if backlog:
        keep("")  # what `db recover` rebuilds a waiting run from
        return db.get_existing(job_id)
    submission = submission_of(
        plan,
        script_path,
        job_dir,
        tag,
        values["submitted_at"],
        stop_signal=plan.launch.stop_signal,
        held_by=os.getpid() if here else 0,
    )
    native_id = hand_over(scheduler, submission, db, job_id, lambda _: undo(), keep)
    keep(native_id)
    return db.accepted(job_id, native_id) or db.get_existing(job_id)


def submission_of(
    plan: Plan, script: str, job_dir: str, tag: str, submitted_at: float, **extra: Any
) -> Submission:
    """What the scheduler is handed for `plan` once placed in `job_dir` (plan.placed set its
    log): a batch script, or the allocation `launch --allocate` asks for."""
    assert plan.submission.log_path is not None  # plan.placed set it
    return Submission(
        script=Path(script),
        workdir=plan.launch.workdir,
        job_dir=Path(job_dir),
        log_path=Path(plan.submission.log_path),
        walltime=plan.queue.walltime,
        name=plan.name,
        tag=tag,
        submitted_at=submitted_at,
        **extra,
    )


def record_not_started(plan: Plan, db_file: Path, links: dict[str, Any], reason: str) -> int:
    """The record of a packed point its allocation ended before: it never ran, so it has no
    script, log or scheduler id; `rerun --resume` of its pack runs it."""
    db = open_db(str(db_file), create=True)
    return db.insert(
        **{
            **record_values(plan, "", "", ""),
            **links,
            "scheduler": "local",
            "commands": {},
            "log_path": "",
            "state": JobState.NOT_STARTED.value,
            "reason": reason,
        }
    )


def copy_keeper(directory: Path, record: dict[str, Any]) -> Callable[[str], None]:
    """Writes the record's own copy with the scheduler's id, once the outcome is known and before
    the record is settled (a process killed between the two leaves it `submitting`, for `status`
    to settle and copy again). A copy the disk refuses only leaves `db recover` less to rebuild
    from."""

    def keep(native_id: str) -> None:
        with contextlib.suppress(OSError):
            write_record(directory, {**record, "native_id": native_id})

    return keep


def job_dirs(plan: Plan, db_file: Path, remote: str, home: str) -> tuple[str, Path, str]:
    """A new tag, the job's directory beside the database, and where the job's files go (that
    one, or its twin on the login host)."""
    tag = new_tag()
    leaf = f"{tag}-{plan.machine}-{plan.workload}"
    local_dir = jobs_root_for(db_file) / leaf
    return (
        tag,
        local_dir,
        (posixpath.join(home, plan.transport.remote_jobs_dir, leaf) if remote else str(local_dir)),
    )


def record_values(plan: Plan, remote: str, script_path: str, script: str) -> dict[str, Any]:
    """The new record's fields, from the placed plan and its script."""
    workdir = plan.launch.workdir
    return dict(
        machine=plan.machine,
        host=remote or socket.gethostname(),
        remote=remote,
        scheduler=plan.scheduler,
        commands=plan.scheduler_commands,
        workload=plan.workload,
        name=plan.name,
        nodes=plan.layout.nodes,
        ranks=plan.layout.ranks,
        native_id="",
        job_dir=plan.submission.job_dir,
        script_path=script_path,
        script=script,
        plan=plan.to_dict(),
        submit_dir=workdir,
        git_commit=None if remote else git_commit(workdir),
        log_path=plan.submission.log_path,
        submitted_at=time.time(),
        tag=plan.submission.tag,
        submitter=submitter(),
        run_dir=plan.launch.run_dir,
        spares=plan.placement.spare_nodes,
        account=plan.queue.account or "",
    )


def hand_over(
    scheduler,
    submission: Submission,
    db: JobDB,
    job_id: int,
    undo: Callable[[MmmError], None],
    keep: Callable[[str], None],
) -> str:
    """The scheduler's id for the recorded job; a refusal proven undoes the record (`undo`,
    given the refusal), anything ambiguous keeps it (and its copy, `keep`) for `status` to
    settle by the job's tag."""
    try:
        with signals_as_interrupts():
            return scheduler.submit(submission)
    except (SubmissionRefused, Unreachable) as exc:
        undo(exc)  # proof that the scheduler does not have the job
        raise
    except MmmError as exc:  # it may have the job: `status` settles the record by its tag
        keep("")  # no id yet: `status` settles the record and copies it again
        db.note(job_id, f"submission unconfirmed: {exc}")
        raise
    except BaseException:
        keep("")
        db.note(
            job_id, "submission interrupted; `mmm-orch status` finds out whether it went through"
        )
        raise


def submit_waiting(db: JobDB, run: JobRecord, plan: Plan) -> JobRecord | None:
    """A run waiting in the backlog (recorded by `submit(..., backlog=True)`, its script
    rendered then) claimed and handed to its scheduler, by the protocol above from step 3; None
    where another took it first, or the scheduler refused it (it failed, with the scheduler's
    words). A scheduler out of reach, or a refusal for a job-count limit (OverLimit, raised),
    puts it back in its place."""
    if not db.backlog.claim(run.id, submitter()):
        return None
    claimed = db.get_existing(run.id, events=False)
    scheduler = scheduler_for(claimed.scheduler, claimed.commands, host_for(claimed.remote))
    submission, keep = _handed(db, claimed, plan)

    def undo(exc: MmmError) -> None:
        # Never sent, or refused for a limit (another submitter's job took the room first): back
        # to its place; refused for anything else, it fails with the scheduler's words.
        if isinstance(exc, Unreachable | OverLimit):
            db.backlog.requeue(run.id, f"back in the backlog: {one_line(str(exc))}")
        else:
            db.backlog.refused(run.id, f"refused from the backlog: {one_line(str(exc))}")

    try:
        native_id = hand_over(scheduler, submission, db, run.id, undo, keep)
    except OverLimit:
        raise  # its queue waits for now (usecases/backlogs.py says so)
    except SubmissionRefused:
        return None
    keep(native_id)
    return db.accepted(run.id, native_id, "submitted from the backlog") or db.get_existing(run.id)


def _handed(
    db: JobDB, claimed: JobRecord, plan: Plan, **extra: Any
) -> tuple[Submission, Callable[[str], None]]:
    """What a claimed waiting run is handed over as, and the keeper of its record's copy."""
    submission = submission_of(
        plan,
        claimed.script_path,
        claimed.job_dir,
        claimed.tag,
        claimed.submitted_at,
        stop_signal=plan.launch.stop_signal,
        **extra,
    )
    directory = jobs_root_for(db.path) / posixpath.basename(claimed.job_dir)
    return submission, copy_keeper(directory, record_copy(claimed))


def start_here(
    db: JobDB, run: JobRecord, plan: Plan, script: str, group_id: int
) -> JobRecord | None:
    """A run waiting in a held allocation (usecases/allocations.py) claimed into group
    `group_id`'s and started on this computer under the local executor, held by this process:
    `plan` is the run placed on its slot, `script` its script there. None where another holder
    took it first; a refusal fails it (raised)."""
    if not db.backlog.claim(
        run.id,
        submitter(),
        "started in the allocation",
        scheduler="local",
        commands="{}",
        script=script,
        group_id=group_id,
    ):
        return None
    claimed = db.get_existing(run.id, events=False)
    host = host_for("")
    host.write_file(claimed.script_path, script, 0o700)
    submission, keep = _handed(db, claimed, plan, held_by=os.getpid())

    def undo(exc: MmmError) -> None:
        db.backlog.refused(run.id, f"not started in the allocation: {one_line(str(exc))}")

    native_id = hand_over(scheduler_for("local", {}, host), submission, db, run.id, undo, keep)
    keep(native_id)
    return db.accepted(run.id, native_id, "started") or db.get_existing(run.id)


def cancel(db: JobDB, record: JobRecord) -> None:
    """Ask the job's scheduler (here, or over SSH) to cancel it, and record that it was asked; a
    run still waiting in the backlog is taken out of it, never submitted."""
    if record.state is JobState.WAITING and db.backlog.withdraw(
        record.id, "taken out of the backlog by cancel: never submitted"
    ):
        return
    scheduler = scheduler_for(record.scheduler, record.commands, host_for(record.remote))
    scheduler.cancel(JobRef(record.native_id, Path(record.job_dir)))
    db.cancel_sent(record.id)
