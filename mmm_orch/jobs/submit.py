"""request -> plan -> script -> scheduler -> record. Nothing is recorded unless the scheduler
accepted the job, and nothing is left on disk when it did not."""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

from mmm_orch.jobs.db import JobDB, JobRecord
from mmm_orch.plan import Plan
from mmm_orch.render import render
from mmm_orch.schedulers.base import JobRef, Submission, scheduler_for


def git_commit(directory: str) -> str | None:
    """HEAD of the git work tree holding `directory`, with '-dirty' for uncommitted changes."""
    try:
        head = subprocess.run(["git", "-C", directory, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", directory, "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _make_dir(path: Path) -> list[Path]:
    """mkdir -p with mode 0700; returns the directories it created, outermost first."""
    created = []
    for parent in reversed([path, *path.parents]):
        if not parent.exists():
            created.append(parent)
    path.mkdir(parents=True, mode=0o700)
    for directory in created:
        directory.chmod(0o700)
    return created


def _remove(created: list[Path]) -> None:
    """Undo _make_dir: the job directory with its files, then the parents if left empty."""
    if created:
        shutil.rmtree(created[-1], ignore_errors=True)
        for directory in reversed(created[:-1]):
            try:
                directory.rmdir()
            except OSError:
                break  # not empty: another process uses it


def submit(plan: Plan, db_path: Path, template: str | None = None) -> JobRecord:
    """Render `plan` into its job directory, submit it, then record it. The database is opened
    only once the scheduler accepted the job, so a rejected job leaves no file behind."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job_dir = JobDB.jobs_root_for(db_path) / f"{stamp}-{plan.machine}-{plan.workload}-{secrets.token_hex(3)}"
    created = _make_dir(job_dir)
    try:
        log_path = job_dir / "job.log"
        plan = plan.with_log_path(str(log_path))
        script = render(plan, template)
        script_path = job_dir / "job.sh"
        script_path.write_text(script, encoding="utf-8")
        script_path.chmod(0o700)
        scheduler = scheduler_for(plan.scheduler, plan.scheduler_commands)
        native_id = scheduler.submit(Submission(script=script_path, workdir=plan.workdir,
                                                job_dir=job_dir, log_path=log_path,
                                                walltime=plan.walltime))
    except BaseException:
        _remove(created)
        raise
    try:
        db = JobDB(db_path)
        job_id = db.insert(
            machine=plan.machine, host=socket.gethostname(), scheduler=plan.scheduler,
            commands=plan.scheduler_commands, workload=plan.workload, name=plan.name,
            nodes=plan.nodes, ranks=plan.ranks, native_id=native_id, job_dir=str(job_dir),
            script_path=str(script_path), script=script, plan=plan.to_dict(),
            submit_dir=plan.workdir, git_commit=git_commit(plan.workdir),
            log_path=str(log_path), submitted_at=time.time())
    except BaseException:
        # The scheduler has the job but we could not record it: take it back rather than leave
        # a job nobody tracks.
        try:
            scheduler.cancel(JobRef(native_id=native_id, job_dir=job_dir))
        finally:
            _remove(created)
        raise
    record = db.get(job_id)
    assert record is not None
    return record
