"""request -> plan -> script -> scheduler -> record. Nothing is recorded unless the scheduler
accepted the job, and nothing is left on disk when it did not."""

from __future__ import annotations

import posixpath
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

from mmm_orch.errors import MmmError
from mmm_orch.hosts import host_for
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


def target_for(plan: Plan, host: str | None) -> str:
    """The SSH target to submit through, '' for here: --host when given; else here when the
    machine's submit command is on PATH (we are on its login node); else its first login host."""
    if host is not None:
        if plan.scheduler == "local":
            raise MmmError(f"--host {host!r}: machine {plan.machine} runs jobs on this computer; "
                           "--host is for machines with a batch scheduler")
        return host
    submit_command = scheduler_for(plan.scheduler, plan.scheduler_commands).submit_command
    if not submit_command or shutil.which(submit_command):
        return ""
    if plan.login_hosts:
        return plan.login_hosts[0]
    raise MmmError(f"machine {plan.machine}: {submit_command} is not on PATH here and the profile "
                   "lists no login_hosts; run on its login node or give --host HOST")


def submit(plan: Plan, db_path: Path, template: str | None = None, remote: str = "") -> JobRecord:
    """Render `plan` into its job directory (here, or on the login node through `remote`), submit
    it, then record it. The database is opened only once the scheduler accepted the job, so a
    rejected job leaves no file behind, here or there."""
    render(plan.placed("/job-dir/job.log"), template)  # template errors surface before any side effect
    host = host_for(remote)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    leaf = f"{stamp}-{plan.machine}-{plan.workload}-{secrets.token_hex(3)}"
    if remote:
        root = posixpath.join(host.home(), plan.remote_jobs_dir)
        job_dir = posixpath.join(root, leaf)
    else:
        job_dir = str(JobDB.jobs_root_for(db_path) / leaf)
    created = host.make_private_dir(job_dir)
    try:
        log_path = posixpath.join(job_dir, "job.log")
        # A remote job runs in its job directory unless --workdir named one there.
        plan = plan.placed(log_path, job_dir if remote and not plan.workdir_given else None)
        script = render(plan, template)
        script_path = posixpath.join(job_dir, "job.sh")
        host.write_file(script_path, script, 0o700)
        scheduler = scheduler_for(plan.scheduler, plan.scheduler_commands, host)
        native_id = scheduler.submit(Submission(script=Path(script_path), workdir=plan.workdir,
                                                job_dir=Path(job_dir), log_path=Path(log_path),
                                                walltime=plan.walltime))
    except BaseException:
        host.remove_tree(created)
        raise
    try:
        db = JobDB(db_path)
        job_id = db.insert(
            machine=plan.machine, host=remote or socket.gethostname(), remote=remote,
            scheduler=plan.scheduler, commands=plan.scheduler_commands, workload=plan.workload,
            name=plan.name, nodes=plan.nodes, ranks=plan.ranks, native_id=native_id,
            job_dir=job_dir, script_path=script_path, script=script, plan=plan.to_dict(),
            submit_dir=plan.workdir, git_commit=None if remote else git_commit(plan.workdir),
            log_path=log_path, submitted_at=time.time())
    except BaseException:
        # The scheduler has the job but we could not record it: take it back rather than leave
        # a job nobody tracks.
        try:
            scheduler.cancel(JobRef(native_id=native_id, job_dir=Path(job_dir)))
        finally:
            host.remove_tree(created)
        raise
    record = db.get(job_id)
    assert record is not None
    return record
